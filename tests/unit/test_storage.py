"""Partition log on disk: append/read, roll, retention, recovery, truncation.

Every test works in ``tmp_path`` with an injected clock, so nothing sleeps and the
whole file runs in a few seconds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from minibroker.broker.storage import Log, LogAppendError, LogConfig
from minibroker.broker.storage import log as log_module
from minibroker.broker.storage import segment as segment_module
from minibroker.protocol import check_batch, encode_batch, iter_batches, read_records, unpack_header
from minibroker.protocol.batch import CheckedBatches
from minibroker.protocol.errors import CorruptMessage, MessageTooLarge, OffsetOutOfRange

BIG = 1 << 20


class Clock:
    """A manual millisecond clock, callable like ``now_ms``."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def batch(values: list[bytes], *, ts: int = 1000, base_offset: int = 0, epoch: int = -1) -> bytes:
    """One batch of the given values, timestamps ``ts, ts+1, ...``."""
    rows = [(ts + i, None, v, []) for i, v in enumerate(values)]
    return encode_batch(rows, base_offset=base_offset, leader_epoch=epoch)


def vals(n: int, tag: str = "v", size: int = 0) -> list[bytes]:
    return [f"{tag}{i}".encode().ljust(size, b".") for i in range(n)]


def read_all(log: Log, start: int | None = None) -> list[tuple[int, bytes]]:
    """Every record from ``start`` to the LEO, following next_offset across segments."""
    offset = log.log_start_offset if start is None else start
    out: list[tuple[int, bytes]] = []
    while offset < log.log_end_offset:
        result = log.read(offset, 256)
        assert result.next_offset > offset, "a read below the LEO must make progress"
        out.extend((r.offset, r.value) for r in read_records(result.data, min_offset=offset))
        offset = result.next_offset
    return out


def open_log(path: Path, clock: Clock | None = None, **config: int) -> Log:
    return Log.open(path, LogConfig(**config), now_ms=clock or Clock())


def seg_files(path: Path, suffix: str = ".log") -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.suffix == suffix)


# --- append and read ----------------------------------------------------------------------


def test_append_read_round_trip(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes) == (0, 0, 0)
    log.append_as_leader(batch([b"a", b"b"]), 0)
    log.append_as_leader(batch([b"c"]), 0)
    log.append_as_leader(batch([b"d", b"e", b"f"]), 0)
    assert log.log_end_offset == 6
    result = log.read(0, BIG)
    assert (result.first_offset, result.next_offset) == (0, 6)
    records = read_records(result.data)
    assert [(r.offset, r.value, r.timestamp) for r in records] == [
        (0, b"a", 1000),
        (1, b"b", 1001),
        (2, b"c", 1000),
        (3, b"d", 1000),
        (4, b"e", 1001),
        (5, b"f", 1002),
    ]
    assert log.size_bytes == len(result.data)
    log.close()


def test_leader_assigns_offsets_and_patches_epoch_in_place(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(vals(3)), 4)
    # Client-chosen offsets and epochs are overwritten; two batches in one request.
    request = bytearray(
        batch(vals(2, "x"), base_offset=999, epoch=77) + batch(vals(4, "y"), base_offset=5)
    )
    info = log.append_as_leader(request, 9)
    assert (info.first_offset, info.last_offset, info.record_count) == (3, 8, 6)
    assert info.num_bytes == len(request)
    assert info.max_timestamp == 1003
    data = log.read(3, BIG).data
    headers = [h for _, h in iter_batches(data, verify=True)]  # CRCs still hold
    assert [(h.base_offset, h.leader_epoch, h.record_count) for h in headers] == [
        (3, 9, 2),
        (5, 9, 4),
    ]
    assert [h.leader_epoch for _, h in iter_batches(log.read(0, BIG).data)] == [4, 9, 9]
    assert [r.offset for r in read_records(data)] == list(range(3, 9))


def test_read_offset_inside_a_batch_returns_the_whole_batch(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(vals(5)), 0)
    log.append_as_leader(batch(vals(5, "w")), 0)
    result = log.read(7, BIG)
    assert (result.first_offset, result.next_offset) == (5, 10)
    assert [r.offset for r in read_records(result.data, min_offset=7)] == [7, 8, 9]
    assert log.read(10, BIG).data == b""
    assert log.read(10, BIG).next_offset == 10


