"""One partition replica on this broker: the only code that changes its replication state.

Kafka's Partition.scala is the model (kafka-semantics.md §3, §5). Leader side: the HW
is the minimum LEO over the ISR, never moves backwards and is held while the ISR is
below min.insync.replicas; a follower's LEO is the offset it fetches from; the ISR
grows on any fetch that qualifies and shrinks after ``replica.lag.time.max.ms``.
Follower side: batches are appended verbatim and teach the epoch cache; the HW is
min(leader HW, own LEO); truncation cuts the log, the epoch cache and the HW together.

Everything here is synchronous and does no network I/O: the replica fetcher and the
request paths do the talking and call these methods, so every rule can be unit tested
with a temporary directory and integers for clocks. Methods whose change may complete
delayed operations return True when it happened; the caller runs the purgatories.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minibroker.broker.metadata.image import PartitionState
from minibroker.broker.storage.log import ReadResult
from minibroker.protocol import iter_batches
from minibroker.protocol.errors import (
    ErrorCode,
    NotEnoughReplicas,
    NotLeaderOrFollower,
    OffsetOutOfRange,
)

# check_enough_replicas_reach_offset answers: shared, so a trigger allocates nothing.
_NOT_LEADER = (True, ErrorCode.NOT_LEADER_OR_FOLLOWER)
_REACHED = (True, ErrorCode.NONE)
_REACHED_UNDER_MIN_ISR = (True, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
_WAITING = (False, ErrorCode.NONE)


class ReplicaState:
    """What the leader knows about one follower (Kafka's Replica)."""

    __slots__ = (
        "last_caught_up_ms",
        "last_fetch_leader_leo",
        "last_fetch_ms",
        "log_end_offset",
        "log_start_offset",
    )

    def __init__(self) -> None:
        self.log_end_offset = -1
        self.log_start_offset = -1  # from its fetches (-1: unknown)
        self.last_caught_up_ms = 0
        self.last_fetch_leader_leo = -1
        self.last_fetch_ms = 0


IsrProposer = Callable[["Partition", list[int]], None]


class Partition:
    __slots__ = (
        "broker_id",
        "epoch_cache",
        "high_watermark",
        "index",
        "isr",
        "key",
        "leader_epoch",
        "leader_epoch_start_offset",
        "leader_id",
        "log",
        "maximal_isr",
        "min_insync_replicas",
        "on_truncated",
        "partition_epoch",
        "propose_isr",
        "replica_states",
        "replicas",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        index: int,
        log: Any,
        broker_id: int,
        epoch_cache: Any,
        propose_isr: IsrProposer | None = None,
    ) -> None:
        self.topic = topic
        self.epoch_cache = epoch_cache
        self.index = index
        self.key = (topic, index)
        self.log = log
        self.broker_id = broker_id
        self.leader_id = -1
        self.leader_epoch = -1
        self.partition_epoch = 0
        self.replicas: list[int] = []
        self.isr: list[int] = []
        # Kafka's maximal ISR: the committed ISR plus replicas a proposal in flight adds.
        # The HW is computed over it, so it never passes a replica the controller may
        # already list in the ISR (and so may elect) before our leader hears the answer.
        self.maximal_isr: list[int] = []
        self.high_watermark = 0
        # Set from the topic config on every metadata update (ReplicaManager.host_partition).
        self.min_insync_replicas = 1
        self.leader_epoch_start_offset = 0
        self.replica_states: dict[int, ReplicaState] = {}
        # Kafka's AlterPartitionManager: sends an ISR change to the controller. The
        # leader proposes; it changes its ISR only when the answer comes back.
        self.propose_isr = propose_isr
        # Told after a truncation moved the log's recovery point back: the checkpoint on
        # disk must not stay above it (Kafka's LogManager.truncateTo checkpoints at once).
        self.on_truncated: Callable[[], None] | None = None

    # --- role -----------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.broker_id

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    def make_leader(self, state: PartitionState, now_ms: int) -> bool:
        """Become (or stay) leader; returns True if the HW rose."""
        new_epoch = state.leader_epoch != self.leader_epoch or not self.is_leader
        self._apply(state)
        if new_epoch:
            self.leader_epoch_start_offset = self.log.log_end_offset
            self.epoch_cache.assign(self.leader_epoch, self.log.log_end_offset)
            states = {}
            for rid in self.replicas:
                if rid == self.broker_id:
                    continue
                rs = ReplicaState()
                rs.last_caught_up_ms = now_ms if rid in self.isr else 0
                states[rid] = rs
            self.replica_states = states
        return self.maybe_increment_leader_hw()

    def make_follower(self, state: PartitionState) -> bool:
        """Follow ``state.leader``; returns True if this replica was the leader until now.

        Then pending acks=all produces and fetches must answer NOT_LEADER_OR_FOLLOWER.
        """
        was_leader = self.is_leader
        self._apply(state)
        self.replica_states = {}
        return was_leader

    def _apply(self, state: PartitionState) -> None:
        self.leader_id = state.leader
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch
        self.replicas = list(state.replicas)
        self.isr = list(state.isr)
        self.maximal_isr = list(state.isr)

    # --- leader side: appends and the high watermark -------------------------------------

    def append_records_to_leader(self, records: bytes, required_acks: int):
        """Append a producer's batches; refused below min.insync.replicas with acks=all.

        The HW may move (a leader alone in its ISR): the caller compares it before and
        after, which costs nothing on the path where it does not.
        """
        if not self.is_leader:
            raise NotLeaderOrFollower(
                f"broker {self.broker_id} is not the leader of {self.topic}-{self.index}"
            )
        if required_acks == -1 and self.is_under_min_isr():
            raise NotEnoughReplicas(
                f"{self.topic}-{self.index}: ISR {self.isr} is smaller than "
                f"min.insync.replicas={min(self.min_insync_replicas, len(self.replicas) or 1)}"
            )
        info = self.log.append_as_leader(records, self.leader_epoch)
        self.maybe_increment_leader_hw()
        return info

    def append_marker_to_leader(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool
    ):
        """End a producer's transaction here (WriteTxnMarkers): a control batch, appended
        with acks=all's rules (refused below min.insync.replicas, as Kafka's markers)."""
        if not self.is_leader:
            raise NotLeaderOrFollower(
                f"broker {self.broker_id} is not the leader of {self.topic}-{self.index}"
            )
        if self.is_under_min_isr():
            raise NotEnoughReplicas(
                f"{self.topic}-{self.index}: ISR {self.isr} is smaller than "
                f"min.insync.replicas={min(self.min_insync_replicas, len(self.replicas) or 1)}"
            )
        info = self.log.append_marker(
            producer_id, producer_epoch, coordinator_epoch, commit, self.leader_epoch
        )
        self.maybe_increment_leader_hw()
        return info

    def maybe_increment_leader_hw(self) -> bool:
        """HW = min LEO over the ISR; monotonic; held while the ISR is under min.insync.replicas."""
        if self.is_under_min_isr():
            return False
        new_hw = self.log.log_end_offset
        for rid in self.maximal_isr:
            if rid == self.broker_id:
                continue
            rs = self.replica_states.get(rid)
            if rs is None or rs.log_end_offset < 0:
                new_hw = min(new_hw, self.high_watermark)
            elif rs.log_end_offset < new_hw:
                new_hw = rs.log_end_offset
        if new_hw > self.high_watermark:
            self.high_watermark = new_hw
            self.log.producers.forget_replicated(new_hw)
            return True
        return False

    def is_under_min_isr(self) -> bool:
        """Effective min ISR = min(min.insync.replicas, replicas), as Kafka's."""
        return len(self.isr) < min(self.min_insync_replicas, len(self.replicas) or 1)

    def check_enough_replicas_reach_offset(self, required_offset: int) -> tuple[bool, ErrorCode]:
        """(done, error) for a pending acks=all produce, as Kafka's Partition answers it."""
        if not self.is_leader:
            return _NOT_LEADER
        if self.high_watermark >= required_offset:
            return _REACHED_UNDER_MIN_ISR if self.is_under_min_isr() else _REACHED
        return _WAITING

    # --- leader side: followers and the ISR ----------------------------------------------

    def update_follower_fetch_state(self, replica_id: int, fetch_offset: int, now_ms: int) -> bool:
        """A follower fetched from ``fetch_offset`` (its LEO); returns True if the HW rose.

        Kafka's updateFollowerFetchState: caught-up time, then maybeExpandIsr on every
        fetch, then the HW when the follower's LEO moved.
        """
        rs = self.replica_states.get(replica_id)
        if rs is None:
            if replica_id not in self.replicas:
                raise NotLeaderOrFollower(
                    f"broker {replica_id} is not a replica of {self.topic}-{self.index}"
                )
            rs = self.replica_states[replica_id] = ReplicaState()
        leader_leo = self.log.log_end_offset
        if fetch_offset >= leader_leo:
            rs.last_caught_up_ms = max(rs.last_caught_up_ms, now_ms)
        elif fetch_offset >= rs.last_fetch_leader_leo:
            rs.last_caught_up_ms = max(rs.last_caught_up_ms, rs.last_fetch_ms)
        rs.last_fetch_leader_leo = leader_leo
        rs.last_fetch_ms = now_ms
        moved = rs.log_end_offset != fetch_offset
        rs.log_end_offset = fetch_offset
        # On every fetch, not only when the offset moved: a follower that caught up in one
        # fetch on an idle partition, while another proposal was in flight or was rejected
        # as stale, must still get back in.
        self.maybe_expand_isr(replica_id)
        return moved and self.maybe_increment_leader_hw()

    def note_follower_start(self, replica_id: int, start: int) -> bool:
        """A follower's fetch named its log start; True if it moved (DeleteRecords waits)."""
        rs = self.replica_states.get(replica_id)
        if rs is None or start < 0 or rs.log_start_offset == start:
            return False
        rs.log_start_offset = start
        return True

    def low_watermark(self) -> int:
        """Kafka's lowWatermarkIfLeader: the smallest log start over this leader and its
        in-sync followers whose start is known."""
        low = self.log.log_start_offset
        for replica in self.isr:
            rs = self.replica_states.get(replica)
            if replica != self.broker_id and rs is not None and 0 <= rs.log_start_offset < low:
                low = rs.log_start_offset
        return low

    def follower_can_join_isr(self, replica_id: int) -> bool:
        rs = self.replica_states.get(replica_id)
        return (
            rs is not None
            and replica_id not in self.isr
            and rs.log_end_offset >= self.high_watermark
            and rs.log_end_offset >= self.leader_epoch_start_offset
        )

    def maybe_expand_isr(self, replica_id: int) -> bool:
        """Propose ``replica_id`` for the ISR if it caught up within this leader epoch."""
        if self.propose_isr is None or not self.follower_can_join_isr(replica_id):
            return False
        if replica_id not in self.maximal_isr:
            self.maximal_isr.append(replica_id)
        self.propose_isr(self, [*self.isr, replica_id])
        return True

    def isr_proposal_ended(self) -> bool:
        """A proposal was refused or lost: only the committed ISR holds the HW back again.

        Returns True if the HW rose (a joining replica that lagged no longer counts).
        """
        self.maximal_isr = list(self.isr)
        return self.is_leader and self.maybe_increment_leader_hw()

    def out_of_sync_replicas(self, now_ms: int, lag_ms: int) -> list[int]:
        """ISR members that have not been caught up for more than ``lag_ms``."""
        leo = self.log.log_end_offset
        out = []
        for rid in self.isr:
            if rid == self.broker_id:
                continue
            rs = self.replica_states.get(rid)
            if rs is None:
                continue
            if rs.log_end_offset != leo and now_ms - rs.last_caught_up_ms > lag_ms:
                out.append(rid)
        return out

    def maybe_shrink_isr(self, now_ms: int, lag_ms: int) -> list[int]:
        """Leader: propose the ISR without its lagging members; returns who they are."""
        if not self.is_leader or self.propose_isr is None:
            return []
        out = self.out_of_sync_replicas(now_ms, lag_ms)
        if out:
            self.propose_isr(self, [r for r in self.isr if r not in out])
        return out

    def apply_isr_update(self, leader_epoch: int, isr: list[int], partition_epoch: int) -> bool:
        """The controller accepted our ISR proposal: take it now, as Kafka's leader does.

        Returns True if the HW rose (a shrink can let it move, and with it pending
        acks=all produces). Waiting for the metadata push instead would make the next
        follower fetch propose the same change again, and a later proposal carry a stale
        partition epoch. An answer for an older leadership, or older than what we hold,
        is ignored.
        """
        if not self.is_leader or leader_epoch != self.leader_epoch:
            return False
        if partition_epoch <= self.partition_epoch:
            return False
        self.isr = list(isr)
        self.maximal_isr = list(isr)
        self.partition_epoch = partition_epoch
        return self.maybe_increment_leader_hw()

    def last_offset_for_leader_epoch(self, epoch: int) -> tuple[int, int]:
        """(largest epoch <= ``epoch`` we know, where it ends): OffsetsForLeaderEpoch's answer."""
        return self.epoch_cache.end_offset_for(epoch, self.log.log_end_offset)

    # --- follower side --------------------------------------------------------------------

    def append_records_to_follower(self, records: bytes) -> None:
        """Copy the leader's batches verbatim and learn the epochs they start (per batch)."""
        self.log.append_as_follower(records)
        cache = self.epoch_cache
        for _, header in iter_batches(records, verify=False):
            if header.leader_epoch > cache.latest_epoch:
                cache.assign(header.leader_epoch, header.base_offset)

    def maybe_update_follower_hw(self, leader_hw: int) -> bool:
        """Follower HW = min(leader HW, own LEO), never backwards; True if it rose."""
        new_hw = min(leader_hw, self.log.log_end_offset)
        if new_hw > self.high_watermark:
            self.high_watermark = new_hw
            self.log.producers.forget_replicated(new_hw)
            return True
        return False

    @property
    def latest_epoch(self) -> int:
        """The newest leader epoch our log holds records of (-1: none known)."""
        return self.epoch_cache.latest_epoch

    def offset_for_truncation(self, leader_epoch: int, leader_end_offset: int) -> int:
        """Where our log diverges from the leader's, from its OffsetsForLeaderEpoch answer.

        ``leader_epoch`` is the largest epoch the leader has that is <= our latest, and
        ``leader_end_offset`` where it ends there (KIP-101, Kafka's getOffsetTruncationState).
        The leader knowing none of our epochs (-1) leaves us what is committed: the HW.
        """
        if leader_epoch < 0:
            return self.high_watermark
        if leader_epoch == self.epoch_cache.latest_epoch:
            return leader_end_offset
        _, our_end = self.epoch_cache.end_offset_for(leader_epoch, self.log.log_end_offset)
        return min(leader_end_offset, our_end)

    def truncate_to(self, offset: int) -> bool:
        """Drop records at and above ``offset``: log, epoch cache and HW together.

        A batch holding ``offset`` goes whole, so the LEO may end below ``offset``; the HW
        never stays above the LEO. Returns False if there was nothing to drop.
        """
        log = self.log
        if offset >= log.log_end_offset:
            return False
        log.truncate_to(offset)
        self.epoch_cache.truncate_from_end(log.log_end_offset)
        if self.high_watermark > log.log_end_offset:
            self.high_watermark = log.log_end_offset
        if self.on_truncated is not None:
            self.on_truncated()
        return True

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Empty the log and restart it at ``offset`` (we are behind the leader's start).

        The epochs we knew own no records any more: the cache starts over, as Kafka's.
        """
        self.log.truncate_fully_and_start_at(offset)
        self.epoch_cache.clear()
        self.high_watermark = offset
        if self.on_truncated is not None:
            self.on_truncated()

    # --- both sides -----------------------------------------------------------------------

    @property
    def last_stable_offset(self) -> int:
        """LSO: below every transaction not yet decided (and replicated); <= the HW."""
        return self.log.last_stable_offset(self.high_watermark)

    def _upper(self, for_follower: bool, committed: bool) -> int:
        """Where a read stops: followers the LEO, consumers the HW, read_committed the LSO."""
        if for_follower:
            return self.log.log_end_offset
        return (
            self.log.last_stable_offset(self.high_watermark) if committed else self.high_watermark
        )

    def read(
        self,
        fetch_offset: int,
        max_bytes: int,
        *,
        for_follower: bool,
        min_one_batch: bool = True,
        committed: bool = False,
    ) -> bytes:
        """Bytes from ``fetch_offset``: consumers up to the HW (read_committed: the LSO),
        followers up to the LEO."""
        return self.read_result(
            fetch_offset,
            max_bytes,
            for_follower=for_follower,
            min_one_batch=min_one_batch,
            committed=committed,
        ).data

    def read_result(
        self,
        fetch_offset: int,
        max_bytes: int,
        *,
        for_follower: bool,
        min_one_batch: bool = True,
        committed: bool = False,
        region: bool = False,
    ) -> ReadResult:
        """``read`` with where the bytes end (a read_committed answer's aborted range).

        ``region``: the data may be a FileRegion of the segment (Log.read_region), for an
        answer sent from the file (a follower's fetch on the native listener)."""
        log = self.log
        upper = self._upper(for_follower, committed)
        if fetch_offset > log.log_end_offset or fetch_offset < log.log_start_offset:
            raise OffsetOutOfRange(
                f"{self.topic}-{self.index}: offset {fetch_offset} is outside "
                f"[{log.log_start_offset}, {log.log_end_offset}]"
            )
        if fetch_offset >= upper:
            return ReadResult(b"", fetch_offset, fetch_offset)
        read = log.read_region if region else log.read
        return read(fetch_offset, max_bytes, max_offset=upper, min_one_batch=min_one_batch)

    def available_bytes(
        self, fetch_offset: int, for_follower: bool, wanted: int, committed: bool = False
    ) -> int:
        """Bytes a fetch from ``fetch_offset`` could return now, counted up to ``wanted``.

        -1 when the offset is outside the log as this fetch sees it (a truncated leader,
        retention): the fetch must answer now. DelayedFetch asks this on every trigger;
        when any batch is there and one byte is enough (the common case) it costs no I/O.
        """
        log = self.log
        upper = self._upper(for_follower, committed)
        if fetch_offset < log.log_start_offset or fetch_offset > log.log_end_offset:
            return -1
        if fetch_offset > upper and not committed:
            return -1
        if fetch_offset >= upper:
            return 0  # read_committed past the LSO (it read uncommitted before): wait
        if wanted <= 1:
            return 1
        return len(log.read(fetch_offset, wanted, max_offset=upper, min_one_batch=True).data)
