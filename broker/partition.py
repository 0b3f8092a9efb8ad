"""One partition replica on this broker: its log, its role, the high watermark and the ISR.

Leader rules follow Kafka's Partition.scala (kafka-semantics.md §3, §5): the HW is
the minimum LEO over the ISR, never moves backwards and is held while the ISR is
below min.insync.replicas; a follower's LEO is the offset it fetches from.
"""

from __future__ import annotations

from typing import Any

from protocol.errors import NotEnoughReplicas, NotLeaderOrFollower, OffsetOutOfRange

from .metadata import PartitionState


class ReplicaState:
    """What the leader knows about one follower."""

    __slots__ = ("last_caught_up_ms", "last_fetch_leader_leo", "last_fetch_ms", "log_end_offset")

    def __init__(self) -> None:
        self.log_end_offset = -1
        self.last_caught_up_ms = 0
        self.last_fetch_leader_leo = -1
        self.last_fetch_ms = 0


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
        "min_insync_replicas",
        "partition_epoch",
        "replica_states",
        "replicas",
        "topic",
    )

    def __init__(self, topic: str, index: int, log: Any, broker_id: int, epoch_cache: Any) -> None:
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
        self.high_watermark = 0
        self.min_insync_replicas = 1
        self.leader_epoch_start_offset = 0
        self.replica_states: dict[int, ReplicaState] = {}

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
        return self.maybe_increment_hw()

    def make_follower(self, state: PartitionState) -> None:
        self._apply(state)
        self.replica_states = {}

    def _apply(self, state: PartitionState) -> None:
        self.leader_id = state.leader
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch
        self.replicas = list(state.replicas)
        self.isr = list(state.isr)

    # --- leader side ----------------------------------------------------------------------

    def append_as_leader(self, records: bytes, required_acks: int, min_insync: int):
        if not self.is_leader:
            raise NotLeaderOrFollower(
                f"broker {self.broker_id} is not the leader of {self.topic}-{self.index}"
            )
        effective_min = min(min_insync, len(self.replicas) or 1)
        if required_acks == -1 and len(self.isr) < effective_min:
            raise NotEnoughReplicas(
                f"{self.topic}-{self.index}: ISR {self.isr} is smaller than min.insync.replicas={effective_min}"
            )
        info = self.log.append_as_leader(records, self.leader_epoch)
        self.maybe_increment_hw()
        return info

    def maybe_increment_hw(self) -> bool:
        """HW = min LEO over the ISR; monotonic; held while the ISR is under min.insync.replicas."""
        if self.is_under_min_isr(self.min_insync_replicas):
            return False
        leo = self.log.log_end_offset
        new_hw = leo
        for rid in self.isr:
            if rid == self.broker_id:
                continue
            rs = self.replica_states.get(rid)
            if rs is None or rs.log_end_offset < 0:
                new_hw = min(new_hw, self.high_watermark)
            elif rs.log_end_offset < new_hw:
                new_hw = rs.log_end_offset
        if new_hw > self.high_watermark:
            self.high_watermark = new_hw
            return True
        return False

    def is_under_min_isr(self, min_insync: int) -> bool:
        return len(self.isr) < min(min_insync, len(self.replicas) or 1)

    def check_enough_replicas_reach_offset(self, required_offset: int, min_insync: int):
        """(done, error_name) for a pending acks=all produce, as Kafka's Partition does."""
        if not self.is_leader:
            return True, "NOT_LEADER_OR_FOLLOWER"
        if self.high_watermark >= required_offset:
            if self.is_under_min_isr(min_insync):
                return True, "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
            return True, "NONE"
        return False, "NONE"

    def update_follower_fetch_state(self, replica_id: int, fetch_offset: int, now_ms: int) -> bool:
        """Record a follower fetch; returns True if the follower's LEO changed."""
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
        changed = rs.log_end_offset != fetch_offset
        rs.log_end_offset = fetch_offset
        return changed

    def follower_can_join_isr(self, replica_id: int) -> bool:
        rs = self.replica_states.get(replica_id)
        return (
            rs is not None
            and replica_id not in self.isr
            and rs.log_end_offset >= self.high_watermark
            and rs.log_end_offset >= self.leader_epoch_start_offset
        )

    def apply_isr_update(self, leader_epoch: int, isr: list[int], partition_epoch: int) -> bool:
        """The controller accepted our ISR proposal: take it now, as Kafka's leader does.

        Waiting for the metadata push instead would make the next follower fetch propose
        the same change again, and a later proposal carry a stale partition epoch. An
        answer for an older leadership, or older than what we hold, is ignored.
        """
        if not self.is_leader or leader_epoch != self.leader_epoch:
            return False
        if partition_epoch <= self.partition_epoch:
            return False
        self.isr = list(isr)
        self.partition_epoch = partition_epoch
        return True

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

    # --- both sides -----------------------------------------------------------------------

    def read(
        self, fetch_offset: int, max_bytes: int, *, for_follower: bool, min_one_batch: bool = True
    ):
        """Bytes from ``fetch_offset``: consumers up to the HW, followers up to the LEO."""
        log = self.log
        upper = log.log_end_offset if for_follower else self.high_watermark
        if fetch_offset > log.log_end_offset or fetch_offset < log.log_start_offset:
            raise OffsetOutOfRange(
                f"{self.topic}-{self.index}: offset {fetch_offset} is outside "
                f"[{log.log_start_offset}, {log.log_end_offset}]"
            )
        if fetch_offset >= upper:
            return b""
        return log.read(fetch_offset, max_bytes, max_offset=upper, min_one_batch=min_one_batch).data

    def available_bytes(self, fetch_offset: int, for_follower: bool, wanted: int) -> int:
        """Bytes a fetch from ``fetch_offset`` could return now, counted up to ``wanted``.

        DelayedFetch asks this on every trigger; when any batch is there and one byte is
        enough (the common case) it costs no I/O.
        """
        log = self.log
        upper = log.log_end_offset if for_follower else self.high_watermark
        if fetch_offset >= upper or fetch_offset < log.log_start_offset:
            return 0
        if wanted <= 1:
            return 1
        return len(log.read(fetch_offset, wanted, max_offset=upper, min_one_batch=True).data)
