"""The idempotent producer on the broker: sequence checks, duplicates, and state rebuilt
from the log and from snapshots (KIP-98, KIP-360; broker/storage/producer_state.py)."""

from __future__ import annotations

import zlib
from pathlib import Path

import msgpack
import pytest
import structlog

from minibroker.broker.storage import Log, LogConfig
from minibroker.broker.storage.producer_state import BATCHES_TO_RETAIN, ProducerStateManager
from minibroker.protocol import encode_batch, increment_sequence, iter_batches, read_records
from minibroker.protocol.batch import (
    DERIVED_PRODUCER_ID_BASE,
    MAX_SEQUENCE,
    producer_fields,
    restamp_producer,
)
from minibroker.protocol.errors import InvalidProducerEpoch, InvalidRecord, OutOfOrderSequenceNumber

PID = 7


def batch(seq: int, count: int = 2, *, pid: int = PID, epoch: int = 0, tag: str = "v") -> bytes:
    rows = [(1000 + i, None, f"{tag}{seq + i}".encode(), []) for i in range(count)]
    return encode_batch(rows, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def open_log(path: Path, **config) -> Log:
    return Log.open(path, LogConfig(**config), now_ms=lambda: 10_000)


def values(log: Log) -> list[bytes]:
    """Every record's value, across segments (one read stops at a segment's end)."""
    out: list[bytes] = []
    while len(out) < log.log_end_offset:
        out += [r.value for r in read_records(log.read(len(out), 1 << 24).data)]
    return out


# --- the batch format ----------------------------------------------------------------------


def test_producer_fields_travel_inside_the_crc_and_decode_with_the_records() -> None:
    data = batch(5, 3, epoch=2)
    ((pos, header),) = iter_batches(data)
    assert producer_fields(data, pos, header) == (PID, 2, 5)
    assert [r.value for r in read_records(data)] == [b"v5", b"v6", b"v7"]
    plain = encode_batch([(1, None, b"x", [])])
    ((pos, header),) = iter_batches(plain)
    assert producer_fields(plain, pos, header) is None
    buf = bytearray(data)
    restamp_producer(buf, PID, 3, 0)
    ((pos, header),) = iter_batches(bytes(buf))  # verify=True: the new CRC holds
    assert producer_fields(buf, pos, header) == (PID, 3, 0)


def test_sequences_wrap_to_zero_after_int32_max() -> None:
    assert increment_sequence(5, 3) == 8
    assert increment_sequence(MAX_SEQUENCE, 1) == 0
    assert increment_sequence(MAX_SEQUENCE - 1, 3) == 1


# --- the leader's checks -------------------------------------------------------------------


def test_an_exact_retry_is_answered_with_its_original_offsets_and_not_stored(tmp_path) -> None:
    log = open_log(tmp_path)
    first = log.append_as_leader(batch(0), 0)
    second = log.append_as_leader(batch(2), 0)
    retry = log.append_as_leader(batch(0), 0)
    assert retry.duplicate
    assert (retry.first_offset, retry.last_offset) == (first.first_offset, first.last_offset)
    assert log.log_end_offset == second.last_offset + 1 == 4
    assert values(log) == [b"v0", b"v1", b"v2", b"v3"]


def test_a_gap_is_out_of_order_and_writes_nothing(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(0), 0)
    with pytest.raises(OutOfOrderSequenceNumber, match="sequence 5 does not follow 1"):
        log.append_as_leader(batch(5), 0)
    assert log.log_end_offset == 2


def test_an_older_epoch_is_fenced_and_a_new_epoch_must_start_at_zero(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(0, epoch=3), 0)
    with pytest.raises(InvalidProducerEpoch, match="epoch 2 is older than the current 3"):
        log.append_as_leader(batch(2, epoch=2), 0)
    with pytest.raises(OutOfOrderSequenceNumber, match="new epoch 4 must start at sequence 0"):
        log.append_as_leader(batch(2, epoch=4), 0)
    log.append_as_leader(batch(0, epoch=4), 0)
    assert log.log_end_offset == 4


def test_an_unknown_producer_may_start_anywhere(tmp_path) -> None:
    """KIP-360: state lost to expiry or retention must not wedge a producer."""
    log = open_log(tmp_path)
    log.append_as_leader(batch(41), 0)
    log.append_as_leader(batch(43), 0)
    assert log.log_end_offset == 4


def test_only_the_last_five_batches_are_recognised_as_duplicates() -> None:
    state = ProducerStateManager(Path("/nonexistent"), structlog.get_logger())
    for i in range(BATCHES_TO_RETAIN + 1):
        state.update(PID, 0, i * 2, 2, i * 2, 1000)
    newest = state.check(PID, 0, BATCHES_TO_RETAIN * 2, 2)
    assert newest is not None and newest.first_offset == BATCHES_TO_RETAIN * 2
    assert state.check(PID, 0, 2, 2) is not None  # the oldest of the five kept
    # Fell out of the window: still a duplicate (the epoch stored every sequence from 0),
    # but its offsets are gone; it is acknowledged once the HW passes the window's start.
    older = state.check(PID, 0, 0, 2)
    assert (older.first_offset, older.last_offset) == (-1, 1)


def test_a_duplicate_older_than_the_window_is_not_stored_again(tmp_path) -> None:
    """A deterministic writer replaying its stream from sequence 0 (the Spark sink)."""
    log = open_log(tmp_path, segment_bytes=300)
    for seq in range(0, 20, 2):
        log.append_as_leader(batch(seq), 0)
    for seq in range(0, 20, 2):  # the whole replay, in window and before it
        assert log.append_as_leader(batch(seq), 0).duplicate
    log.append_as_leader(batch(20), 0)
    assert values(log) == [f"v{i}".encode() for i in range(22)]
    log.close()  # the snapshot keeps where the epoch started
    reopened = open_log(tmp_path, segment_bytes=300)
    assert reopened.append_as_leader(batch(4), 0).duplicate
    with pytest.raises(OutOfOrderSequenceNumber):  # straddles the end: not a duplicate
        reopened.append_as_leader(batch(21), 0)


def test_below_where_the_epoch_started_is_out_of_order_not_a_duplicate(tmp_path) -> None:
    """An unknown producer may start anywhere (KIP-360); what came before its first stored
    batch was never seen here, so it must not be acknowledged as stored."""
    log = open_log(tmp_path)
    log.append_as_leader(batch(40), 0)
    log.append_as_leader(batch(42), 0)
    with pytest.raises(OutOfOrderSequenceNumber):
        log.append_as_leader(batch(38), 0)
    log.append_as_leader(batch(0, epoch=1), 0)  # a new epoch: the old one's range is over
    with pytest.raises(InvalidProducerEpoch):
        log.append_as_leader(batch(40), 0)


def test_a_derived_producer_id_must_start_at_sequence_zero(tmp_path) -> None:
    """Else a replay could find its lost first batch skipped as a duplicate."""
    derived = DERIVED_PRODUCER_ID_BASE + 12345
    log = open_log(tmp_path)
    with pytest.raises(OutOfOrderSequenceNumber, match="sequence 0"):
        log.append_as_leader(batch(2, pid=derived), 0)
    log.append_as_leader(batch(0, pid=derived), 0)
    log.append_as_leader(batch(2, pid=derived), 0)
    assert log.log_end_offset == 4


def test_sequence_wrap_around_is_in_order(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(MAX_SEQUENCE - 1, 2), 0)
    log.append_as_leader(batch(0, 2), 0)
    assert log.log_end_offset == 4


def test_an_idempotent_produce_must_be_one_batch(tmp_path) -> None:
    log = open_log(tmp_path)
    with pytest.raises(InvalidRecord, match="exactly one batch"):
        log.append_as_leader(batch(0) + batch(2), 0)
    assert log.log_end_offset == 0


def test_followers_learn_producers_from_what_they_copy(tmp_path) -> None:
    leader = open_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    leader.append_as_leader(batch(0), 0)
    follower.append_as_follower(leader.read(0, 1 << 20).data)
    assert follower.append_as_leader(batch(0), 1).duplicate  # a new leader after failover


def test_expired_producers_are_forgotten() -> None:
    state = ProducerStateManager(Path("/nonexistent"), structlog.get_logger())
    state.update(PID, 0, 0, 1, 0, timestamp=1_000)
    state.update(PID + 1, 0, 0, 1, 1, timestamp=5_000)
    assert state.remove_expired(now_ms=6_000, expiration_ms=4_000) == 1
    assert list(state.producers) == [PID + 1]


# --- rebuilt from the log and from snapshots -------------------------------------------------


def test_state_is_rebuilt_from_the_log_after_a_crash(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(0), 0)
    log.append_as_leader(batch(2), 0)
    log.flush()  # no close: no snapshot, as after a crash
    reopened = open_log(tmp_path)
    assert not list(tmp_path.glob("*.snapshot"))
    assert reopened.append_as_leader(batch(2), 0).duplicate
    with pytest.raises(OutOfOrderSequenceNumber):
        reopened.append_as_leader(batch(9), 0)


def test_state_comes_from_the_snapshot_and_the_batches_after_it(tmp_path) -> None:
    log = open_log(tmp_path, segment_bytes=200)
    for seq in range(0, 20, 2):
        log.append_as_leader(batch(seq), 0)  # small segments: several rolls, snapshots
    log.close()
    snapshots = sorted(tmp_path.glob("*.snapshot"))
    assert snapshots and snapshots[-1].name == f"{20:020d}.snapshot"
    reopened = open_log(tmp_path, segment_bytes=200)
    assert reopened.append_as_leader(batch(18), 0).duplicate
    reopened.append_as_leader(batch(20), 0)
    reopened.flush()
    # A crash after more appends: the newest snapshot plus a replay of the tail.
    again = open_log(tmp_path, segment_bytes=200)
    assert again.append_as_leader(batch(20), 0).duplicate


def test_a_corrupt_snapshot_is_skipped_and_the_log_replayed(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(0), 0)
    log.close()
    (snapshot,) = tmp_path.glob("*.snapshot")
    snapshot.write_bytes(b"\x00garbage")
    reopened = open_log(tmp_path)
    assert reopened.append_as_leader(batch(0), 0).duplicate


def test_truncation_forgets_the_batches_it_removed(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(0), 0)
    log.append_as_leader(batch(2), 0)
    log.close()
    log = open_log(tmp_path)
    log.truncate_to(2)  # a follower cut back to the new leader's log
    assert not list(tmp_path.glob(f"{4:020d}.snapshot"))
    # The removed batch is not a duplicate any more: the retry of it is stored again.
    retry = log.append_as_leader(batch(2), 0)
    assert not retry.duplicate and retry.first_offset == 2


def test_a_version_1_snapshot_still_loads(tmp_path) -> None:
    """Written before epoch_first_seq existed: the window's oldest sequence stands in."""
    body = msgpack.packb([1, 4, [[PID, 0, 1000, [[0, 1, 0, 1], [2, 3, 2, 3]]]]])
    path = tmp_path / f"{4:020d}.snapshot"
    path.write_bytes(zlib.crc32(body).to_bytes(4, "big") + body)
    state = ProducerStateManager(tmp_path, structlog.get_logger())
    assert state.load_latest(4) == 4
    assert state.check(PID, 0, 2, 2).first_offset == 2  # in the window
    assert state.check(PID, 0, 4, 2) is None  # next in sequence
    assert state.producers[PID].epoch_first_seq == 0