def test_read_bounded_by_max_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for i in range(3):
        log.append_as_leader(batch(vals(3, f"b{i}")), 0)  # batches 0-2, 3-5, 6-8
    assert [r.offset for r in read_records(log.read(0, BIG, max_offset=6).data)] == list(range(6))
    assert log.read(0, BIG, max_offset=6).next_offset == 6
    assert log.read(3, BIG, max_offset=3).data == b""
    assert log.read(0, BIG, max_offset=0).data == b""
    # A high watermark inside a batch never exposes records at or above it.
    got = read_records(log.read(0, BIG, max_offset=4).data)
    assert all(r.offset < 4 for r in got)
    assert [r.offset for r in got] == [0, 1, 2]
    assert log.read(3, BIG, max_offset=4).data == b""
    # max_offset above the LEO is clamped to it.
    assert log.read(0, BIG, max_offset=100).next_offset == 9


def test_read_bounded_by_max_bytes_whole_batches_only(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    sizes = []
    for i in range(4):
        b = batch(vals(2, f"b{i}", size=50))
        sizes.append(len(b))
        log.append_as_leader(b, 0)
    two = sizes[0] + sizes[1]
    for max_bytes in (two, two + 1, two + sizes[2] - 1):
        result = log.read(0, max_bytes)
        assert len(result.data) == two
        assert result.next_offset == 4
        assert [r.offset for r in read_records(result.data)] == [0, 1, 2, 3]


def test_min_one_batch_returns_a_batch_larger_than_max_bytes(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    big = batch(vals(3, size=500))
    log.append_as_leader(big, 0)
    log.append_as_leader(batch([b"small"]), 0)
    result = log.read(1, 10)
    assert len(result.data) == len(big)
    assert (result.first_offset, result.next_offset) == (0, 3)
    check_batch(result.data, 0, len(result.data))
    empty = log.read(1, 10, min_one_batch=False)
    assert (empty.data, empty.next_offset) == (b"", 1)
    # min_one_batch never crosses the max_offset bound.
    assert log.read(0, 10, max_offset=2).data == b""


def test_read_out_of_range(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(vals(2)), 0)
    with pytest.raises(OffsetOutOfRange):
        log.read(3, BIG)
    with pytest.raises(OffsetOutOfRange):
        log.read(-1, BIG)
    assert log.read(2, BIG).data == b""


# --- validation ------------------------------------------------------------------------------


def test_oversized_batch_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_message_bytes=200)
    log.append_as_leader(batch([b"ok"]), 0)
    size = log.size_bytes
    with pytest.raises(MessageTooLarge):
        log.append_as_leader(batch([b"x" * 300]), 0)
    # All or nothing: a good batch before the oversized one is not written either.
    with pytest.raises(MessageTooLarge):
        log.append_as_leader(batch([b"fine"]) + batch([b"x" * 300]), 0)
    with pytest.raises(MessageTooLarge):
        log.append_as_follower(batch([b"x" * 300], base_offset=1))
    assert (log.log_end_offset, log.size_bytes) == (1, size)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda b: b[:-1],  # torn
        lambda b: b[:-3] + bytes([b[-3] ^ 0xFF]) + b[-2:],  # CRC mismatch
        lambda b: b[:30] + bytes([b[30] ^ 1]) + b[31:],  # header field under the CRC
        lambda b: b[:8] + (5).to_bytes(4, "big") + b[12:],  # length shorter than a header
        lambda b: b[:8] + (-7).to_bytes(4, "big", signed=True) + b[12:],  # negative length
        lambda b: b"",  # empty record set
        lambda b: b[:5],  # a fragment
        lambda b: b + b"\x00" * 4,  # trailing garbage after a good batch
    ],
)
def test_corrupt_batch_is_refused_and_nothing_is_written(tmp_path: Path, mangle) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch([b"ok"]), 0)
    good = batch([b"x", b"y"], base_offset=1)
    bad = mangle(good)
    with pytest.raises(CorruptMessage):
        log.append_as_leader(bad, 0)
    if bad:
        with pytest.raises(CorruptMessage):
            log.append_as_leader(good + bad, 0)
    with pytest.raises(CorruptMessage):
        log.append_as_follower(bad)
    assert log.log_end_offset == 1
    assert read_all(log) == [(0, b"ok")]


