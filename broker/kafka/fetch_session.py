"""Incremental fetch sessions (KIP-227) for stock consumers on the Kafka listener.

Kafka's FetchSession.scala, for consumers: a Fetch v7+ names a session id and an epoch.

- epoch FINAL_EPOCH (-1): no session (sessionless: librdkafka and aiokafka always ask so);
  a session the request names is closed.
- epoch INITIAL_EPOCH (0): a full fetch; a session it names is closed, and the answer
  creates a new one when the cache has (or can make) room: its id goes back in
  ``session_id`` (0: no session) and the client's next epoch is 1.
- epoch > 0: an incremental fetch of that session. It names only partitions added or
  changed since (their fetch offset moved, most often) and ``forgotten_topics_data``
  drops some; the session supplies the rest. The answer leaves out every partition with
  no records, no error and an unchanged high watermark and log start offset. An unknown
  id is FETCH_SESSION_ID_NOT_FOUND, an epoch other than the session's is
  INVALID_FETCH_SESSION_EPOCH (both with no partitions and session id 0: the client
  starts over with a full fetch).

The cache holds ``max.incremental.fetch.session.cache.slots`` sessions (Kafka's default
1000). Full, a new session may evict, as in Kafka's FetchSessionCacheShard.tryEvict: first
the least recently used session if it has been idle longer than the eviction time (Kafka's
MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS, 120 s); else the smallest session older than
that time if it has fewer partitions than the new one. Simplified from Kafka: one shard,
no privileged (follower) sessions, since followers fetch on the native listener (their
sessions: broker/replication/fetch_sessions.py); and the
eviction candidates are found by a scan rather than Kafka's sorted trees, which only runs
when the cache is full and a new session asks for a slot.

Sessions live on the broker's trio thread like every handler, so they need no locks.
"""

from __future__ import annotations

import random

from minibroker.broker.common.clock import Clock
from minibroker.broker.replication.fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    MAX_EPOCH,
    Key,
    by_topic,
    next_epoch,
)
from minibroker.protocol.errors import ErrorCode

EVICTION_MS = 120_000  # Kafka's MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS


class CachedPartition:
    """A partition's last request parameters and last answered watermarks."""

    __slots__ = ("fetch", "high_watermark", "last_stable_offset", "log_start_offset")

    def __init__(self, fetch: dict) -> None:
        self.fetch = fetch  # the request's partition entry, as the client last sent it
        self.high_watermark = -1
        self.last_stable_offset = -1
        self.log_start_offset = -1

    def must_respond(self, answer: dict) -> bool:
        """Kafka's CachedPartition.maybeUpdateResponseData, updating: whether the answer
        carries news (records, an error, a moved watermark, LSO or log start)."""
        respond = bool(answer["records"])
        if answer["high_watermark"] != self.high_watermark:
            respond = True
            self.high_watermark = answer["high_watermark"]
        lso = answer.get("last_stable_offset", -1)
        if lso != self.last_stable_offset:
            respond = True
            self.last_stable_offset = lso
        if answer["log_start_offset"] != self.log_start_offset:
            respond = True
            self.log_start_offset = answer["log_start_offset"]
        if answer["error_code"]:
            # Sent again once the error clears: the watermark no longer matches.
            self.high_watermark = -1
            respond = True
        return respond


class FetchSession:
    __slots__ = ("created_ms", "epoch", "id", "last_used_ms", "partitions")

    def __init__(self, session_id: int, partitions: dict[Key, CachedPartition], now: int) -> None:
        self.id = session_id
        # Insertion order is fetch order: a partition that returned records moves to the
        # end, so under max_bytes the others get their turn (as Kafka does).
        self.partitions = partitions
        self.created_ms = now
        self.last_used_ms = now
        self.epoch = next_epoch(INITIAL_EPOCH)


