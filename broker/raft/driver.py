"""Drives one voter's sans-IO Raft core (broker/raft) with real disk, network and time.

- Effects are applied strictly in order; each durable one (quorum-state, log append or
  truncation, snapshot) is written and fsynced by QuorumStore before any later ``Send``
  leaves, which is the core's contract (effects.py).
- Outbound: a core request to voter N goes over an authenticated PeerConnection (the
  cluster-secret handshake, so fault isolation keyed by the peer's principal sees it).
  Two lanes per peer, each one request at a time: log fetches (long polls) and everything
  else, so a parked Fetch never holds a Vote back. The answer goes back into the core.
- Inbound (RequestHandler, members only): the request goes into the core; the core's
  ``Send`` of the matching response type to that voter answers the call. A Fetch the
  leader parks (nothing new yet) stays a PendingResponse until the core emits its answer:
  the core's own parked set (LeaderState.parked, Kafka's ThresholdPurgatory) is the
  purgatory, with its deadline in ``next_deadline_ms``, so no extra purgatory is needed.
- A timer task calls ``poll()`` at ``next_deadline_ms()``, woken early whenever anything
  else may have moved the deadline.
- Committed entries (``HighWatermarkUpdated``) go, in order, to the state machine, once
  each: ``applied`` only moves forward, and a restart replays from the snapshot.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from minibroker.broker.common.clock import Clock
from minibroker.broker.network.cluster_auth import ClusterCredentials
from minibroker.broker.network.peer import PeerConnection, log_peer_failure
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.raft import (
    AppendLog,
    Entry,
    HighWatermarkUpdated,
    KafkaRaftClient,
    LeaderChanged,
    PersistQuorumState,
    QuorumConfig,
    Send,
    StoreSnapshot,
    TruncateLog,
)
from minibroker.broker.raft.messages import FetchRequest, FetchSnapshotRequest, Message
from minibroker.broker.raft.store import QuorumStore
from minibroker.broker.raft.wire import (
    REQUEST_KEYS,
    REQUEST_VERSIONS,
    RESPONSE_TYPES,
    decode_request,
    decode_response,
    encode,
)
from minibroker.protocol.errors import ErrorCode, KafkaError

METADATA_DIR = "__cluster_metadata"
_LANE_DEPTH = 64  # a peer this far behind is down: drop, the core resends on its timers


class StateMachine(Protocol):
    """What the quorum feeds: committed entries in order, and snapshots of the result."""

    def apply(self, entry: Entry) -> None: ...
    def snapshot(self) -> bytes: ...
    def restore(self, data: bytes) -> None: ...


@dataclass(slots=True)
class _Waiting:
    """An inbound quorum request waiting for the core's answer."""

    pending: PendingResponse
    correlation_id: int | None


@dataclass(slots=True)
class _Peer:
    conns: dict[str, PeerConnection]
    lanes: dict[str, trio.MemorySendChannel] = field(default_factory=dict)