def test_checked_batches_skip_only_the_crc_check(tmp_path: Path) -> None:
    """Batches the broker just wrapped (CheckedBatches) are not CRC'd a second time by the
    leader's append; every other check still applies, and a follower checks the CRC."""
    log = open_log(tmp_path)
    good = batch([b"x", b"y"])
    stale_crc = good[:16] + bytes([good[16] ^ 0xFF]) + good[17:]  # the CRC field is wrong
    with pytest.raises(CorruptMessage, match="CRC"):
        log.append_as_leader(bytearray(stale_crc), 0)
    assert log.append_as_leader(CheckedBatches(stale_crc), 0).record_count == 2
    with pytest.raises(CorruptMessage, match="not record_count - 1"):
        torn = good[:22] + (5).to_bytes(4, "big") + good[26:]  # last_offset_delta
        log.append_as_leader(CheckedBatches(torn), 0)
    with pytest.raises(CorruptMessage, match="CRC"):
        log.append_as_follower(batch([b"z"], base_offset=2)[:-1] + b"\x00")
    assert log.log_end_offset == 2


def test_follower_append_copies_verbatim_and_checks_continuity(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    first = batch(vals(2), base_offset=0, epoch=3)
    log.append_as_follower(first)
    gap = batch(vals(2), base_offset=3, epoch=3)
    overlap = batch(vals(2), base_offset=1, epoch=3)
    for bad in (gap, overlap, batch(vals(1), base_offset=2) + batch(vals(1), base_offset=4)):
        with pytest.raises(LogAppendError):
            log.append_as_follower(bad)
    assert log.log_end_offset == 2
    more = batch(vals(2, "m"), base_offset=2, epoch=4) + batch(vals(1, "n"), base_offset=4)
    info = log.append_as_follower(more)
    assert (info.first_offset, info.last_offset, info.record_count) == (2, 4, 3)
    assert log.read(0, BIG).data == first + more
    gap = batch(vals(2, "g"), base_offset=7, epoch=4)
    with pytest.raises(LogAppendError):
        log.append_as_follower(gap)
    # In a compacted log a gap is the leader's removed records (copied as it is, as Kafka).
    log.close()
    log = Log.open(tmp_path, LogConfig(cleanup_policy="compact"))
    info = log.append_as_follower(gap)
    assert (info.first_offset, log.log_end_offset) == (7, 9)
    assert log.read(5, BIG).data == gap


# --- roll ------------------------------------------------------------------------------------


def test_roll_by_segment_bytes(tmp_path: Path) -> None:
    one = len(batch(vals(2, size=40)))
    log = open_log(tmp_path, segment_bytes=one * 3, index_interval_bytes=1)
    for i in range(10):
        log.append_as_leader(batch(vals(2, f"r{i}-", size=40)), 0)
    assert seg_files(tmp_path) == [f"{b:020d}.log" for b in (0, 6, 12, 18)]
    assert [s.base_offset for s in log.segments] == [0, 6, 12, 18]
    assert all(s.size <= one * 3 for s in log.segments)
    assert log.size_bytes == one * 10
    expected = [(o, f"r{o // 2}-{o % 2}".encode().ljust(40, b".")) for o in range(20)]
    assert read_all(log) == expected
    # Reads exactly at each boundary, and just before it, hit the right segment.
    for base in (6, 12, 18):
        assert log.read(base, BIG).first_offset == base
        assert log.read(base - 1, BIG).first_offset == base - 2
        assert log.read(base - 1, BIG).next_offset == base  # one segment per read


def test_single_batch_larger_than_segment_bytes_gets_its_own_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=100)
    log.append_as_leader(batch([b"x" * 200]), 0)
    log.append_as_leader(batch([b"y" * 200]), 0)
    assert [s.base_offset for s in log.segments] == [0, 1]
    assert read_all(log) == [(0, b"x" * 200), (1, b"y" * 200)]


def test_roll_by_segment_ms(tmp_path: Path) -> None:
    clock = Clock(5_000)
    log = open_log(tmp_path, clock, segment_ms=100)
    log.append_as_leader(batch([b"a"]), 0)
    clock.now += 100
    log.append_as_leader(batch([b"b"]), 0)  # exactly segment_ms old: not yet
    assert len(log.segments) == 1
    clock.now += 1
    log.append_as_leader(batch([b"c"]), 0)
    assert [s.base_offset for s in log.segments] == [0, 2]
    clock.now += 1000  # an idle empty segment is never rolled
    assert len(log.segments) == 2
    log.append_as_leader(batch([b"d"]), 0)
    assert [s.base_offset for s in log.segments] == [0, 2, 3]
    assert [v for _, v in read_all(log)] == [b"a", b"b", b"c", b"d"]


