"""The persistent time index (Kafka's ``.timeindex``): its format, and that appends,
recovery, truncation, retention and the log cleaner keep it true to the log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import structlog

from minibroker.broker.storage import Log, LogConfig, cleaner
from minibroker.broker.storage.segment import scan_segment
from minibroker.broker.storage.time_index import TIME_ENTRY
from minibroker.protocol import encode_batch, read_records
from tests.unit.test_storage import Clock, batch, open_log, seg_files, vals


def time_entries(path: Path) -> list[tuple[int, int]]:
    """A .timeindex file's ``(timestamp, relative offset)`` entries."""
    raw = path.read_bytes()
    assert len(raw) % TIME_ENTRY.size == 0
    return [TIME_ENTRY.unpack_from(raw, at) for at in range(0, len(raw), TIME_ENTRY.size)]


def records_with_times(log: Log) -> list[tuple[int, int]]:
    """``(offset, timestamp)`` of every record, read straight from the segment files."""
    out = []
    for segment in log.segments:
        data = segment.pread(segment.size, 0)
        out += [(r.offset, r.timestamp) for r in read_records(data)]
    return out


def check_entries(log: Log) -> int:
    """Every segment's file holds entries in Kafka's layout, timestamps and offsets
    increasing, each true of the segment's records: none at or below its offset is later
    than its timestamp. Returns how many entries there are."""
    records = records_with_times(log)
    total = 0
    for segment in log.segments:
        entries = time_entries(segment.time_path)
        assert [t for t, _ in entries] == sorted({t for t, _ in entries})  # strictly
        assert [o for _, o in entries] == sorted(o for _, o in entries)
        for ts, relative in entries:
            last = segment.base_offset + relative
            assert relative >= 0 and last < segment.next_offset
            assert max(t for o, t in records if segment.base_offset <= o <= last) <= ts
        total += len(entries)
    return total


def check_lookups(log: Log) -> None:
    """Each record's own time finds the first record at or after it, as a linear search."""
    records = records_with_times(log)
    for _, ts in records:
        expected = next((o, t) for o, t in records if t >= ts)
        assert log.offset_for_timestamp(ts) == expected
    top = max(t for _, t in records)
    assert log.offset_for_timestamp(top + 1) is None


def events(logs: list[dict], prefix: str = "log_index") -> list[tuple[str, str, str]]:
    return [
        (e["event"], Path(e["file"]).name, e["reason"])
        for e in logs
        if e["event"].startswith(prefix)
    ]


def reopen(path: Path, **config: int) -> tuple[Log, list[dict]]:
    with structlog.testing.capture_logs() as logs:
        log = open_log(path, **config)
    return log, logs


def mixed_log(path: Path, **config: int) -> Log:
    """Batches with rising, falling and repeated times, over several segments."""
    log = open_log(path, index_interval_bytes=200, segment_bytes=3000, **config)
    for i, ts in enumerate([100, 300, 200, 200, 900, 400, 950, 950, 50, 1200] * 6):
        log.append_as_leader(batch(vals(4, f"{i}-", size=30), ts=ts + i), 0)
    return log


def test_entries_are_kafkas_layout_and_each_one_holds(tmp_path: Path) -> None:
    log = mixed_log(tmp_path)
    log.flush()
    assert len(log.segments) > 2
    assert check_entries(log) > len(log.segments)
    check_lookups(log)
    # A sealed segment's entries are all in its file: nothing of them stays in memory.
    assert all(not s.index.time_entries for s in log.segments[:-1])


def test_the_write_path_and_recovery_make_the_same_bytes(tmp_path: Path) -> None:
    """Appends of many batches at once (a follower's) index per batch, as the scan does:
    a clean reopen rewrites nothing and logs nothing."""
    leader = mixed_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower", index_interval_bytes=200, segment_bytes=3000)
    offset = 0
    while offset < leader.log_end_offset:
        result = leader.read(offset, 1000)
        follower.append_as_follower(result.data)
        offset = result.next_offset
    follower.close()
    before = {p.name: p.read_bytes() for p in (tmp_path / "follower").glob("*.timeindex")}
    assert len(before) > 1 and any(before.values())
    follower, logs = reopen(tmp_path / "follower", index_interval_bytes=200, segment_bytes=3000)
    assert events(logs) == []
    after = {p.name: p.read_bytes() for p in (tmp_path / "follower").glob("*.timeindex")}
    assert after == before
    check_entries(follower)
    check_lookups(follower)


def _lose(path: Path) -> None:
    path.unlink()


def _garble(path: Path) -> None:
    # Entries that lie (every record "older than" a huge time), and a torn one.
    path.write_bytes(TIME_ENTRY.pack(2**60, 0) * 3 + b"\x01\x02\x03")


@pytest.mark.parametrize(
    ("damage", "event", "level", "reason"),
    [
        (_lose, "log_index_rebuilt", "info", "missing"),
        (_garble, "log_index_corrupt_rebuilt", "warning", "corrupt"),
    ],
)
def test_a_missing_or_corrupt_time_index_is_rebuilt_and_logged_naming_it(
    tmp_path: Path, damage, event: str, level: str, reason: str
) -> None:
    log = mixed_log(tmp_path)
    log.close()
    victim = tmp_path / "00000000000000000000.timeindex"
    wanted = victim.read_bytes()
    damage(victim)
    log, logs = reopen(tmp_path, index_interval_bytes=200, segment_bytes=3000)
    assert events(logs) == [(event, victim.name, reason)]
    assert logs[0]["log_level"] == level
    assert victim.read_bytes() == wanted
    check_lookups(log)


