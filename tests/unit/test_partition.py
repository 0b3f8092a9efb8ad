"""Partition's replication rules, leader and follower side, with a real log and no sockets.

Kafka's PartitionTest is the model (kafka-semantics.md §6): HW monotonic and held
under min ISR, ISR expansion on every qualifying fetch, shrink after the lag, truncation
where the logs diverge, and the epoch cache kept in step with the log.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from minibroker.broker.metadata.image import PartitionState
from minibroker.broker.replication.partition import Partition
from minibroker.broker.storage import Log, LogConfig
from minibroker.broker.storage.epoch_cache import LeaderEpochCache
from minibroker.protocol import encode_batch
from minibroker.protocol.errors import ErrorCode, NotEnoughReplicas, NotLeaderOrFollower


def batch(n: int, *, base_offset: int = 0, epoch: int = -1) -> bytes:
    rows = [(1000 + i, None, f"v{i}".encode(), []) for i in range(n)]
    return encode_batch(rows, base_offset=base_offset, leader_epoch=epoch)


class Proposals(list):
    """Stands in for AlterPartition: records what the partition proposed."""

    def __call__(self, partition: Partition, isr: list[int]) -> None:
        self.append(sorted(isr))


@pytest.fixture
def proposals() -> Proposals:
    return Proposals()


@pytest.fixture
def make(tmp_path: Path, proposals: Proposals):
    opened: list[Log] = []

    def make(broker_id: int = 0, min_isr: int = 1) -> Partition:
        directory = tmp_path / f"t-0-{broker_id}-{len(opened)}"
        log = Log.open(directory, LogConfig(), now_ms=lambda: 1_000_000)
        opened.append(log)
        partition = Partition("t", 0, log, broker_id, LeaderEpochCache(directory), proposals)
        partition.min_insync_replicas = min_isr
        return partition

    yield make
    for log in opened:
        log.close()


def leader(make, isr=(0, 1, 2), min_isr: int = 1, epoch: int = 5, now: int = 0) -> Partition:
    p = make(min_isr=min_isr)
    p.make_leader(PartitionState(0, epoch, [0, 1, 2], list(isr), partition_epoch=1), now)
    return p


# --- leader side --------------------------------------------------------------------------


def test_hw_is_the_min_leo_over_the_isr_and_never_goes_back(make):
    p = leader(make)
    p.append_records_to_leader(batch(5), -1)
    assert p.high_watermark == 0  # followers not heard from yet hold it
    assert p.update_follower_fetch_state(1, 5, now_ms=1) is False
    assert p.update_follower_fetch_state(2, 3, now_ms=1) is True
    assert p.high_watermark == 3
    # A follower fetching from lower down (it truncated) cannot pull the HW back.
    assert p.update_follower_fetch_state(2, 2, now_ms=2) is False
    assert p.high_watermark == 3
    assert p.update_follower_fetch_state(2, 5, now_ms=3) is True
    assert p.high_watermark == 5 == p.log_end_offset


def test_a_leader_alone_in_its_isr_moves_the_hw_on_append(make):
    p = leader(make, isr=[0])
    p.append_records_to_leader(batch(4), 1)
    assert p.high_watermark == 4


def test_hw_is_held_and_acks_all_refused_under_min_isr(make):
    p = leader(make, isr=[0], min_isr=2)
    with pytest.raises(NotEnoughReplicas, match=r"min\.insync\.replicas=2"):
        p.append_records_to_leader(batch(1), -1)
    assert p.log_end_offset == 0  # nothing appended
    p.append_records_to_leader(batch(3), 1)  # acks=1 is not refused...
    assert p.high_watermark == 0  # ...but the HW waits for the ISR
    assert p.check_enough_replicas_reach_offset(3) == (False, ErrorCode.NONE)


def test_check_enough_replicas_answers_error_codes(make):
    p = leader(make, isr=[0, 1], min_isr=2)
    p.append_records_to_leader(batch(2), -1)
    assert p.check_enough_replicas_reach_offset(2) == (False, ErrorCode.NONE)
    p.update_follower_fetch_state(1, 2, now_ms=1)
    assert p.check_enough_replicas_reach_offset(2) == (True, ErrorCode.NONE)
    # The ISR shrinks below min.insync.replicas after the write reached the HW.
    p.apply_isr_update(5, [0], partition_epoch=2)
    done, error = p.check_enough_replicas_reach_offset(2)
    assert done and error is ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    p.make_follower(PartitionState(1, 6, [0, 1, 2], [1], partition_epoch=3))
    assert p.check_enough_replicas_reach_offset(2) == (True, ErrorCode.NOT_LEADER_OR_FOLLOWER)


def test_a_follower_is_proposed_for_the_isr_on_every_fetch_until_it_is_in(make, proposals):
    p = leader(make, isr=[0, 1])
    p.append_records_to_leader(batch(5), -1)
    p.update_follower_fetch_state(1, 5, now_ms=1)
    assert p.high_watermark == 5
    p.update_follower_fetch_state(2, 3, now_ms=1)
    assert proposals == []  # behind the HW
    p.update_follower_fetch_state(2, 5, now_ms=2)
    p.update_follower_fetch_state(2, 5, now_ms=3)  # same offset: proposed again
    assert proposals == [[0, 1, 2], [0, 1, 2]]
    # A stale answer (older leadership, or not newer than what we hold) changes nothing.
    assert p.apply_isr_update(4, [0, 1, 2], partition_epoch=9) is False
    assert p.apply_isr_update(5, [0, 1, 2], partition_epoch=1) is False
    assert p.isr == [0, 1]
    p.apply_isr_update(5, [0, 1, 2], partition_epoch=2)
    assert p.isr == [0, 1, 2] and p.partition_epoch == 2
    p.update_follower_fetch_state(2, 5, now_ms=4)
    assert len(proposals) == 2  # in the ISR: nothing more to propose


def test_the_hw_waits_for_a_replica_whose_isr_proposal_is_in_flight(make, proposals):
    # Kafka's maximal ISR: the controller may already list the joining replica in the ISR
    # (and elect it) before our leader hears the answer, so the HW must not pass it.
    p = leader(make, isr=[0, 1])
    p.append_records_to_leader(batch(3), -1)
    p.update_follower_fetch_state(1, 3, now_ms=1)
    p.update_follower_fetch_state(2, 3, now_ms=1)  # caught up: proposed
    assert proposals == [[0, 1, 2]] and p.high_watermark == 3
    p.append_records_to_leader(batch(2, base_offset=3), -1)
    p.update_follower_fetch_state(1, 5, now_ms=2)
    assert p.high_watermark == 3  # held at replica 2's log end while its proposal is out
    # Refused or lost: the committed ISR alone counts again, and the HW catches up.
    assert p.isr_proposal_ended() is True
    assert p.high_watermark == 5


def test_a_follower_joins_only_once_caught_up_within_the_leader_epoch(make, proposals):
    p = make()
    p.make_follower(PartitionState(1, 4, [0, 1, 2], [0, 1, 2]))
    p.append_records_to_follower(batch(3, epoch=4))  # HW never reached us: it stays 0
    p.make_leader(PartitionState(0, 5, [0, 1, 2], [0, 1], partition_epoch=1), 0)
    assert (p.leader_epoch_start_offset, p.high_watermark) == (3, 0)
    p.update_follower_fetch_state(2, 2, now_ms=1)  # at or above the HW, below the epoch start
    assert proposals == []
    p.update_follower_fetch_state(2, 3, now_ms=2)
    assert proposals == [[0, 1, 2]]


def test_isr_shrinks_after_the_lag_and_the_hw_then_moves(make, proposals):
    p = leader(make, isr=[0, 1, 2], now=0)
    p.append_records_to_leader(batch(4), -1)
    p.update_follower_fetch_state(1, 4, now_ms=10)  # caught up
    p.update_follower_fetch_state(2, 1, now_ms=10)  # behind
    assert p.high_watermark == 1
    assert p.maybe_shrink_isr(now_ms=100, lag_ms=100) == []  # not lagging long enough
    assert p.maybe_shrink_isr(now_ms=101, lag_ms=100) == [2]
    assert proposals == [[0, 1]]
    assert p.high_watermark == 1  # proposed, not applied: the HW waits
    assert p.apply_isr_update(5, [0, 1], partition_epoch=2) is True
    assert p.high_watermark == 4


def test_caught_up_time_moves_only_with_fetches_that_reach_the_leo(make):
    p = leader(make, now=0)
    p.append_records_to_leader(batch(4), -1)
    p.update_follower_fetch_state(1, 2, now_ms=50)
    assert p.replica_states[1].last_caught_up_ms == 0
    p.update_follower_fetch_state(1, 4, now_ms=60)
    assert p.replica_states[1].last_caught_up_ms == 60
    with pytest.raises(NotLeaderOrFollower):
        p.update_follower_fetch_state(7, 0, now_ms=70)


def test_make_leader_assigns_the_epoch_and_make_follower_says_leadership_was_lost(make):
    p = make()
    assert p.make_follower(PartitionState(1, 2, [0, 1], [0, 1])) is False
    p.make_leader(PartitionState(0, 3, [0, 1], [0, 1]), 0)
    assert p.epoch_cache.entries == [(3, 0)]
    p.append_records_to_leader(batch(2), 1)
    assert p.make_follower(PartitionState(1, 4, [0, 1], [0, 1])) is True
    assert not p.is_leader and p.replica_states == {}
    with pytest.raises(NotLeaderOrFollower):
        p.append_records_to_leader(batch(1), 1)


# --- follower side ------------------------------------------------------------------------


def follower_with(make, *batches: tuple[int, int]) -> Partition:
    """A follower holding batches of (record count, epoch), in order."""
    p = make()
    p.make_follower(PartitionState(1, 9, [0, 1], [0, 1]))
    for n, epoch in batches:
        p.append_records_to_follower(batch(n, base_offset=p.log_end_offset, epoch=epoch))
    return p


def test_follower_appends_teach_the_epoch_cache_and_the_hw_follows_the_leader(make):
    p = follower_with(make, (3, 1), (2, 1), (2, 3))
    assert p.epoch_cache.entries == [(1, 0), (3, 5)]
    assert p.latest_epoch == 3
    assert p.maybe_update_follower_hw(100) is True
    assert p.high_watermark == 7  # never above our own LEO
    assert p.maybe_update_follower_hw(4) is False
    assert p.high_watermark == 7


def test_truncation_where_the_logs_diverge_cuts_log_cache_and_hw_together(make):
    p = follower_with(make, (3, 1), (3, 2))
    p.maybe_update_follower_hw(6)
    # The new leader's epoch 1 ended at 4; ours ended at 3: cut at the smaller.
    target = p.offset_for_truncation(1, 4)
    assert target == 3
    assert p.truncate_to(target) is True
    assert p.log_end_offset == 3
    assert p.epoch_cache.entries == [(1, 0)]
    assert p.high_watermark == 3
    assert p.truncate_to(3) is False  # nothing above it


def test_truncation_offsets_for_each_leader_answer(make):
    p = follower_with(make, (3, 1), (3, 2))
    p.maybe_update_follower_hw(2)
    assert p.offset_for_truncation(2, 5) == 5  # same latest epoch: the leader's end
    assert p.offset_for_truncation(1, 10) == 3  # ours ends first
    assert p.offset_for_truncation(-1, -1) == 2  # leader knows none of ours: keep the HW


def test_truncating_inside_a_batch_keeps_the_hw_at_or_below_the_leo(make):
    p = follower_with(make, (4, 1), (4, 2))
    p.maybe_update_follower_hw(8)
    p.truncate_to(6)  # inside the second batch: it goes whole
    assert p.log_end_offset == 4
    assert p.high_watermark == 4
    assert p.epoch_cache.entries == [(1, 0)]


def test_truncate_fully_restarts_log_epochs_and_hw_at_the_leaders_start(make):
    p = follower_with(make, (3, 1))
    p.truncate_fully_and_start_at(50)
    assert (p.log.log_start_offset, p.log_end_offset, p.high_watermark) == (50, 50, 50)
    assert p.latest_epoch == -1
    p.append_records_to_follower(batch(2, base_offset=50, epoch=7))
    assert p.epoch_cache.entries == [(7, 50)]


def test_available_bytes_says_when_a_delayed_fetch_must_answer(make):
    p = leader(make, isr=[0])
    p.append_records_to_leader(batch(3), 1)
    assert p.available_bytes(3, for_follower=False, wanted=1) == 0  # at the HW: wait
    assert p.available_bytes(0, for_follower=False, wanted=1) == 1  # no I/O for one byte
    assert p.available_bytes(0, for_follower=False, wanted=10_000) == len(batch(3))
    assert p.available_bytes(9, for_follower=True, wanted=1) == -1  # past the LEO