def test_roll_of_an_empty_active_segment_is_a_no_op(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    first = log.roll()
    assert log.roll() is first
    log.append_as_leader(batch([b"a"]), 0)
    log.roll()
    log.roll()
    assert [s.base_offset for s in log.segments] == [0, 1]
    log.append_as_leader(batch([b"b"]), 0)
    assert read_all(log) == [(0, b"a"), (1, b"b")]
    log.close()
    assert read_all(open_log(tmp_path)) == [(0, b"a"), (1, b"b")]


# --- retention ---------------------------------------------------------------------------


def _three_segments(tmp_path: Path, clock: Clock, **config: int) -> tuple[Log, int]:
    one = len(batch(vals(2)))
    log = open_log(tmp_path, clock, segment_bytes=one * 2, **config)
    for i in range(6):  # segments [0-3], [4-7], [8-11] with timestamps 1000*i
        log.append_as_leader(batch(vals(2, f"{i}"), ts=1000 * (i + 1)), 0)
    assert [s.base_offset for s in log.segments] == [0, 4, 8]
    return log, one


def test_retention_by_bytes(tmp_path: Path) -> None:
    clock = Clock()
    log, _ = _three_segments(tmp_path, clock, retention_bytes=0, retention_ms=-1)
    with pytest.raises(OffsetOutOfRange):
        log.read(-1, BIG)
    assert log.delete_old_segments() == 2  # never the active segment
    assert log.log_start_offset == 8
    assert seg_files(tmp_path) == [f"{8:020d}.log"]
    assert seg_files(tmp_path, ".index") == [f"{8:020d}.index"]
    for offset in (0, 4, 7):
        with pytest.raises(OffsetOutOfRange):
            log.read(offset, BIG)
    assert [o for o, _ in read_all(log)] == [8, 9, 10, 11]
    assert log.delete_old_segments() == 0


def test_retention_never_deletes_above_the_high_watermark(tmp_path: Path) -> None:
    log, _ = _three_segments(tmp_path, Clock(), retention_bytes=0, retention_ms=-1)
    assert log.delete_old_segments(high_watermark=3) == 0  # [0-3] holds offset 3 >= HW
    assert log.delete_old_segments(high_watermark=4) == 1  # [0-3] wholly below the HW
    assert log.log_start_offset == 4
    assert log.delete_old_segments(high_watermark=7) == 0
    assert log.delete_old_segments(high_watermark=12) == 1
    assert log.log_start_offset == 8


def test_retention_by_bytes_keeps_what_fits(tmp_path: Path) -> None:
    log, one = _three_segments(tmp_path, Clock(), retention_bytes=1, retention_ms=-1)
    # 6 batches; deleting the oldest segment leaves 4 batches >= 1 byte: delete; then
    # deleting the next would leave 2 >= 1: delete too; active stays.
    assert log.delete_old_segments() == 2
    log2, _ = _three_segments(tmp_path / "b", Clock(), retention_bytes=one * 4, retention_ms=-1)
    assert log2.delete_old_segments() == 1
    assert log2.log_start_offset == 4
    assert log2.size_bytes == one * 4


def test_retention_by_time(tmp_path: Path) -> None:
    clock = Clock(10_000)
    log, _ = _three_segments(tmp_path, clock, retention_ms=5_000)
    # Segment [0-3] has max timestamp 2001, [4-7] 4001, [8-11] 6001.
    clock.now = 2001 + 5_000
    assert log.delete_old_segments() == 0
    clock.now += 1
    assert log.delete_old_segments() == 1
    assert log.log_start_offset == 4
    clock.now = 1_000_000
    assert log.delete_old_segments() == 1  # the active segment stays, however old
    assert log.log_start_offset == 8
    with pytest.raises(OffsetOutOfRange):
        log.read(5, BIG)
    # Appends continue at the LEO; retention survives reopen.
    log.append_as_leader(batch([b"z"]), 0)
    log.close()
    log = open_log(tmp_path, clock)
    assert (log.log_start_offset, log.log_end_offset) == (8, 13)
    assert read_all(log)[-1] == (12, b"z")


# --- recovery ----------------------------------------------------------------------------


def _filled(tmp_path: Path, n: int = 5, **config: int) -> list[bytes]:
    log = open_log(tmp_path, **config)
    sent = [batch(vals(3, f"b{i}-"), ts=100 * i) for i in range(n)]
    for b in sent:
        log.append_as_leader(b, 2)
    log.close()
    return sent


def _active_path(tmp_path: Path) -> Path:
    return tmp_path / seg_files(tmp_path)[-1]


def test_close_and_reopen_keeps_everything(tmp_path: Path) -> None:
    clock = Clock()
    log = open_log(tmp_path, clock, segment_bytes=300, index_interval_bytes=100)
    for i in range(20):
        log.append_as_leader(batch(vals(i % 4 + 1, f"{i}-")), i)
    before = read_all(log)
    state = (log.log_start_offset, log.log_end_offset, log.size_bytes, len(log.segments))
    log.close()
    index_files = {p.name: p.read_bytes() for p in tmp_path.glob("*.index")}
    log = open_log(tmp_path, clock, segment_bytes=300, index_interval_bytes=100)
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes, len(log.segments)) == state
    assert read_all(log) == before
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.index")} == index_files
    assert log.offset_for_timestamp(0) == (0, 1000)
    info = log.append_as_leader(batch([b"more"]), 0)
    assert info.first_offset == state[1]