class FetchSessionCache:
    """The broker's sessions, bounded by ``max.incremental.fetch.session.cache.slots``."""

    __slots__ = ("clock", "created", "eviction_ms", "evictions", "max_entries", "sessions")

    def __init__(self, max_entries: int, clock: Clock, eviction_ms: int = EVICTION_MS) -> None:
        self.max_entries = max_entries
        self.clock = clock
        self.eviction_ms = eviction_ms
        self.sessions: dict[int, FetchSession] = {}
        self.created = 0
        self.evictions = 0

    def stats(self) -> dict[str, int]:
        """Kafka's NumIncrementalFetchSessions, NumIncrementalFetchPartitionsCached and the
        counts behind IncrementalFetchSessionEvictionsPerSec."""
        return {
            "sessions": len(self.sessions),
            "partitions_cached": sum(len(s.partitions) for s in self.sessions.values()),
            "created": self.created,
            "evictions": self.evictions,
        }

    def new_context(self, request: dict) -> FetchContext:
        """Kafka's FetchManager.newContext: what this Fetch reads and how it is answered."""
        session_id = request["session_id"]
        epoch = request["session_epoch"]
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            # A full fetch closes any session it names.
            if session_id != INVALID_SESSION_ID:
                self.sessions.pop(session_id, None)
            return FetchContext(self, request["topics"], create=epoch == INITIAL_EPOCH)
        session = self.sessions.get(session_id)
        if session is None:
            return FetchContext(self, [], error=ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != epoch:
            return FetchContext(self, [], error=ErrorCode.INVALID_FETCH_SESSION_EPOCH)
        partitions = session.partitions
        for t in request["topics"]:
            topic = t["topic"]
            for p in t["partitions"]:
                cached = partitions.get((topic, p["partition"]))
                if cached is None:
                    partitions[topic, p["partition"]] = CachedPartition(p)
                else:
                    cached.fetch = p
        for t in request["forgotten_topics_data"]:
            for index in t["partitions"]:
                partitions.pop((t["topic"], index), None)
        if not partitions:
            # Nothing left to fetch: the session ends, the answer is sessionless.
            del self.sessions[session.id]
            return FetchContext(self, [])
        session.last_used_ms = self.clock.now_ms()
        session.epoch = next_epoch(epoch)
        return FetchContext(
            self,
            by_topic({key: p.fetch for key, p in partitions.items()}, "topic"),
            session=session,
            epoch=session.epoch,
        )

    def _create(self, partitions: dict[Key, CachedPartition]) -> int:
        """A new session's id, or INVALID_SESSION_ID when there is no room for it."""
        now = self.clock.now_ms()
        if len(self.sessions) >= self.max_entries and not self._evict(len(partitions), now):
            return INVALID_SESSION_ID
        session_id = INVALID_SESSION_ID
        while session_id == INVALID_SESSION_ID or session_id in self.sessions:
            session_id = random.randint(1, MAX_EPOCH)  # positive, unique on this broker
        self.sessions[session_id] = FetchSession(session_id, partitions, now)
        self.created += 1
        return session_id

    def _evict(self, size: int, now: int) -> bool:
        """Kafka's tryEvict for an unprivileged session of ``size`` partitions."""
        if not self.sessions:
            return False
        stale = min(self.sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now - stale.last_used_ms > self.eviction_ms:
            victim = stale
        else:
            settled = [s for s in self.sessions.values() if now - s.created_ms > self.eviction_ms]
            if not settled:
                return False
            victim = min(settled, key=lambda s: (len(s.partitions), s.id))
            if len(victim.partitions) >= size:
                return False  # only a session with more partitions is worth more
        del self.sessions[victim.id]
        self.evictions += 1
        return True


class FetchContext:
    """One Fetch's view of its session: ``topics`` to read, ``answer`` to shape the reply."""

    __slots__ = ("_cache", "_create", "_epoch", "_session", "error", "topics")

    def __init__(
        self,
        cache: FetchSessionCache,
        topics: list[dict],
        *,
        create: bool = False,
        session: FetchSession | None = None,
        epoch: int = 0,
        error: ErrorCode = ErrorCode.NONE,
    ) -> None:
        self._cache = cache
        self.topics = topics
        self._create = create
        self._session = session
        self._epoch = epoch
        self.error = error

    def answer(self, response: dict) -> dict:
        """The Fetch response (``responses`` in Kafka's shape, with every fetched partition)
        with this context's error code and session id, and without the partitions an
        incremental fetch does not repeat."""
        if self.error:
            return {
                "error_code": int(self.error),
                "session_id": INVALID_SESSION_ID,
                "responses": [],
            }
        session = self._session
        if session is not None:
            return self._incremental(session, response)
        session_id = INVALID_SESSION_ID
        if self._create:
            asked = {(t["topic"], p["partition"]): p for t in self.topics for p in t["partitions"]}
            cached = {}
            for t in response["responses"]:
                for p in t["partitions"]:
                    key = (t["topic"], p["partition_index"])
                    entry = cached[key] = CachedPartition(asked[key])
                    entry.must_respond(p)  # remembers the watermarks just answered
            if cached:
                session_id = self._cache._create(cached)
        response["session_id"] = session_id
        return response

    def _incremental(self, session: FetchSession, response: dict) -> dict:
        if session.epoch != self._epoch or self._cache.sessions.get(session.id) is not session:
            # Another request of this session came in while this one was parked (a client
            # retry): its answer is the valid one (Kafka: a possible duplicate request).
            return {
                "error_code": int(ErrorCode.INVALID_FETCH_SESSION_EPOCH),
                "session_id": session.id,
                "responses": [],
            }
        partitions = session.partitions
        kept = []
        for t in response["responses"]:
            topic = t["topic"]
            news = []
            for p in t["partitions"]:
                key = (topic, p["partition_index"])
                cached = partitions.get(key)
                if cached is not None and cached.must_respond(p):
                    news.append(p)
                    if p["records"]:
                        partitions[key] = partitions.pop(key)  # to the back of the line
            if news:
                kept.append({"topic": topic, "partitions": news})
        response["responses"] = kept
        response["session_id"] = session.id
        return response


__all__ = [
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "INVALID_SESSION_ID",
    "FetchContext",
    "FetchSessionCache",
    "next_epoch",
]