def test_an_unreadable_time_index_never_stops_the_log(tmp_path: Path) -> None:
    """A directory where the file should be: it can be neither read nor replaced. The
    open warns naming it, and lookups read the segment from its start, still exact."""
    log = mixed_log(tmp_path)
    log.close()
    victim = tmp_path / "00000000000000000000.timeindex"
    victim.unlink()
    victim.mkdir()
    (victim / "x").write_bytes(b"keeps it from being removed")
    log, logs = reopen(tmp_path, index_interval_bytes=200, segment_bytes=3000)
    [(event, name, reason)] = events(logs)
    assert event == "log_index_corrupt_rebuilt" and name == victim.name
    assert reason.startswith("unreadable") and "not rewritten" in reason
    check_lookups(log)


def test_a_crash_loses_the_unwritten_tail_which_is_behind_not_corrupt(tmp_path: Path) -> None:
    log = open_log(tmp_path, index_interval_bytes=100)
    for i in range(20):
        log.append_as_leader(batch(vals(3, f"{i}-", size=30), ts=1000 + 10 * i), 0)
    log.flush()  # what is on disk now
    for i in range(20, 40):
        log.append_as_leader(batch(vals(3, f"{i}-", size=30), ts=1000 + 10 * i), 0)
    os.write(log.active.fd, b"")  # no close: the process dies with entries unwritten
    crashed, logs = reopen(tmp_path, index_interval_bytes=100)
    assert events(logs) == [
        ("log_index_rebuilt", "00000000000000000000.index", "behind the log"),
        ("log_index_rebuilt", "00000000000000000000.timeindex", "behind the log"),
    ]
    assert check_entries(crashed) > 20
    check_lookups(crashed)


def test_truncation_cuts_the_time_index_with_the_log(tmp_path: Path) -> None:
    log = open_log(tmp_path, index_interval_bytes=100)
    for i in range(40):
        log.append_as_leader(batch(vals(3, f"{i}-", size=30), ts=1000 + 10 * i), 0)
    log.truncate_to(60)  # batches 0-19 stay
    entries = time_entries(log.active.time_path)
    assert entries and all(relative < 60 for _, relative in entries)
    assert all(ts < 1000 + 10 * 20 for ts, _ in entries)
    assert log.offset_for_timestamp(1000 + 10 * 20) is None
    # Appended again with older times: the index describes the new records, not the old.
    for i in range(20):
        log.append_as_leader(batch(vals(3, f"again{i}-", size=30), ts=500 + 10 * i), 0)
    check_entries(log)
    check_lookups(log)
    log.close()
    log, logs = reopen(tmp_path, index_interval_bytes=100)
    assert events(logs) == []
    check_lookups(log)


def test_retention_deletes_a_segment_with_its_time_index(tmp_path: Path) -> None:
    clock = Clock()
    log = open_log(tmp_path, clock, segment_bytes=400, retention_ms=1000)
    for i in range(10):
        log.append_as_leader(batch(vals(3, f"{i}-", size=30), ts=clock.now + i), 0)
    assert len(seg_files(tmp_path, ".timeindex")) == len(log.segments) > 2
    clock.now += 5000
    assert log.delete_old_segments() > 0
    names = {Path(n).stem for n in seg_files(tmp_path, ".timeindex")}
    assert (
        names
        == {Path(n).stem for n in seg_files(tmp_path)}
        == {f"{s.base_offset:020d}" for s in log.segments}
    )


def test_the_cleaner_writes_a_cleaned_segments_time_index_in_its_swap(tmp_path: Path) -> None:
    config = {"segment_bytes": 600, "cleanup_policy": "compact", "index_interval_bytes": 100}
    log = Log.open(tmp_path, LogConfig(**config), now_ms=Clock())
    for r in range(12):  # keys k0-k3 overwritten each round, u<r> written once (kept)
        for k, key in enumerate(["k0", "k1", f"u{r}", "k2", "k3"]):
            rows = [(10_000 + 100 * r + k, key.encode(), f"v{r}-{k}".encode(), [])]
            log.append_as_leader(encode_batch(rows), 0)
    log.roll()
    log.close()  # reopened with larger segments: the cleaner groups several into one
    config["segment_bytes"] = 3000
    log = Log.open(tmp_path, LogConfig(**config), now_ms=Clock())
    plan = cleaner.plan(log, log.log_end_offset, log.now_ms())
    assert plan is not None
    stats = cleaner.clean_now(plan)
    assert log.segments[0].next_offset > log.segments[1].base_offset - 10 > 0  # merged
    assert stats.records_kept < stats.records_read
    assert not list(tmp_path.glob("*.cleaned"))
    assert {p.stem for p in tmp_path.glob("*.timeindex")} == {
        p.stem for p in tmp_path.glob("*.log")
    }
    cleaned = log.segments[0]
    # The installed file is the one the segment's records make (as recovery would).
    scan = scan_segment(cleaned, verify=False, gaps=True)
    rebuilt = time_entries(cleaned.time_path)
    assert cleaned.rebuild_index(scan.batches) == []
    assert time_entries(cleaned.time_path) == rebuilt and rebuilt
    check_entries(log)
    check_lookups(log)
    log.close()
    log = Log.open(tmp_path, LogConfig(**config), now_ms=Clock())
    check_lookups(log)
