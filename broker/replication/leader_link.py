"""One connection to a leader, shared by every partition this broker follows from it.

Each follower partition keeps its own fetcher task (replica_fetcher.py), but a task per
partition with its own connection cost each followed partition a descriptor and a
parked fetch on its leader (300 partitions used 725 descriptors; under ``ulimit -n
1024`` brokers died of EMFILE). As Kafka's fetcher thread puts every partition of a
source broker into one Fetch, a ``LeaderLink`` gathers what its member tasks ask
(OffsetsForLeaderEpoch before a first fetch, then Fetch), sends one request per API
with all of their partitions, and hands each task its partition's part of the answer.

A round goes out once every member has asked, except members that said they are
pausing (a backoff, an injected delay): a member wakes, handles its part (synchronous
partition work) and asks again within a scheduler pass, so waiting for all of them
costs nothing and keeps the round whole. A member that asks while a round is out
joins the next one, as a partition added to Kafka's fetch session does. Two kinds of
member call back a Fetch round that is out instead: one asking for the first time (a
partition just followed: a new topic, a new leader), and one retrying after the leader
refused its partition for not having caught up with the metadata (``rejoin``). The
round out does not carry either and may be parked at the leader for
``replica.fetch.wait.max.ms``: a new topic's first acks=all write waited it out
(200-500 ms after CreateTopics, against ~10 ms before links were shared; the refused
retry, in about one topic creation in ten). Called back, the round's asks go out again
at once, with the member in them.

A partition the leader leaves out of a Fetch answer (nothing new, HW unchanged:
FetchRequest.known_hw) is not woken: its ask rides the next round as it is, so an idle
partition costs its follower nothing per round. Nor is it named again: Fetch rounds go in
a session (fetch_sessions.py), each naming only the asks that changed since the last.
"""

from __future__ import annotations

from typing import Protocol

import trio

from minibroker.broker.replication.fetch_sessions import FollowerSession, by_topic
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import (
    FetchSessionIdNotFound,
    InvalidFetchSessionEpoch,
    KafkaError,
    UnsupportedVersion,
)

Key = tuple[str, int]

# Longest a gathered round waits for a member that neither asked nor paused (a bug, a
# task not scheduled yet): a bound, not a pacing; members ask within a scheduler pass.
_GATHER_BOUND_S = 0.05
FETCH_SESSION_VERSION = 2  # the Fetch version with sessions (protocol/api.py)
# A Fetch refused for its session, not its partitions: they go again in a full Fetch; so
# do they when the leader does not know the version.
_SESSION_REFUSED = (FetchSessionIdNotFound, InvalidFetchSessionEpoch, UnsupportedVersion)


class Requester(Protocol):
    async def request(
        self, api_key: int, body: dict, *, timeout: float, version: int = 0
    ) -> dict: ...
    async def close(self) -> None: ...


class _Ask:
    __slots__ = ("answer", "done", "error", "member", "part")

    def __init__(self, member: object, part: dict) -> None:
        self.member = member
        self.part = part
        self.done = trio.Event()
        self.answer: dict | None = None
        self.error: BaseException | None = None