@pytest.mark.parametrize("cut", [1, 11, 12, 40, 46, 60])
def test_recovery_cuts_a_torn_tail(tmp_path: Path, cut: int) -> None:
    sent = _filled(tmp_path)
    path = _active_path(tmp_path)
    whole = sum(len(b) for b in sent[:4])
    with path.open("r+b") as f:
        f.truncate(whole + cut)
    log = open_log(tmp_path)
    assert log.log_end_offset == 12
    assert path.stat().st_size == whole
    assert [o for o, _ in read_all(log)] == list(range(12))
    info = log.append_as_leader(batch([b"next"]), 3)
    assert info.first_offset == 12
    log.close()
    assert read_all(open_log(tmp_path))[-1] == (12, b"next")


@pytest.mark.parametrize("where", ["payload", "crc", "length", "base_offset", "count"])
def test_recovery_cuts_from_a_corrupt_batch_in_the_middle(tmp_path: Path, where: str) -> None:
    sent = _filled(tmp_path)
    path = _active_path(tmp_path)
    start = sum(len(b) for b in sent[:2])  # batch 2 (offsets 6-8) goes, and all after it
    at = {"payload": len(sent[2]) - 2, "crc": 17, "length": 10, "base_offset": 7, "count": 44}
    raw = bytearray(path.read_bytes())
    raw[start + at[where]] ^= 0x40
    path.write_bytes(bytes(raw))
    log = open_log(tmp_path)
    assert log.log_end_offset == 6
    assert path.stat().st_size == start
    assert read_all(log) == [(o, f"b{o // 3}-{o % 3}".encode()) for o in range(6)]
    assert log.append_as_leader(batch([b"again"]), 3).first_offset == 6
    assert read_all(log)[-1] == (6, b"again")


def test_recovery_of_a_garbage_only_active_segment(tmp_path: Path) -> None:
    (tmp_path / f"{0:020d}.log").write_bytes(os.urandom(5000))
    log = open_log(tmp_path)
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes) == (0, 0, 0)
    log.append_as_leader(batch([b"a"]), 0)
    assert read_all(log) == [(0, b"a")]


def test_recovery_of_a_garbage_only_active_segment_after_good_ones(tmp_path: Path) -> None:
    _filled(tmp_path, n=4, segment_bytes=1)  # one batch per segment: bases 0, 3, 6, 9
    assert len(seg_files(tmp_path)) == 4
    (tmp_path / f"{9:020d}.log").write_bytes(b"\xff" * 300)
    log = open_log(tmp_path, segment_bytes=1)
    assert log.log_end_offset == 9
    assert [o for o, _ in read_all(log)] == list(range(9))
    assert log.append_as_leader(batch([b"n"]), 0).first_offset == 9


