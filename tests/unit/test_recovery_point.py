"""A roll's fsync off the caller's thread, the recovery point it moves, and recovery from it.

Kafka's roll schedules the sealed segment's flush on a background thread and moves the
log's recovery point when it ends; after an unclean shutdown only segments reaching above
the checkpointed point are validated batch by batch (storage/flusher.py, Log._load).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from minibroker.broker.metadata.image import PartitionState
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.broker.storage import Log, LogConfig, flusher
from minibroker.broker.storage.offset_checkpoint import (
    RECOVERY_POINT_FILE,
    CorruptCheckpoint,
    read_checkpoint,
    write_checkpoint,
)
from minibroker.protocol import encode_batch
from tests.unit.replica_helpers import manual_replica_manager


def batch(tag: str, **producer: int) -> bytes:
    return encode_batch([(1000 + i, None, f"{tag}{i}".encode(), []) for i in range(3)], **producer)


def open_log(path: Path, recovery_point: int | None = None) -> Log:
    # segment.bytes=1: every batch after the first rolls (bases 0, 3, 6, ...)
    return Log.open(
        path, LogConfig(segment_bytes=1), now_ms=lambda: 1_000_000, recovery_point=recovery_point
    )


@pytest.fixture
def held_flusher():
    """The flusher thread kept busy until the test releases it: flushes queue behind."""
    release = threading.Event()
    flusher.FLUSHER.submit(release.wait)
    yield release
    release.set()


def test_a_roll_fsyncs_the_sealed_segment_in_the_flusher_thread(tmp_path: Path, monkeypatch):
    fsyncs: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def observed(fd: int) -> None:
        fsyncs.append((threading.current_thread().name, os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    idempotent = {"producer_id": 7, "producer_epoch": 0}
    log = open_log(tmp_path)
    log.append_as_leader(batch("a", **idempotent, base_sequence=0), 0)
    monkeypatch.setattr(os, "fsync", observed)
    log.append_as_leader(batch("b", **idempotent, base_sequence=3), 0)  # rolls segment 0
    log.recovery.wait()
    me = threading.current_thread().name
    assert [path for thread, path in fsyncs if thread == me] == []
    by_flusher = {path for thread, path in fsyncs if thread.startswith("segment-flush")}
    # The sealed segment's files, the producer snapshot taken at the roll, the directory.
    wanted = [f"{0:020d}.log", f"{0:020d}.index", f"{3:020d}.snapshot"]
    assert {str(tmp_path / name) for name in wanted} | {str(tmp_path)} <= by_flusher
    assert log.recovery_point == 3
    log.close()


def test_the_recovery_point_moves_when_the_flush_ends(tmp_path: Path, held_flusher) -> None:
    log = open_log(tmp_path)
    for tag in "abc":
        log.append_as_leader(batch(tag), 0)  # two rolls: flushes up to 3, then to 6
    assert [s.base_offset for s in log.segments] == [0, 3, 6]
    assert log.recovery_point == 0  # both flushes wait behind the held thread
    held_flusher.set()
    assert log.recovery.wait() == 6
    log.close()
    assert log.recovery_point == 9  # close flushes the active segment too


def test_a_truncation_lowers_the_recovery_point(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for tag in "abcd":
        log.append_as_leader(batch(tag), 0)
    assert log.recovery.wait() == 9
    log.truncate_to(4)  # inside segment 3: its batch goes whole
    assert log.log_end_offset == 3 and log.recovery_point == 3
    log.truncate_fully_and_start_at(20)
    assert log.recovery_point == 20
    log.close()


def test_a_flush_in_flight_does_not_cover_what_a_truncation_removed(
    tmp_path: Path, held_flusher
) -> None:
    log = open_log(tmp_path)
    for tag in "abc":
        log.append_as_leader(batch(tag), 0)  # flushes to 3 and 6 queued
    log.truncate_to(3)  # segments 3 and 6 go while their flushes wait
    log.append_as_leader(batch("x"), 0)  # new bytes at 3..5, in segment 3 again
    held_flusher.set()
    assert log.recovery.wait() == 3  # not 6: offsets 3..5 were rewritten after that flush
    log.append_as_leader(batch("y"), 0)  # rolls segment 3 (the rewritten one)
    assert log.recovery.wait() == 6
    log.close()


def test_a_log_deleted_with_flushes_in_flight(tmp_path: Path, held_flusher) -> None:
    log = open_log(tmp_path / "p-0")
    for tag in "abc":
        log.append_as_leader(batch(tag), 0)
    log.delete_records_before(6)  # segments 0 and 3 deleted: their flushes find no files
    assert [s.base_offset for s in log.segments] == [6]
    held_flusher.set()
    assert log.recovery.wait() == 6
    log.close()


def _four_segments_with_a_bad_crc_in_segment_3(path: Path) -> None:
    log = open_log(path)
    for tag in "abcd":
        log.append_as_leader(batch(tag), 0)  # bases 0, 3, 6, 9
    log.close()
    raw = bytearray((path / f"{3:020d}.log").read_bytes())
    raw[-2] ^= 0x40  # a record's byte: the header walk passes, the CRC does not
    (path / f"{3:020d}.log").write_bytes(bytes(raw))


def test_unclean_recovery_validates_segments_above_the_recovery_point(tmp_path: Path) -> None:
    _four_segments_with_a_bad_crc_in_segment_3(tmp_path)
    log = open_log(tmp_path, recovery_point=3)  # segment 3 was not known to be on disk
    assert log.log_end_offset == 3  # cut at the bad batch; 6 and 9 quarantined
    assert [s.base_offset for s in log.segments] == [0, 3]
    assert log.recovery_point == 3
    log.close()


@pytest.mark.parametrize("recovery_point", [6, None], ids=["below-the-point", "clean"])
def test_segments_below_the_recovery_point_are_not_rescanned(
    tmp_path: Path, recovery_point: int | None
) -> None:
    _four_segments_with_a_bad_crc_in_segment_3(tmp_path)
    log = open_log(tmp_path, recovery_point=recovery_point)
    assert log.log_end_offset == 12  # segment 3 trusted: its CRCs are not read
    assert log.recovery_point == (12 if recovery_point is None else 6)
    log.close()


def test_the_first_flush_after_unclean_recovery_covers_the_recovered_segments(
    tmp_path: Path,
) -> None:
    _four_segments_with_a_bad_crc_in_segment_3(tmp_path)
    log = open_log(tmp_path, recovery_point=6)
    assert log.recovery_point == 6
    log.append_as_leader(batch("e"), 0)  # rolls 9: its flush covers 6 (recovered) too
    assert log.recovery.wait() == 12
    log.close()


# --- the recovery-point-offset-checkpoint file -------------------------------------------


def test_the_checkpoint_file_round_trips_in_kafkas_format(tmp_path: Path) -> None:
    path = tmp_path / RECOVERY_POINT_FILE
    assert read_checkpoint(path) == {}  # none yet
    offsets = {("orders", 0): 1200, ("orders", 11): 0, ("a.b-c_d", 3): 2**40}
    write_checkpoint(path, offsets)
    assert path.read_text().splitlines()[:3] == ["0", "3", "orders 0 1200"]
    assert read_checkpoint(path) == offsets


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "malformed"),
        ("0\n2\nt 0 5\n", "expected 2 entries, found 1"),
        ("1\n0\n", "unrecognised version 1"),
        ("0\n1\nt zero 5\n", "malformed"),
        ("0\n1\nt 0\n", "malformed"),
        (b"\xff\xfe", "cannot read it"),
    ],
)
def test_a_corrupt_checkpoint_file_is_refused_with_the_reason(
    tmp_path: Path, text: str | bytes, why: str
) -> None:
    path = tmp_path / RECOVERY_POINT_FILE
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(CorruptCheckpoint, match=why) as caught:
        read_checkpoint(path)
    assert str(path) in str(caught.value)


def _host(manager: ReplicaManager, index: int) -> Log:
    state = PartitionState(0, 1, [0], [0], 1)
    return manager.host_partition("t", index, state).log


def test_a_clean_close_checkpoints_every_log_at_its_end(tmp_path: Path) -> None:
    manager = manual_replica_manager(tmp_path)
    manager.load_recovery_points(clean_shutdown=False)  # a first start: no file yet
    assert manager.recovery_points == {}
    for index in (0, 1):
        log = _host(manager, index)
        for tag in "ab"[: index + 1]:
            log.append_as_leader(batch(tag), 1)
    manager.close()
    assert read_checkpoint(tmp_path / RECOVERY_POINT_FILE) == {("t", 0): 3, ("t", 1): 6}


def test_an_unclean_start_recovers_from_the_checkpoint_or_from_0_when_it_is_corrupt(
    tmp_path: Path,
) -> None:
    manager = manual_replica_manager(tmp_path)
    manager.load_recovery_points(clean_shutdown=True)
    _host(manager, 0).append_as_leader(batch("a"), 1)
    manager.close()
    manager = manual_replica_manager(tmp_path)
    manager.load_recovery_points(clean_shutdown=False)
    assert manager.recovery_points == {("t", 0): 3}
    assert _host(manager, 0).recovery_point == 3
    manager.close()
    (tmp_path / RECOVERY_POINT_FILE).write_text("0\n7\n")
    manager = manual_replica_manager(tmp_path)
    manager.load_recovery_points(clean_shutdown=False)
    assert manager.recovery_points == {}  # Kafka: reset to 0, every segment recovered
    assert _host(manager, 0).recovery_point == 0
    manager.close()


def test_a_follower_truncation_checkpoints_the_lowered_point_at_once(tmp_path: Path) -> None:
    manager = manual_replica_manager(tmp_path)
    manager.topic_configs["t"] = {"internal.segment.bytes": "14"}  # a batch a segment
    log = _host(manager, 0)
    for tag in "abcd":
        log.append_as_leader(batch(tag), 1)
    assert log.recovery.wait() == 9
    manager.checkpoint_recovery_points()
    assert read_checkpoint(tmp_path / RECOVERY_POINT_FILE) == {("t", 0): 9}
    periodic = manager.take_recovery_checkpoint()  # the periodic task's, taken at 9 ...
    manager.partitions[("t", 0)].truncate_to(4)  # a follower finding its log diverged
    # A crash now, before the periodic write, must not trust segment 3's next bytes.
    assert read_checkpoint(tmp_path / RECOVERY_POINT_FILE) == {("t", 0): 3}
    periodic()  # ... and written by its worker thread after the truncation's: a no-op
    assert read_checkpoint(tmp_path / RECOVERY_POINT_FILE) == {("t", 0): 3}
    manager.partitions[("t", 0)].truncate_fully_and_start_at(0)
    assert read_checkpoint(tmp_path / RECOVERY_POINT_FILE) == {("t", 0): 0}
    manager.close()