class QuorumDriver:
    def __init__(
        self,
        node_id: int,
        voters: dict[int, tuple[str, int]],
        data_dir: Path,
        clock: Clock,
        logger: Any,
        *,
        config: QuorumConfig | None = None,
        credentials: ClusterCredentials | None = None,
        state_machine: StateMachine | None = None,
        snapshot_every: int = 1000,
    ) -> None:
        self.node_id = node_id
        self.voters = voters
        self.clock = clock
        self.log = logger.bind(component="quorum")
        self.config = config or QuorumConfig()
        self.credentials = credentials
        self.state_machine = state_machine
        self.snapshot_every = snapshot_every
        self.store = QuorumStore(data_dir / METADATA_DIR)
        self.core: KafkaRaftClient | None = None
        self.applied = 0  # entries below this offset were given to the state machine
        self.on_leader_change: Callable[[LeaderChanged], None] | None = None
        # Called with True when this voter becomes the active controller, False when not.
        self.on_active_change: Callable[[bool], None] | None = None
        # Called after committed entries (or a leader's snapshot) reach the state machine.
        self.on_commit: Callable[[], None] | None = None
        # Called once, when this voter first catches up with the quorum (``caught_up``).
        self.on_caught_up: Callable[[], None] | None = None
        self._caught_up = False
        self._active = False
        # (last offset, pending, answer, lost): requests answered once their records are
        # applied, or with ``lost`` if leadership goes first.
        self._commit_waiters: list[tuple[int, PendingResponse, dict, dict | None]] = []
        self._waiting: dict[tuple[int, int], list[_Waiting]] = {}
        self._peers: dict[int, _Peer] = {}
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._outstanding = 0  # requests queued or in flight on the lanes
        self._drained = trio.Event()

    # --- start ----------------------------------------------------------------------------

    def load(self) -> None:
        """Rebuild the core from disk (quorum-state, snapshot, log); restore the state machine."""
        quorum_state, log = self.store.load()
        if log.snapshot is not None and self.state_machine is not None:
            self.state_machine.restore(log.snapshot.data)
        self.applied = log.start_offset
        self.core = KafkaRaftClient(
            self.node_id,
            self.voters,
            self.clock,
            random.Random(),
            config=self.config,
            quorum_state=quorum_state,
            log=log,
        )

    @property
    def loaded(self) -> bool:
        return self.core is not None

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        if self.core is None:
            self.load()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for voter, (host, port) in sorted(self.voters.items()):
                    if voter != self.node_id:
                        self._start_peer(nursery, voter, host, port)
                self._apply(self.core.start())
                nursery.start_soon(self._timer)
                task_status.started()
        finally:
            self.store.close()

    def _start_peer(self, nursery: trio.Nursery, voter: int, host: str, port: int) -> None:
        peer = _Peer(
            {
                lane: PeerConnection(
                    host,
                    port,
                    f"quorum-{self.node_id}",
                    credentials=self.credentials,
                    peer_id=voter,
                )
                for lane in ("fetch", "control")
            }
        )
        for lane, conn in peer.conns.items():
            send, receive = trio.open_memory_channel(_LANE_DEPTH)
            peer.lanes[lane] = send
            nursery.start_soon(self._lane, voter, conn, receive)
        self._peers[voter] = peer

    # --- the core's effects ---------------------------------------------------------------

    def _apply(self, effects: list) -> None:
        for effect in effects:
            if isinstance(effect, PersistQuorumState):
                self.store.persist_quorum_state(effect.state)
            elif isinstance(effect, AppendLog):
                self.store.append(effect.entries)
            elif isinstance(effect, TruncateLog):
                self.store.truncate(effect.offset)
            elif isinstance(effect, StoreSnapshot):
                self.store.store_snapshot(effect.snapshot)
                if effect.snapshot.snapshot_id.offset > self.applied:
                    # A leader's snapshot past what we applied: it replaces our state.
                    if self.state_machine is not None:
                        self.state_machine.restore(effect.snapshot.data)
                    self.applied = effect.snapshot.snapshot_id.offset
                    if self.on_commit is not None:
                        self.on_commit()
            elif isinstance(effect, Send):
                self._route(effect.destination, effect.message)
            elif isinstance(effect, HighWatermarkUpdated):
                self._commit(effect.offset)
            elif isinstance(effect, LeaderChanged):
                self.log.info(
                    "quorum_leader_changed",
                    role=effect.role,
                    epoch=effect.epoch,
                    leader=effect.leader_id,
                )
                if effect.role != "leader":
                    self._fail_waiters(effect.leader_id)
                if self.on_leader_change is not None:
                    self.on_leader_change(effect)
        if self.core is not None and self.is_active != self._active:
            self._active = not self._active
            self.log.info("active_controller" if self._active else "inactive_controller")
            if self.on_active_change is not None:
                self.on_active_change(self._active)
        if not self._caught_up and self.core is not None and self.caught_up:
            self._caught_up = True
            self.log.info("quorum_caught_up", applied=self.applied)
            if self.on_caught_up is not None:
                self.on_caught_up()
        self._wake.set()

    def _commit(self, high_watermark: int) -> None:
        log = self.core.log
        before = self.applied
        while self.applied < high_watermark:
            entry = log.entry(self.applied)
            if entry is None:  # below the log start: covered by a snapshot we restored
                break
            if not entry.control and self.state_machine is not None:
                self.state_machine.apply(entry)
            self.applied += 1
        if self.applied > before and self.on_commit is not None:
            self.on_commit()
        while self._commit_waiters and self._commit_waiters[0][0] < self.applied:
            pending, answer = self._commit_waiters.pop(0)[1:3]
            pending.set(answer)
        if (
            self.state_machine is not None
            and self.applied - log.start_offset >= self.snapshot_every
        ):
            self._apply(self.core.create_snapshot(self.applied, self.state_machine.snapshot()))

    def _route(self, destination: int, message: Message) -> None:
        key = REQUEST_KEYS.get(type(message))
        if key is not None:
            peer = self._peers.get(destination)
            if peer is None:
                return
            lane = (
                "fetch" if isinstance(message, FetchRequest | FetchSnapshotRequest) else "control"
            )
            try:
                peer.lanes[lane].send_nowait((key, message))
                self._outstanding += 1
            except trio.WouldBlock:
                self.log.debug("quorum_lane_full", peer=destination, lane=lane)
            return
        for api_key, kind in RESPONSE_TYPES.items():  # noqa: B007 (used after the loop)
            if isinstance(message, kind):
                break
        waiting = self._waiting.get((destination, api_key))
        if not waiting:
            return  # the caller gave up (timeout, closed connection): nothing to answer
        correlation = getattr(message, "correlation_id", None)
        for i, w in enumerate(waiting):
            if w.correlation_id is None or w.correlation_id == correlation:
                del waiting[i]
                w.pending.set(encode(message))
                return

    # --- network --------------------------------------------------------------------------

    async def _lane(self, voter: int, conn: PeerConnection, receive: trio.MemoryReceiveChannel):
        request_timeout = self.config.request_timeout_ms / 1000
        try:
            async for api_key, message in receive:
                timeout = request_timeout + getattr(message, "max_wait_ms", 0) / 1000
                try:
                    body = await conn.request(
                        api_key, encode(message), timeout=timeout, version=REQUEST_VERSIONS[api_key]
                    )
                    self._apply(self.core.handle(voter, decode_response(api_key, body)))
                except KafkaError as exc:
                    log_peer_failure(self.log, "quorum_request_failed", exc)
                    self._apply(self.core.request_failed(voter, message))
                finally:
                    self._outstanding -= 1
                    if self._outstanding == 0:
                        self._drained.set()
        finally:
            with trio.CancelScope(shield=True):
                await conn.close()

    def handle_request(self, api_key: int, body: dict, source: int, session: Any) -> Any:
        """Answer a voter's quorum request: its body now, or a PendingResponse (parked Fetch)."""
        message = decode_request(api_key, body)
        waiting = _Waiting(PendingResponse(), getattr(message, "correlation_id", None))
        queue = self._waiting.setdefault((source, api_key), [])
        queue.append(waiting)
        self._apply(self.core.handle(source, message))
        if waiting.pending.body is not None:
            return waiting.pending.body

        def forget() -> None:
            if waiting in queue:
                queue.remove(waiting)

        session.on_close(forget)
        return waiting.pending

    async def resign(self, timeout: float) -> None:
        """Clean shutdown of the leader: EndQuorumEpoch to the others, so they elect at once
        (the most caught-up first) instead of waiting out their fetch timeout."""
        if self.core is None or self.core.role != "leader":
            return
        self.log.info("quorum_resigning", epoch=self.core.epoch)
        self._apply(self.core.resign())
        with trio.move_on_after(timeout):
            while self._outstanding:
                self._drained = trio.Event()
                await self._drained.wait()

    async def _timer(self) -> None:
        while True:
            delay = max(0, self.core.next_deadline_ms() - self.clock.now_ms())
            self._wake = trio.Event()
            with trio.move_on_after(delay / 1000):
                await self._wake.wait()
            if self.clock.now_ms() >= self.core.next_deadline_ms():
                self._apply(self.core.poll())

    # --- the controller's view ------------------------------------------------------------

    @property
    def leader_id(self) -> int | None:
        return self.core.leader_id if self.core else None

    @property
    def is_active(self) -> bool:
        """The active controller: quorum leader whose epoch start has committed (KRaft's rule)."""
        return self.core is not None and self.core.is_active_leader

    @property
    def caught_up(self) -> bool:
        """Everything the quorum had committed when we last heard from it is applied here.

        The active controller is caught up by definition; a follower once it has applied
        up to the high watermark its leader last reported (Kafka's initial catch-up, which
        a broker waits for before serving clients).
        """
        if self.core is not None and self.core.is_follower:
            hw = self.core.follower_high_watermark
            return hw is not None and self.applied >= hw
        return self.is_active

    def append(self, records: list[bytes]) -> int:
        """Append as the active controller; returns the last offset (commits later)."""
        last, effects = self.core.append(records, self.core.epoch)
        self._apply(effects)
        return last

    def append_and_answer(
        self, records: list[bytes], answer: dict, lost: dict | None = None
    ) -> PendingResponse:
        """Append as the active controller; ``answer`` goes out once the records are applied
        here (committed by a majority); if leadership is lost first, ``lost`` (None: a
        NOT_CONTROLLER error), since the records may or may not commit under the next one."""
        pending = PendingResponse()
        if not records:
            pending.set(answer)
            return pending
        last = self.append(records)
        self._commit_waiters.append((last, pending, answer, lost))
        self._commit(self.core.high_watermark)  # a one-voter quorum has committed already
        return pending

    def _fail_waiters(self, leader_id: int | None) -> None:
        waiters, self._commit_waiters = self._commit_waiters, []
        for _, pending, _, lost in waiters:
            pending.set(
                lost
                or {
                    "error_code": int(ErrorCode.NOT_CONTROLLER),
                    "error_message": f"broker {self.node_id} lost the controller role before "
                    f"the change committed (the controller is now {leader_id})",
                }
            )

    def stats(self) -> dict:
        core = self.core
        if core is None:
            return {}
        out = {
            "role": core.role,
            "epoch": core.epoch,
            "leader_id": core.leader_id if core.leader_id is not None else -1,
            "active": self.is_active,
            "high_watermark": core.high_watermark,
            "log_end_offset": core.log.end_offset,
            "log_start_offset": core.log.start_offset,
            "applied": self.applied,
        }
        lag = core.voter_lag()
        if lag is not None:
            out["voter_lag"] = {str(v): n for v, n in lag.items()}
            ages = core.voter_fetch_age_ms() or {}
            out["voter_fetch_age_ms"] = {str(v): n for v, n in ages.items()}
        return out