def test_recovery_of_a_garbage_older_segment_drops_it_and_everything_after(
    tmp_path: Path,
) -> None:
    _filled(tmp_path, n=4, segment_bytes=1)  # bases 0, 3, 6, 9
    (tmp_path / f"{3:020d}.log").write_bytes(b"\x00\x00\x00\x00\x00\x00\x00\x07" + b"\x7f" * 100)
    log = open_log(tmp_path, segment_bytes=1)
    # The offsets after a hole would not be contiguous: Kafka's recovery drops them too.
    assert log.log_end_offset == 3
    assert [o for o, _ in read_all(log)] == [0, 1, 2]
    assert seg_files(tmp_path) == [f"{b:020d}.log" for b in (0, 3)]
    assert log.append_as_leader(batch([b"n"]), 0).first_offset == 3
    assert read_all(log)[-1] == (3, b"n")


def test_recovery_drops_a_segment_that_does_not_continue_the_previous_one(
    tmp_path: Path,
) -> None:
    _filled(tmp_path, n=3, segment_bytes=1)  # bases 0, 3, 6
    stray = tmp_path / f"{100:020d}.log"
    stray.write_bytes(batch([b"stray"], base_offset=100))
    log = open_log(tmp_path, segment_bytes=1)
    assert log.log_end_offset == 9
    assert not stray.exists()


@pytest.mark.parametrize("damage", ["missing", "garbled", "empty", "extra"])
def test_index_of_an_older_segment_is_rebuilt(tmp_path: Path, damage: str) -> None:
    _filled(tmp_path, n=12, segment_bytes=400, index_interval_bytes=50)
    first_index = tmp_path / f"{0:020d}.index"
    good = first_index.read_bytes()
    assert len(good) > 8  # several entries
    if damage == "missing":
        first_index.unlink()
    elif damage == "garbled":
        first_index.write_bytes(os.urandom(len(good)))
    elif damage == "empty":
        first_index.write_bytes(b"")
    else:
        first_index.write_bytes(good + b"\x00\x00\x00\x05\x00\x00\x10\x00")
    log = open_log(tmp_path, segment_bytes=400, index_interval_bytes=50)
    assert first_index.read_bytes() == good
    assert [o for o, _ in read_all(log)] == list(range(36))
    for offset in range(36):
        assert log.read(offset, 1).first_offset == offset - offset % 3


# --- truncation ----------------------------------------------------------------------------


def test_truncate_to_across_segment_boundaries(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=1, index_interval_bytes=1)
    for i in range(5):
        log.append_as_leader(batch(vals(3, f"{i}-")), 0)  # one batch per segment
    assert [s.base_offset for s in log.segments] == [0, 3, 6, 9, 12]
    before = read_all(log)
    removed = log.truncate_to(6)  # exactly at a segment boundary
    assert log.log_end_offset == 6
    assert removed == sum(len(batch(vals(3, f"{i}-"))) for i in (2, 3, 4))
    assert seg_files(tmp_path) == [f"{b:020d}.log" for b in (0, 3)]
    assert seg_files(tmp_path, ".index") == [f"{b:020d}.index" for b in (0, 3)]
    assert read_all(log) == before[:6]
    assert log.truncate_to(6) == 0
    assert log.truncate_to(100) == 0
    info = log.append_as_leader(batch([b"new"]), 5)
    assert info.first_offset == 6
    assert read_all(log) == [*before[:6], (6, b"new")]


def test_truncate_inside_a_batch_removes_the_whole_batch(tmp_path: Path) -> None:
    log = open_log(tmp_path, index_interval_bytes=1)
    for i in range(4):
        log.append_as_leader(batch(vals(3, f"{i}-")), 0)
    log.truncate_to(7)  # batch 6-8 goes entirely
    assert log.log_end_offset == 6
    assert [o for o, _ in read_all(log)] == list(range(6))
    assert log.read(5, BIG).next_offset == 6
    # The index must not point at removed bytes: append and read at every offset.
    log.append_as_leader(batch(vals(2, "n")), 0)
    log.append_as_leader(batch(vals(2, "m")), 0)
    for offset in range(10):
        result = log.read(offset, 1)
        assert read_records(result.data, min_offset=offset)[0].offset == offset
    assert read_all(log)[6:] == [(6, b"n0"), (7, b"n1"), (8, b"m0"), (9, b"m1")]


def test_truncate_inside_the_first_batch_of_a_segment_empties_it(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=1)
    for i in range(3):
        log.append_as_leader(batch(vals(3, f"{i}-")), 0)  # segments 0, 3, 6
    log.truncate_to(4)
    assert log.log_end_offset == 3
    assert log.read(3, BIG).data == b""
    log.append_as_leader(batch([b"x"]), 0)
    assert read_all(log)[-1] == (3, b"x")
    log.close()
    log = open_log(tmp_path, segment_bytes=1)
    assert log.log_end_offset == 4
    assert read_all(log)[-1] == (3, b"x")