class LeaderLink:
    """The partitions followed from one leader, over one connection (see module doc)."""

    def __init__(
        self,
        leader_id: int,
        conn: Requester,
        request_fields: dict[int, dict],
        timeouts: dict[int, float],
    ) -> None:
        self.leader_id = leader_id
        self.conn = conn
        # Per API (in the order rounds go out), the request's fields besides its topics
        # (replica_id, max_wait_ms, ...), and how long its answer may take.
        self.request_fields = request_fields
        self.timeouts = timeouts
        # Members are tokens (a fetcher task's object): a partition's old and new fetcher
        # (a new leader epoch, same leader) are two members for a moment.
        self.members: set[object] = set()
        self.paused: set[object] = set()
        self.asks: dict[int, dict[Key, _Ask]] = {api: {} for api in request_fields}
        self.cancel_scope = trio.CancelScope()
        self._arrived = trio.lowlevel.ParkingLot()
        self._served: set[object] = set()  # members some Fetch round has carried
        self._fetch_out: trio.CancelScope | None = None  # the Fetch round out, if any
        # Fetch rounds name only what changed (fetch_sessions.py), unless the leader does
        # not know Fetch version 2 (a broker of an older build): then every round is full.
        self.session: FollowerSession | None = FollowerSession()

    # --- members ----------------------------------------------------------------------------

    def join(self, member: object) -> None:
        self.members.add(member)

    def leave(self, member: object) -> None:
        self.members.discard(member)
        self.paused.discard(member)
        self._served.discard(member)
        for asks in self.asks.values():
            for key in [k for k, ask in asks.items() if ask.member is member]:
                del asks[key]
        self._arrived.unpark_all()

    def rejoin(self, member: object) -> None:
        """Treat ``member``'s next ask as a newcomer's: it calls back a Fetch round that is
        out. For a member retrying shortly after its partition was refused (the leader had
        not applied the metadata yet): the round that went out while it paused does not
        carry it and may park for ``replica.fetch.wait.max.ms``, and its partition's
        acks=all writes would wait that out."""
        self._served.discard(member)

    async def ask(self, member: object, api_key: int, key: Key, part: dict) -> dict:
        """Partition ``key``'s ``part`` of the next ``api_key`` request to the leader:
        returns its part of the answer, or raises the request's failure."""
        ask = _Ask(member, part)
        asks = self.asks[api_key]
        asks[key] = ask
        if member not in self._served and self._fetch_out is not None:
            self._fetch_out.cancel()  # a newcomer: see the module docstring
        self._arrived.unpark_all()
        try:
            await ask.done.wait()
        finally:
            if asks.get(key) is ask:  # cancelled before its round went out
                del asks[key]
        if ask.error is not None:
            raise ask.error
        return ask.answer

    async def pause(self, member: object, seconds: float) -> None:
        """Sleep without holding back the other members' rounds."""
        self.paused.add(member)
        self._arrived.unpark_all()
        try:
            await trio.sleep(seconds)
        finally:
            self.paused.discard(member)

    # --- the rounds -------------------------------------------------------------------------

    async def run(self) -> None:
        """Send rounds until cancelled (the last member left); then close the connection."""
        with self.cancel_scope:
            try:
                while True:
                    await self._gather()
                    for api_key, asks in self.asks.items():
                        if asks:
                            self.asks[api_key] = {}
                            await self._round(api_key, asks)
            finally:
                with trio.CancelScope(shield=True):
                    await self.conn.close()

    def _waiting_for(self) -> int:
        asked = sum(len(asks) for asks in self.asks.values())
        return len(self.members) - len(self.paused & self.members) - asked

    async def _gather(self) -> None:
        while not any(self.asks.values()):
            await self._arrived.park()
        if self._waiting_for() > 0:  # a deadline only when someone is awaited: it is a
            with trio.move_on_after(_GATHER_BOUND_S):  # cancel scope each round otherwise
                while self._waiting_for() > 0:
                    await self._arrived.park()

    async def _round(self, api_key: int, asks: dict[Key, _Ask]) -> None:
        session = self.session if api_key == ApiKey.FETCH else None
        asked = {key: ask.part for key, ask in asks.items()}
        if session is not None:
            body = {**self.request_fields[api_key], **session.next_fetch(asked)}
            version = FETCH_SESSION_VERSION
        else:
            body = {**self.request_fields[api_key], "topics": by_topic(asked)}
            version = 0
        with trio.CancelScope() as scope:
            if api_key == ApiKey.FETCH:
                # Carried by a Fetch: from now on this member's asks ride the next round
                # (an OffsetsForLeaderEpoch round does not count: the member's first
                # Fetch, asked just after it, would wait out the Fetch that went out
                # without it).
                self._served.update(ask.member for ask in asks.values())
                self._fetch_out = scope
            try:
                answer = await self.conn.request(
                    api_key, body, timeout=self.timeouts[api_key], version=version
                )
            except KafkaError as exc:
                if session is not None:
                    session.reset()
                    if isinstance(exc, UnsupportedVersion):
                        self.session = None  # an older leader: full Fetches from now on
                    if isinstance(exc, _SESSION_REFUSED):
                        # Nothing wrong with the partitions: they ride a full Fetch, now.
                        self._requeue(api_key, asks)
                        return
                for ask in asks.values():
                    ask.error = exc
                    ask.done.set()
                return
            finally:
                self._fetch_out = None
        if scope.cancelled_caught:
            # Called back for a newcomer: these asks ride the next round, which goes out
            # at once (they are all asked already). Whether the leader saw the abandoned
            # Fetch is unknown, so its session starts over.
            if session is not None:
                session.reset()
            self._requeue(api_key, asks)
            return
        if session is not None:
            session.answered(answer)
        parts = {
            (t["name"], part["partition"]): part
            for t in answer["topics"]
            for part in t["partitions"]
        }
        pending = self.asks[api_key]
        for key, ask in asks.items():
            ask.answer = parts.get(key)
            if ask.answer is None:
                if ask.part.get("high_watermark", -1) >= 0:
                    # Unchanged at the leader (a follower Fetch that gave its HW: see
                    # FetchRequest.known_hw): the member sleeps on, its ask unchanged
                    # rides the next round (unless the member left meanwhile).
                    if ask.member in self.members:
                        pending.setdefault(key, ask)
                    continue
                ask.error = KafkaError(
                    f"leader {self.leader_id} left {key[0]}-{key[1]} out of its "
                    f"{ApiKey(api_key).name} answer"
                )
            ask.done.set()

    def _requeue(self, api_key: int, asks: dict[Key, _Ask]) -> None:
        pending = self.asks[api_key]
        for key, ask in asks.items():
            pending.setdefault(key, ask)
