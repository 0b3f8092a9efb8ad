"""Incremental fetch sessions between brokers (KIP-227's request side).

A follower's Fetch used to name every partition it follows from this leader, in every
round: with 120 idle 3-partition topics the leader decoded, validated and rebuilt 240
partitions' fields a round for the two that moved (confluent-kafka at 0.78x the rate
without them). In a session the leader keeps each partition's fields as last sent, and a
Fetch (version 2) names only the partitions whose fields changed, plus those to forget.

As Kafka's FetchSession, with what a follower needs only:

- ``session_epoch`` -1 (FINAL_EPOCH): no session, the Fetch names everything.
- 0 (INITIAL_EPOCH): a full Fetch; it opens a new session, replacing the follower's
  previous one, and the answer gives its id. A consumer's gets id 0: no session (Kafka's
  answer when its cache has no room; the native listener keeps sessions for followers).
- > 0: that session's next Fetch. An unknown id is FETCH_SESSION_ID_NOT_FOUND, another
  epoch INVALID_FETCH_SESSION_EPOCH: the follower starts over with a full Fetch.

On the leader (``ReplicaFetchSessions``), one session per follower broker (each follows
this leader over one LeaderLink), so the sessions are bounded by the cluster's size and
need no eviction. On the follower, each LeaderLink keeps a ``FollowerSession`` (Kafka's
FetchSessionHandler): what the leader's session holds, and the next epoch. A failed or
abandoned Fetch, or a session error, starts it over with a full Fetch. The answer side needs no
session: a follower's Fetch carries its HW, and a partition with nothing new is left out
of the answer (FetchRequest.known_hw). Only the broker's trio thread touches sessions.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

from minibroker.protocol.errors import FetchSessionIdNotFound, InvalidFetchSessionEpoch

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_EPOCH = (1 << 31) - 1

Key = tuple[str, int]


def next_epoch(epoch: int) -> int:
    """Kafka's FetchMetadata.nextEpoch: 0 -> 1 -> ... -> MAX -> 1; FINAL stays FINAL."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == MAX_EPOCH else epoch + 1


class _Session:
    __slots__ = ("epoch", "id", "parts")

    def __init__(self, session_id: int, parts: dict[Key, dict]) -> None:
        self.id = session_id
        self.epoch = next_epoch(INITIAL_EPOCH)  # what the follower's next Fetch must carry
        self.parts = parts  # each partition's fields as last sent, in fetch order


class ReplicaFetchSessions:
    """The followers' sessions on this leader, by follower broker id."""

    __slots__ = ("_follows", "_ids", "_sessions", "full", "incremental")

    def __init__(self, follows: Callable[[int], bool]) -> None:
        # Whether a broker follows a partition led here: only such a broker gets a session,
        # so a client claiming made-up replica ids cannot make the leader hold sessions.
        self._follows = follows
        self._sessions: dict[int, _Session] = {}
        # Ids are not reused while the broker runs: a Fetch of a replaced session is
        # told so, never taken for the new one's. Random start: nor across restarts.
        self._ids = itertools.count(int.from_bytes(os.urandom(3), "big") + 1)
        self.full = 0  # Fetches that opened a session
        self.incremental = 0  # and that went on in one: how much the sessions are used

    def resolve(self, body: dict) -> int:
        """Apply a version-2 Fetch ``body`` to its session: afterwards ``body["topics"]``
        names every partition the Fetch reads. Returns the session id its answer gives
        (0: none); raises FetchSessionIdNotFound / InvalidFetchSessionEpoch."""
        epoch = body["session_epoch"]
        replica_id = body["replica_id"]
        if epoch == FINAL_EPOCH:
            return INVALID_SESSION_ID
        if epoch == INITIAL_EPOCH:
            if replica_id < 0 or not self._follows(replica_id):
                # Sessions are for followers (see module doc); a follower asking before this
                # broker leads its partitions gets one with a later full Fetch.
                return INVALID_SESSION_ID
            parts = {
                (t["name"], p["partition"]): p for t in body["topics"] for p in t["partitions"]
            }
            session = self._sessions[replica_id] = _Session(next(self._ids), parts)
            self.full += 1
            return session.id
        session = self._sessions.get(replica_id) if replica_id >= 0 else None
        if session is None or session.id != body["session_id"]:
            raise FetchSessionIdNotFound(
                f"no fetch session {body['session_id']} for broker {replica_id}: "
                "start over with a full fetch"
            )
        if session.epoch != epoch:
            raise InvalidFetchSessionEpoch(
                f"fetch session {session.id} expects epoch {session.epoch}, got {epoch}"
            )
        parts = session.parts
        for t in body["topics"]:
            name = t["name"]
            for p in t["partitions"]:
                parts[name, p["partition"]] = p
        for t in body["forgotten_topics"]:
            name = t["name"]
            for index in t["partitions"]:
                parts.pop((name, index), None)
        session.epoch = next_epoch(epoch)
        body["topics"] = by_topic(parts)
        self.incremental += 1
        return session.id

    def stats(self) -> dict[str, int]:
        return {
            "sessions": len(self._sessions),
            "partitions_cached": sum(len(s.parts) for s in self._sessions.values()),
            "full_fetches": self.full,
            "incremental_fetches": self.incremental,
        }