def test_truncate_to_below_log_start_offset_restarts_the_log_there(tmp_path: Path) -> None:
    log, _ = _three_segments(tmp_path, Clock(), retention_bytes=0, retention_ms=-1)
    log.delete_old_segments()
    assert log.log_start_offset == 8
    log.truncate_to(5)
    # The log ends at or below the target, as a follower asked; nothing at 5.. is kept.
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes) == (5, 5, 0)
    log.append_as_follower(batch([b"from-leader"], base_offset=5))
    assert read_all(log) == [(5, b"from-leader")]
    log.close()
    log = open_log(tmp_path)
    assert (log.log_start_offset, log.log_end_offset) == (5, 6)


def test_truncate_to_the_log_start_offset_empties_the_log(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(vals(3)), 0)
    log.truncate_to(0)
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes) == (0, 0, 0)
    log.append_as_leader(batch([b"again"]), 0)
    assert read_all(log) == [(0, b"again")]


def test_truncate_fully_and_start_at(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=1)
    for i in range(3):
        log.append_as_leader(batch(vals(2, f"{i}-")), 0)
    log.truncate_fully_and_start_at(50)
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes) == (50, 50, 0)
    assert seg_files(tmp_path) == [f"{50:020d}.log"]
    with pytest.raises(OffsetOutOfRange):
        log.read(0, BIG)
    assert log.read(50, BIG).data == b""
    log.append_as_follower(batch(vals(2), base_offset=50))
    log.append_as_leader(batch([b"x"]), 1)
    assert [o for o, _ in read_all(log)] == [50, 51, 52]
    log.close()
    log = open_log(tmp_path, segment_bytes=1)
    assert (log.log_start_offset, log.log_end_offset) == (50, 53)
    # Restarting at an offset that is already a segment base reuses nothing stale.
    log.truncate_fully_and_start_at(50)
    assert (log.log_end_offset, log.size_bytes) == (50, 0)
    assert read_all(log) == []


# --- timestamps --------------------------------------------------------------------------


def test_offset_for_timestamp(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=1)
    assert log.offset_for_timestamp(0) is None
    log.append_as_leader(batch(vals(3), ts=100), 0)  # ts 100..102, offsets 0-2
    log.append_as_leader(batch(vals(2), ts=200), 0)  # ts 200..201, offsets 3-4
    log.append_as_leader(batch(vals(2), ts=150), 0)  # out of order, offsets 5-6
    # Record granularity (Kafka's): the first record at or after the time, in offset order.
    assert log.offset_for_timestamp(0) == (0, 100)
    assert log.offset_for_timestamp(101) == (1, 101)
    assert log.offset_for_timestamp(102) == (2, 102)
    assert log.offset_for_timestamp(103) == (3, 200)
    assert log.offset_for_timestamp(150) == (3, 200)
    assert log.offset_for_timestamp(201) == (4, 201)
    assert log.offset_for_timestamp(202) is None
    log.close()
    log = open_log(tmp_path, segment_bytes=1)
    assert log.offset_for_timestamp(103) == (3, 200)
    assert log.offset_for_timestamp(201) == (4, 201)


# --- hot-path cost ---------------------------------------------------------------------------


def test_append_is_one_write_and_read_is_one_pread(tmp_path: Path, monkeypatch) -> None:
    log = open_log(tmp_path, index_interval_bytes=64)
    for i in range(50):
        log.append_as_leader(batch(vals(3, f"{i}-")), 0)
    writes: list[int] = []
    preads: list[int] = []
    real_write, real_pread = os.write, os.pread

    def count_write(fd: int, data) -> int:
        writes.append(fd)
        return real_write(fd, data)

    def count_pread(fd: int, n: int, pos: int) -> bytes:
        preads.append(fd)
        return real_pread(fd, n, pos)

    for module in (segment_module.os, log_module.os):
        monkeypatch.setattr(module, "write", count_write)
        monkeypatch.setattr(module, "pread", count_pread)
    for i in range(20):
        writes.clear()
        log.append_as_leader(batch(vals(2, f"x{i}")), 0)
        assert len(writes) == 1
    for offset in range(0, 190, 7):
        preads.clear()
        result = log.read(offset, 200)
        assert result.first_offset <= offset < result.next_offset
        assert len(preads) == 1
    monkeypatch.undo()
    log.close()


