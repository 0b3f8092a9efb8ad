"""The partition side of transactions (KIP-98): open transactions in producer state, markers,
the last stable offset and the aborted-transactions index (broker/storage/producer_state.py,
txn_index.py, log.py), through appends, follower copies, restarts and truncation."""

from __future__ import annotations

from pathlib import Path

import pytest

from minibroker.broker.storage import Log, LogConfig
from minibroker.broker.storage.txn_index import ENTRY_SIZE, AbortedTxn, index_path
from minibroker.protocol import encode_batch, iter_batches, read_records
from minibroker.protocol.batch import (
    CONTROL_FLAG,
    TRANSACTIONAL_FLAG,
    encode_control_batch,
    read_control_batch,
    unwrap_kafka_batch,
)
from minibroker.protocol.errors import (
    InvalidProducerEpoch,
    InvalidRecord,
    InvalidTxnState,
    TransactionCoordinatorFenced,
)
from minibroker.protocol.kafka import records as kafka_records

P1, P2 = 11, 12


class Clock:
    """The log's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 10_000

    def __call__(self) -> int:
        return self.now


def txn_batch(pid: int, seq: int, count: int = 2, *, epoch: int = 0, tag: str = "t") -> bytes:
    rows = [(1000 + i, None, f"{tag}{pid}-{seq + i}".encode(), []) for i in range(count)]
    return encode_batch(
        rows,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        attributes=TRANSACTIONAL_FLAG,
    )


def plain(tag: str) -> bytes:
    return encode_batch([(1000, None, tag.encode(), [])])


def open_log(path: Path, clock: Clock | None = None, **config) -> Log:
    return Log.open(path, LogConfig(**config), now_ms=clock or Clock())


def test_a_transactional_batch_opens_a_transaction_that_holds_the_lso(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(plain("a"), 0)  # offset 0
    log.append_as_leader(txn_batch(P1, 0), 0)  # offsets 1-2
    log.append_as_leader(plain("b"), 0)  # offset 3
    assert log.producers.ongoing == {P1: 1}
    assert log.last_stable_offset(high_watermark=4) == 1
    assert log.last_stable_offset(high_watermark=1) == 1
    assert log.last_stable_offset(high_watermark=0) == 0  # never above the HW
    info = log.append_marker(P1, 0, 0, True, 0)  # commit at offset 4
    assert info.first_offset == 4
    # Decided, but the marker is not under the HW yet: the LSO still waits for it.
    assert log.last_stable_offset(high_watermark=4) == 1
    assert log.last_stable_offset(high_watermark=5) == 5
    assert log.producers.ongoing == {}
    assert len(log.txn_index) == 0  # a commit is not indexed


def test_the_lso_is_the_oldest_of_several_open_transactions(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(P1, 0), 0)  # 0-1
    log.append_as_leader(txn_batch(P2, 0), 0)  # 2-3
    log.append_as_leader(txn_batch(P1, 2), 0)  # 4-5: same transaction
    assert log.last_stable_offset(6) == 0
    log.append_marker(P1, 0, 0, False, 0)  # 6: abort P1
    assert log.last_stable_offset(7) == 2  # P2 still open
    # The abort's index entry records the LSO of that moment (P2's first offset).
    assert log.txn_index.entries == [AbortedTxn(P1, 0, 6, 2)]
    log.append_marker(P2, 0, 0, True, 0)  # 7
    assert log.last_stable_offset(8) == 8


def test_aborted_transactions_are_collected_for_the_range_read(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(P1, 0), 0)  # 0-1
    log.append_marker(P1, 0, 0, False, 0)  # 2
    log.append_as_leader(plain("x"), 0)  # 3
    log.append_as_leader(txn_batch(P2, 0), 0)  # 4-5
    log.append_marker(P2, 0, 0, False, 0)  # 6
    assert log.collect_aborted(0, 7) == [(P1, 0), (P2, 4)]
    assert log.collect_aborted(3, 7) == [(P2, 4)]  # P1's ended before
    assert log.collect_aborted(0, 3) == [(P1, 0)]  # P1's entry's LSO (3) ends the search
    assert log.collect_aborted(7, 8) == []


def test_epoch_fencing_of_transactional_batches_and_markers(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(P1, 0, epoch=3), 0)
    # The coordinator fences the producer: an abort with the bumped epoch.
    log.append_marker(P1, 4, 0, False, 0)
    end = log.log_end_offset
    with pytest.raises(InvalidProducerEpoch):
        log.append_as_leader(txn_batch(P1, 2, epoch=3), 0)  # the zombie
    with pytest.raises(InvalidProducerEpoch):
        log.append_marker(P1, 3, 0, True, 0)
    assert log.log_end_offset == end  # nothing written
    log.append_as_leader(txn_batch(P1, 0, epoch=4), 0)  # the new incarnation
    assert log.producers.ongoing == {P1: end}


def test_a_marker_from_an_older_coordinator_is_fenced(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(P1, 0), 0)
    log.append_marker(P1, 0, 5, True, 0)
    with pytest.raises(TransactionCoordinatorFenced):
        log.append_marker(P1, 0, 4, True, 0)
    log.append_marker(P1, 0, 5, True, 0)  # a retry from the same coordinator is fine


def test_a_producer_inside_a_transaction_must_write_transactionally(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(P1, 0), 0)
    plain_idempotent = encode_batch(
        [(1000, None, b"x", [])], producer_id=P1, producer_epoch=0, base_sequence=2
    )
    with pytest.raises(InvalidTxnState):
        log.append_as_leader(plain_idempotent, 0)


def test_clients_may_not_write_control_batches(tmp_path) -> None:
    log = open_log(tmp_path)
    marker = encode_control_batch(True, 0, producer_id=P1, producer_epoch=0, timestamp=1)
    with pytest.raises(InvalidRecord, match="control"):
        log.append_as_leader(bytes(marker), 0)
    keyless_txn = encode_batch([(1000, None, b"x", [])], attributes=TRANSACTIONAL_FLAG)
    with pytest.raises(InvalidRecord, match="producer"):
        log.append_as_leader(keyless_txn, 0)


def test_a_marker_is_a_kafka_v2_control_batch(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(P1, 0), 0)
    log.append_marker(P1, 0, 9, False, 2)
    data = log.read(2, 1 << 20).data
    [(pos, header)] = list(iter_batches(data))
    assert header.attributes & CONTROL_FLAG and header.attributes & TRANSACTIONAL_FLAG
    assert read_control_batch(data, pos, header) == (False, 9)
    v2 = unwrap_kafka_batch(data, pos, header)
    inner = kafka_records.check_batch(v2, 0, len(v2))
    assert inner.attributes & kafka_records.CONTROL_FLAG
    assert (inner.base_offset, inner.producer_id, inner.leader_epoch) == (2, P1, 2)
    assert kafka_records.read_end_txn_marker(v2) == (False, 9)
    assert read_records(data) == []  # a control batch holds no application record


def test_followers_copy_markers_and_learn_the_same_state(tmp_path) -> None:
    leader = open_log(tmp_path / "leader")
    leader.append_as_leader(txn_batch(P1, 0), 0)
    leader.append_as_leader(txn_batch(P2, 0), 0)
    leader.append_marker(P1, 0, 0, False, 0)
    follower = open_log(tmp_path / "follower")
    follower.append_as_follower(leader.read(0, 1 << 20).data)
    assert follower.producers.ongoing == {P2: 2}
    assert follower.txn_index.entries == leader.txn_index.entries
    assert follower.last_stable_offset(5) == 2


def test_a_restart_keeps_open_transactions_and_the_aborted_index(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(P1, 0), 0)  # 0-1
    log.append_marker(P1, 0, 0, False, 0)  # 2
    log.append_as_leader(txn_batch(P2, 0), 0)  # 3-4, left open
    log.close()  # snapshot at the log end
    again = open_log(tmp_path)
    assert again.producers.ongoing == {P2: 3}
    assert again.last_stable_offset(5) == 3
    assert again.txn_index.entries == [AbortedTxn(P1, 0, 2, 3)]
    assert index_path(tmp_path, 0).stat().st_size == ENTRY_SIZE


def test_a_crash_rebuilds_state_and_index_from_the_log(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(P1, 0), 0)
    log.append_as_leader(txn_batch(P2, 0), 0)
    log.append_marker(P1, 0, 0, False, 0)
    log.flush()
    index_path(tmp_path, 0).unlink()  # lost with the crash: not flushed
    for segment in log.segments:
        segment.close()  # no snapshot: a crash
    again = open_log(tmp_path)
    assert again.producers.ongoing == {P2: 2}
    assert again.txn_index.entries == [AbortedTxn(P1, 0, 4, 2)]
    assert index_path(tmp_path, 0).stat().st_size == ENTRY_SIZE  # written again


def test_sealed_segments_keep_their_index_and_lose_it_with_retention(tmp_path) -> None:
    clock = Clock()
    log = open_log(tmp_path, clock, segment_bytes=1, retention_ms=1000)
    log.append_as_leader(txn_batch(P1, 0), 0)  # segment 0
    log.append_marker(P1, 0, 0, False, 0)  # segment 2 (every append rolls)
    log.append_as_leader(plain("x"), 0)  # segment 3
    assert index_path(tmp_path, 2).stat().st_size == ENTRY_SIZE
    log.close()
    again = open_log(tmp_path, clock, segment_bytes=1, retention_ms=1000)
    assert again.txn_index.entries == [AbortedTxn(P1, 0, 2, 3)]
    clock.now += 10**9
    again.delete_old_segments(high_watermark=again.log_end_offset)
    assert not index_path(tmp_path, 2).exists()
    assert again.txn_index.entries == []


def test_truncation_reopens_a_transaction_whose_marker_it_removed(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(P1, 0), 0)  # 0-1
    log.append_marker(P1, 0, 0, False, 0)  # 2
    assert log.producers.ongoing == {}
    log.truncate_to(2)
    assert log.producers.ongoing == {P1: 0}
    assert log.txn_index.entries == []
    assert index_path(tmp_path, 0).stat().st_size == 0


def test_open_transactions_do_not_expire(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(P1, 0), 0)
    log.append_as_leader(
        encode_batch([(1000, None, b"x", [])], producer_id=P2, producer_epoch=0, base_sequence=0),
        0,
    )
    assert log.producers.remove_expired(now_ms=10**12, expiration_ms=1) == 1
    assert set(log.producers.producers) == {P1}


def test_a_follower_forgets_decided_transactions_as_its_hw_passes_their_markers(tmp_path) -> None:
    from minibroker.broker.replication.partition import Partition
    from minibroker.broker.storage.epoch_cache import LeaderEpochCache

    leader = open_log(tmp_path / "leader")
    for seq in range(3):
        leader.append_as_leader(txn_batch(P1, seq * 2), 0)
        leader.append_marker(P1, 0, 0, True, 0)
    follower = Partition("t", 0, open_log(tmp_path / "f"), 1, LeaderEpochCache(tmp_path / "f"))
    follower.append_records_to_follower(leader.read(0, 1 << 20).data)
    assert len(follower.log.producers.unreplicated) == 3
    follower.maybe_update_follower_hw(6)  # past the second marker (offset 5)
    assert list(follower.log.producers.unreplicated) == [(8, 6)]