class FollowerSession:
    """The follower's side of one leader's session (Kafka's FetchSessionHandler)."""

    __slots__ = ("epoch", "id", "sent")

    def __init__(self) -> None:
        self.id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self.sent: dict[Key, dict] = {}  # what the leader's session holds, as we sent it

    def reset(self) -> None:
        """Start over: the next Fetch is a full one (after any failure: the leader may or
        may not have applied the last one)."""
        self.id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self.sent = {}

    def next_fetch(self, parts: dict[Key, dict]) -> dict:
        """The session fields and topics of a Fetch of ``parts`` (a dict the caller made
        for this Fetch and does not change: it is kept as sent): all of them in a full
        Fetch; else those whose fields changed, and the partitions to forget."""
        sent = self.sent
        self.sent = parts
        if self.epoch == INITIAL_EPOCH:
            return {
                "session_id": INVALID_SESSION_ID,
                "session_epoch": INITIAL_EPOCH,
                "topics": by_topic(parts),
            }
        # Fields are compared, not objects: an idle partition's fetcher asks the same.
        changed = {key: part for key, part in parts.items() if sent.get(key) != part}
        forgotten: dict[str, list[int]] = {}
        for key in sent:
            if key not in parts:
                forgotten.setdefault(key[0], []).append(key[1])
        return {
            "session_id": self.id,
            "session_epoch": self.epoch,
            "topics": by_topic(changed),
            "forgotten_topics": [{"name": n, "partitions": ps} for n, ps in forgotten.items()],
        }

    def answered(self, answer: dict) -> None:
        """The Fetch went through: a full one opened the session its answer names (0:
        the leader keeps none for us, and every Fetch stays full)."""
        if self.epoch == INITIAL_EPOCH:
            self.id = answer.get("session_id", INVALID_SESSION_ID)
            if self.id != INVALID_SESSION_ID:
                self.epoch = next_epoch(INITIAL_EPOCH)
        else:
            self.epoch = next_epoch(self.epoch)


def by_topic(parts: dict[Key, dict], topic_field: str = "name") -> list[dict]:
    """Partitions' fields as a Fetch's ``topics``, in order (a topic appears again where
    its partitions are not adjacent, as a Fetch may name them). ``topic_field``: the
    topic's key ("topic" in Kafka's Fetch)."""
    topics: list[dict] = []
    last = None
    for (name, _), part in parts.items():
        if name != last:
            topics.append({topic_field: name, "partitions": []})
            last = name
        topics[-1]["partitions"].append(part)
    return topics