def test_batch_header_offsets_in_file_are_contiguous(tmp_path: Path) -> None:
    """A cheap whole-file invariant check, independent of Log.read."""
    _filled(tmp_path, n=6, segment_bytes=250)
    expected = 0
    for name in seg_files(tmp_path):
        data = (tmp_path / name).read_bytes()
        assert int(name[:-4]) == expected
        for _, header in iter_batches(data):
            assert header.base_offset == expected
            assert header.leader_epoch == 2
            expected = header.next_offset
    assert expected == 18
    assert unpack_header(batch([b"q"], base_offset=3)).base_offset == 3


def test_negative_offsets_are_refused(tmp_path: Path) -> None:
    """A segment named after a negative offset could not be parsed back on open."""
    log = open_log(tmp_path)
    log.append_as_leader(batch([b"a"]), 0)
    with pytest.raises(ValueError):
        log.truncate_to(-1)
    with pytest.raises(ValueError):
        log.truncate_fully_and_start_at(-1)
    assert read_all(log) == [(0, b"a")]


def test_index_has_entries_inside_one_large_request(tmp_path: Path) -> None:
    """A 50-batch produce request must not leave one index entry for all of it.

    Otherwise a read in the middle of the request would pread the whole request.
    """
    log = open_log(tmp_path, index_interval_bytes=100)
    request = b"".join(batch(vals(2, f"{i}-", size=20)) for i in range(50))
    one = len(batch(vals(2, "0-", size=20)))
    log.append_as_leader(request, 0)
    segment = log.active
    assert len(segment.index_offsets) >= len(request) // (100 + one)
    for offset, position in zip(segment.index_offsets, segment.index_positions, strict=True):
        assert position == (offset // 2) * one  # each entry points at its batch
    for offset in (0, 37, 99):
        start, bound = segment.lookup_span(offset)
        assert bound - start <= 100 + one
        assert segment.find_position(offset) == (offset // 2) * one
    log.close()
    log = open_log(tmp_path, index_interval_bytes=100)  # the rebuilt index agrees
    assert log.active.index_positions == segment.index_positions


def test_find_position_at_segment_ends(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=1)
    log.append_as_leader(batch(vals(3)), 0)
    log.append_as_leader(batch(vals(3)), 0)
    first, second = log.segments
    assert first.find_position(0) == 0
    assert first.find_position(2) == 0
    assert first.find_position(3) is None  # the next segment's base: not in this one
    assert second.find_position(2) is None
    assert second.find_position(3) == 0
    assert second.find_position(6) is None  # the LEO
    assert log.read(3, BIG).first_offset == 3
    assert log.read(6, BIG).data == b""


def test_failed_write_leaves_no_partial_batch(tmp_path: Path, monkeypatch) -> None:
    log = open_log(tmp_path, index_interval_bytes=1)
    log.append_as_leader(batch([b"a"]), 0)
    size, index = log.size_bytes, list(log.active.index_positions)
    real_write = os.write

    def short_write(fd: int, data) -> int:
        return real_write(fd, bytes(data)[:10])  # disk full after 10 bytes

    monkeypatch.setattr(segment_module.os, "write", short_write)
    with pytest.raises(OSError):
        log.append_as_leader(batch([b"b"]) + batch([b"c"]), 0)
    monkeypatch.undo()
    assert (log.log_end_offset, log.size_bytes) == (1, size)
    assert log.active.index_positions == index  # no entry for bytes that are not there
    assert os.path.getsize(log.active.path) == size
    log.append_as_leader(batch([b"d"]), 0)
    assert read_all(log) == [(0, b"a"), (1, b"d")]


def test_a_new_segment_ignores_a_stale_index_file(tmp_path: Path) -> None:
    log = open_log(tmp_path, index_interval_bytes=1)
    log.append_as_leader(batch(vals(3)), 0)
    # As if a crash had left the index of a deleted segment at the next base offset.
    (tmp_path / f"{3:020d}.index").write_bytes(b"\x00\x00\x00\x09\x00\x00\x99\x99" * 4)
    log.roll()
    log.append_as_leader(batch(vals(2)), 0)
    log.close()
    assert (tmp_path / f"{3:020d}.index").read_bytes() == bytes(8)  # entry (0, 0) only
