"""The time index (Kafka's .timeindex) and DeleteRecords' log start offset, on real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from minibroker.broker.storage.start_offset import read_start_offset
from minibroker.protocol.errors import OffsetOutOfRange
from tests.unit.test_storage import batch, open_log, read_all, vals
from tests.unit.test_time_index import time_entries


def test_every_record_of_a_big_batch_is_found_by_its_own_time(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(vals(5), ts=10), 0)  # offsets 0-4
    log.append_as_leader(batch(vals(1000), ts=1000), 0)  # offsets 5-1004, ts 1000..1999
    for i in range(1000):
        assert log.offset_for_timestamp(1000 + i) == (5 + i, 1000 + i)
    assert log.offset_for_timestamp(2000) is None


def test_the_time_index_is_sparse_and_a_lookup_reads_one_batchs_records(
    tmp_path: Path, monkeypatch
) -> None:
    log = open_log(tmp_path, index_interval_bytes=256)
    for i in range(200):
        log.append_as_leader(batch(vals(3, f"{i}-", size=40), ts=1000 + 10 * i), 0)
    log.flush()
    segment = log.active
    entries = time_entries(segment.time_path)
    assert 1 < len(entries) < 200  # sparse: an entry every 256 bytes
    # A late time starts near its batch, not at the segment's start.
    late = segment.time_lookup(1000 + 10 * 190)
    assert late > segment.size // 2
    log_reads: list[int] = []
    real = os.pread
    monkeypatch.setattr(
        os,
        "pread",
        lambda fd, n, at: (fd == segment.fd and log_reads.append(n)) or real(fd, n, at),
    )
    assert log.offset_for_timestamp(1000 + 10 * 190 + 1) == (190 * 3 + 1, 1000 + 10 * 190 + 1)
    assert len(log_reads) == 2  # the headers from the index position, then the one batch
    monkeypatch.undo()
    # Reopened: checked against the header scan, the same file and the same answers.
    log.close()
    log = open_log(tmp_path, index_interval_bytes=256)
    assert time_entries(log.active.time_path) == entries
    assert log.offset_for_timestamp(1000 + 10 * 57 + 2) == (57 * 3 + 2, 1000 + 10 * 57 + 2)


def test_out_of_order_timestamps_answer_the_first_record_in_offset_order(tmp_path: Path) -> None:
    log = open_log(tmp_path, index_interval_bytes=1)
    log.append_as_leader(batch(vals(3), ts=500), 0)  # 0-2: 500..502
    log.append_as_leader(batch(vals(3), ts=100), 0)  # 3-5: 100..102 (older, later offsets)
    log.append_as_leader(batch(vals(3), ts=900), 0)  # 6-8
    assert log.offset_for_timestamp(101) == (0, 500)
    assert log.offset_for_timestamp(501) == (1, 501)
    assert log.offset_for_timestamp(600) == (6, 900)


def test_delete_records_moves_the_start_and_a_restart_keeps_it(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=1)  # a segment per batch
    for i in range(4):
        log.append_as_leader(batch(vals(5, f"{i}-"), ts=100 * i), 0)  # 0-4, 5-9, 10-14, 15-19
    assert log.delete_records_before(7) == 1  # the first segment goes, the start mid-segment
    assert log.log_start_offset == 7 and read_start_offset(tmp_path) == 7
    with pytest.raises(OffsetOutOfRange):
        log.read(6, 1000)
    assert read_all(log)[0][0] == 7
    assert log.offset_for_timestamp(0) == (7, 102)  # never a record below the start
    assert log.delete_records_before(3) == 0 and log.log_start_offset == 7  # never back
    with pytest.raises(OffsetOutOfRange):
        log.delete_records_before(21)
    log.close()
    log = open_log(tmp_path, segment_bytes=1)
    assert log.log_start_offset == 7
    # Truncated below the start (a follower's divergence): the checkpoint follows it down,
    # so growing back past it later does not resurrect the old start on the next open.
    log.truncate_to(6)
    assert log.log_start_offset == 5 and read_start_offset(tmp_path) == 5
    log.close()
    assert open_log(tmp_path, segment_bytes=1).log_start_offset == 5


def test_max_timestamp_is_the_first_record_with_the_largest_time_below_the_bound(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path, segment_bytes=1)  # a segment per batch
    assert log.max_timestamp_offset(10) is None
    log.append_as_leader(batch(vals(3), ts=100), 0)  # 0-2: 100..102
    log.append_as_leader(batch(vals(3), ts=500), 0)  # 3-5: 500..502 (the largest: 5)
    log.append_as_leader(batch(vals(3), ts=200), 0)  # 6-8
    log.append_as_leader(batch(vals(3), ts=500), 0)  # 9-11: 502 again at 11, later: not it
    assert log.max_timestamp_offset(12) == (5, 502)
    assert log.max_timestamp_offset(6) == (5, 502)  # the bound is past it: answered


def test_max_timestamp_above_the_bound_answers_nothing_as_kafka_does(tmp_path: Path) -> None:
    """Kafka's MAX_TIMESTAMP finds the largest time over the whole log and answers -1 when
    its record is not fetchable yet (ReplicaManager: offset >= the HW, or the LSO), never
    an older record below the bound: here neither when that record is in a segment wholly
    above the bound nor when it is in the one the bound cuts."""
    log = open_log(tmp_path, segment_bytes=1)  # a segment per batch
    log.append_as_leader(batch(vals(3), ts=100), 0)  # 0-2
    log.append_as_leader(batch(vals(3), ts=900), 0)  # 3-5: the largest, 902 at 5
    log.append_as_leader(batch(vals(3), ts=300), 0)  # 6-8
    for bound in (0, 3, 4, 5):  # segments wholly above, or the bound inside the batch
        assert log.max_timestamp_offset(bound) is None, bound
    assert log.max_timestamp_offset(6) == (5, 902)  # the HW moved past it
    # Newer data with a later time, above the bound: nothing again until it is fetchable.
    log.append_as_leader(batch(vals(3), ts=1000), 0)  # 9-11
    assert log.max_timestamp_offset(9) is None
    assert log.max_timestamp_offset(12) == (11, 1002)
