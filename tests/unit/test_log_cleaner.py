"""The log cleaner (cleanup.policy=compact): latest record per key, offsets kept, tombstone
retention, producer state, followers copying gaps, and crash safety of the swap.

A manual clock drives every timestamp decision; no test sleeps.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
import trio

from minibroker.broker.storage import Log, LogAppendError, LogConfig, cleaner
from minibroker.broker.storage.cleaner_manager import LogCleanerManager
from minibroker.broker.storage.swap import commit, swap_steps
from minibroker.protocol import encode_batch, iter_batches, read_records
from minibroker.protocol.batch import producer_fields

NOW = 10_000_000


class Clock:
    def __init__(self, now: int = NOW) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def compacted(path: Path, clock: Clock | None = None, **config) -> Log:
    settings = {"segment_bytes": 400, "cleanup_policy": "compact", **config}
    return Log.open(path, LogConfig(**settings), now_ms=clock or Clock())


def put(log: Log, *pairs: tuple[str, str | None], ts: int = NOW - 1000, **producer) -> None:
    rows = [(ts, k.encode() if k else None, v.encode() if v else None, []) for k, v in pairs]
    log.append_as_leader(encode_batch(rows, **producer), leader_epoch=3)


def read_all(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    offset = log.log_start_offset
    out = []
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        assert result.next_offset > offset, "a read below the LEO must make progress"
        out += [(r.offset, r.key, r.value) for r in read_records(result.data, min_offset=offset)]
        offset = result.next_offset
    return out


def latest_per_key(records: list[tuple[int, bytes | None, bytes | None]]) -> dict:
    latest = {}
    for offset, key, value in records:
        if key is not None:
            latest[key] = (offset, value)
    return latest


def overwrite_many(log: Log, keys: int = 5, rounds: int = 20) -> None:
    for r in range(rounds):
        for k in range(keys):
            put(log, (f"k{k}", f"value-{r}-{k}"))
    log.roll()  # everything written so far is cleanable


def clean(log: Log, hw: int | None = None) -> cleaner.Stats | None:
    plan = cleaner.plan(log, log.log_end_offset if hw is None else hw, log.now_ms())
    return None if plan is None else cleaner.clean_now(plan)


def test_keeps_the_latest_record_per_key_at_its_offset(tmp_path: Path) -> None:
    log = compacted(tmp_path, min_cleanable_dirty_ratio=0.01)
    overwrite_many(log)
    before = read_all(log)
    size_before = log.size_bytes
    segments_before = len(log.segments)
    stats = clean(log)
    assert stats is not None and stats.records_kept < stats.records_read
    after = read_all(log)
    # Exactly the latest record of each key remains, at its original offset.
    assert sorted(after) == sorted((o, k, v) for k, (o, v) in latest_per_key(before).items())
    assert log.size_bytes < size_before / 5
    # Groups are made by the sources' sizes (Kafka's groupSegmentsBySize): the next pass
    # merges the now small segments.
    assert len(log.segments) == segments_before
    put(log, ("k0", "more"))
    log.roll()
    clean(log)
    assert len(log.segments) < segments_before / 4
    after = [r for r in read_all(log) if r[1] != b"k0"] + [(100, b"k0", b"more")]
    assert read_all(log) == after
    assert log.log_start_offset == 0 and log.log_end_offset == 101
    # The same after reopening: the gaps are recovered as such, not as damage.
    log.close()
    reopened = compacted(tmp_path, min_cleanable_dirty_ratio=0.01)
    assert read_all(reopened) == after
    assert reopened.log_end_offset == 101


def test_the_active_segment_and_records_above_the_hw_are_never_touched(tmp_path: Path) -> None:
    log = compacted(tmp_path)
    overwrite_many(log, rounds=10)
    put(log, ("k0", "in-the-active-segment"))
    active = log.active
    assert clean(log, hw=0) is None  # nothing wholly below the high watermark
    clean(log)
    assert log.active is active
    assert read_all(log)[-1] == (50, b"k0", b"in-the-active-segment")
    # k0's older value is still below: the active segment's records do not supersede.
    assert [v for _, k, v in read_all(log) if k == b"k0"] == [
        b"value-9-0",
        b"in-the-active-segment",
    ]


def test_dirty_ratio_gates_a_pass_and_the_checkpoint_survives_restart(tmp_path: Path) -> None:
    log = compacted(tmp_path, min_cleanable_dirty_ratio=0.5)
    overwrite_many(log)
    assert clean(log) is not None
    assert clean(log) is None  # nothing dirty left
    put(log, ("k1", "a little more"))
    log.roll()
    # One small dirty segment against the cleaned ones: below the ratio.
    plan = cleaner.plan(log, log.log_end_offset, log.now_ms())
    assert plan is None
    log.close()
    reopened = compacted(tmp_path, min_cleanable_dirty_ratio=0.01)
    plan = cleaner.plan(reopened, reopened.log_end_offset, reopened.now_ms())
    assert plan is not None and plan.first_dirty == 100  # the checkpoint, not offset 0


def test_tombstones_stay_for_delete_retention_ms_then_go(tmp_path: Path) -> None:
    clock = Clock()
    log = compacted(tmp_path, clock, delete_retention_ms=60_000, min_cleanable_dirty_ratio=0.01)
    put(log, ("gone", "v1"), ("kept", "v1"), ts=clock.now - 1000)
    put(log, ("gone", None), ts=clock.now - 1000)
    log.roll()
    clean(log)
    assert [(k, v) for _, k, v in read_all(log)] == [(b"kept", b"v1"), (b"gone", None)]
    clock.now += 60_000  # the tombstone is now older than delete.retention.ms
    put(log, ("kept", "v2"))
    log.roll()
    clean(log)
    assert [(k, v) for _, k, v in read_all(log)] == [(b"kept", b"v2")]


def test_keyless_records_are_dropped_and_min_compaction_lag_protects_young_segments(
    tmp_path: Path,
) -> None:
    clock = Clock()
    log = compacted(tmp_path, clock, min_compaction_lag_ms=5000)
    # A leader refuses keyless records in a compacted topic (INVALID_RECORD); a log can
    # still hold some, written before the topic was compacted: copied in as a follower.
    old = [(clock.now - 10_000, None, b"no key", []), (clock.now - 10_000, b"k", b"old", [])]
    log.append_as_follower(encode_batch(old, base_offset=log.log_end_offset))
    log.roll()
    put(log, ("k", "young"), ts=clock.now - 100)
    log.roll()
    clean(log)
    assert [(k, v) for _, k, v in read_all(log)] == [(b"k", b"old"), (b"k", b"young")]
    clock.now += 5000
    clean(log)
    assert [(k, v) for _, k, v in read_all(log)] == [(b"k", b"young")]


def test_partly_kept_batches_split_into_runs_with_epoch_and_sequences(tmp_path: Path) -> None:
    log = compacted(tmp_path, segment_bytes=1000)
    put(log, ("a", "1"), ("b", "1"), ("c", "1"), ("d", "1"), ("f", "1"), producer_id=7)
    put(log, ("b", "2"), producer_id=7, base_sequence=5)  # the producer's last batch
    put(log, ("a", "x"), ("b", "x"), ("c", "x"), ("d", "x"), ("e", "x"))
    log.roll()
    put(log, ("c", "3"))
    log.roll()
    clean(log)
    records = read_all(log)
    assert [(o, k) for o, k, _ in records] == [
        (4, b"f"),
        (5, b"b"),  # superseded, but its producer's last batch: kept whole
        (6, b"a"),
        (7, b"b"),
        (9, b"d"),
        (10, b"e"),
        (11, b"c"),
    ]
    # Each run of kept offsets became its own batch, with the original leader epoch and,
    # for the producer's, the run's own sequence number.
    data = b"".join(log.read(s.base_offset, 1 << 20).data for s in log.segments[:-1])
    batches = [
        (h.base_offset, h.record_count, h.leader_epoch, producer_fields(data, pos, h))
        for pos, h in iter_batches(data)
    ]
    assert batches == [
        (4, 1, 3, (7, 0, 4)),
        (5, 1, 3, (7, 0, 5)),
        (6, 2, 3, None),
        (9, 2, 3, None),
        (11, 1, 3, None),
    ]
    # The producer state a replay rebuilds is unchanged: its last batch is still there.
    log.close()
    for snapshot in tmp_path.glob("*.snapshot"):
        snapshot.unlink()
    reopened = compacted(tmp_path)
    entry = reopened.producers.producers[7]
    assert entry.last_seq == 5 and entry.batches[-1].last_offset == 5


def test_a_follower_copies_the_compacted_log_with_its_gaps(tmp_path: Path) -> None:
    leader = compacted(tmp_path / "leader")
    overwrite_many(leader, rounds=6)
    clean(leader)
    follower = compacted(tmp_path / "follower")
    offset = 0
    while offset < leader.log_end_offset:
        result = leader.read(offset, 1 << 20)
        if result.data:
            follower.append_as_follower(result.data)
        offset = result.next_offset
    assert read_all(follower) == read_all(leader)
    # Offsets may skip forwards, never back.
    with pytest.raises(LogAppendError):
        follower.append_as_follower(leader.read(0, 1 << 20).data)


def _snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}


def test_a_crash_at_any_step_of_the_swap_leaves_the_old_or_the_new_segments(
    tmp_path: Path,
) -> None:
    """Stop after each file operation of a swap (as a crash would), reopen, compare."""
    source = tmp_path / "source"
    log = compacted(source)  # 400-byte segments, cleaned into groups of up to 1200 bytes
    overwrite_many(log, rounds=8)
    old = read_all(log)
    log.close()
    crash_points = 0
    step = 0
    while True:
        work = tmp_path / f"crash-{step}"
        shutil.copytree(source, work)
        log = compacted(work, segment_bytes=1200)
        plan = cleaner.plan(log, log.log_end_offset, log.now_ms())
        assert plan is not None
        latest = cleaner.build_offset_map(plan, threading.Event())
        group, end = cleaner.with_ends(plan)[0]
        assert len(group) > 1 and end < log.segments[-2].base_offset
        cleaner.clean_group(plan, group, end, latest, threading.Event())
        steps = swap_steps(work, group[0].base_offset, end)
        if step == 0:  # a crash while the copy was being written
            copy = cleaner.cleaned_log(work, group[0].base_offset)
            copy.write_bytes(copy.read_bytes()[:-7])
        else:
            for op in steps[: step - 1]:
                op()
        # The crash: no close, no in-memory swap; the process is gone. Then a restart.
        reopened = compacted(work, segment_bytes=1200)
        records = read_all(reopened)
        assert not list(work.glob("*.cleaned")) and not list(work.glob("*.swap"))
        committed = step >= 2  # renaming .cleaned to .swap is the commit point
        below = [r for r in old if r[0] < end]
        expected_below = [r for r in below if latest[r[1]] == r[0]] if committed else below
        assert [r for r in records if r[0] < end] == expected_below, step
        assert [r for r in records if r[0] >= end] == [r for r in old if r[0] >= end], step
        reopened.close()
        crash_points += 1
        if step - 1 == len(steps):
            break
        step += 1
    assert crash_points >= 6  # torn copy, before commit, commit, unlinks, install, index


def test_segments_that_changed_under_a_pass_are_not_swapped(tmp_path: Path) -> None:
    log = compacted(tmp_path, cleanup_policy="compact,delete", retention_ms=1)
    overwrite_many(log)
    plan = cleaner.plan(log, log.log_end_offset, log.now_ms())
    assert plan is not None
    group, end = cleaner.with_ends(plan)[0]
    made, _ = cleaner.clean_group(
        plan, group, end, cleaner.build_offset_map(plan, threading.Event()), threading.Event()
    )
    assert log.delete_old_segments(log.log_end_offset) > 0  # retention got there first
    assert not cleaner.still_planned(plan, group)
    cleaner.discard(plan, made.base)
    assert not list(tmp_path.glob("*.cleaned"))


def test_a_truncation_after_the_commit_discards_the_swap(tmp_path: Path) -> None:
    """A follower truncating while a pass runs (the pass committed its copy already): the
    truncation discards the swap file, so a restart cannot complete it over segments that
    now hold other records."""
    log = compacted(tmp_path)
    overwrite_many(log, rounds=8)
    plan = cleaner.plan(log, log.log_end_offset, log.now_ms())
    assert plan is not None
    group, end = cleaner.with_ends(plan)[0]
    log.cleaning = True  # what the manager sets for a pass
    latest = cleaner.build_offset_map(plan, threading.Event())
    made, _ = cleaner.clean_group(plan, group, end, latest, threading.Event())
    commit(tmp_path, made.base, made.end)
    assert list(tmp_path.glob("*.swap"))
    cut = group[0].next_offset + 1
    log.truncate_to(cut)
    put(log, ("new", "after the truncation"))
    assert not list(tmp_path.glob("*.swap")) and not cleaner.still_planned(plan, group)
    expected = read_all(log)
    log.close()
    assert read_all(compacted(tmp_path)) == expected  # nothing of the copy came back


def test_retention_does_not_apply_to_a_compact_only_log(tmp_path: Path) -> None:
    log = compacted(tmp_path, retention_ms=1)
    overwrite_many(log)
    assert log.delete_old_segments(log.log_end_offset) == 0
    assert log.log_start_offset == 0


async def test_the_manager_cleans_in_a_worker_thread_and_picks_the_dirtiest(
    tmp_path: Path,
) -> None:
    busy = compacted(tmp_path / "busy")
    overwrite_many(busy, rounds=20)
    calm = compacted(tmp_path / "calm", min_cleanable_dirty_ratio=0.99)
    put(calm, ("k", "v"))
    calm.roll()
    put(calm, ("k", "w"))  # clean section absent: ratio 1.0, but ties go to the first
    manager = LogCleanerManager(lambda: [(busy, busy.log_end_offset)], 60_000, _Quiet())
    before = busy.size_bytes
    assert await manager.clean_filthiest()
    assert busy.size_bytes < before / 5
    assert not await manager.clean_filthiest()  # nothing dirty left
    stats = manager.stats()
    assert stats["passes"] == 1 and 0 < stats["bytes_written"] < stats["bytes_read"] / 5
    assert stats["uncleanable_partitions"] == []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(manager.run)
            await trio.sleep(0)
            nursery.cancel_scope.cancel()


class _Quiet:
    def __getattr__(self, name: str):
        return lambda *a, **k: None


def test_a_stock_clients_batches_are_copied_whole_or_reencoded(tmp_path: Path) -> None:
    """A Kafka v2 batch (gzip here) inside ours: kept whole, it stays byte for byte what the
    client sent; losing records, its kept ones become a v2 batch of the same codec (the
    cleaner re-compresses them, as Kafka's), decoded the same."""
    from minibroker.protocol.batch import KAFKA_FLAG, unwrap_kafka_batch, wrap_kafka_batch
    from minibroker.protocol.kafka import records as kafka_records

    def kafka_batch(*pairs: tuple[bytes, bytes]) -> bytes:
        raw = kafka_records.encode_batch(
            [(NOW - 1000, k, v, [("h", b"x")]) for k, v in pairs],
            compression=kafka_records.GZIP,
        )
        return wrap_kafka_batch(raw, 0, kafka_records.check_batch(raw, 0, len(raw)))

    log = compacted(tmp_path)
    whole = kafka_batch((b"a", b"1"), (b"b", b"1"))
    log.append_as_leader(kafka_batch((b"c", b"1"), (b"d", b"1"), (b"e", b"1")), 2)
    log.append_as_leader(whole, 2)
    log.append_as_leader(kafka_batch((b"c", b"2")), 2)
    log.roll()
    clean(log)
    data = b"".join(log.read(s.base_offset, 1 << 20).data for s in log.segments[:-1])
    kinds = [(h.base_offset, bool(h.attributes & KAFKA_FLAG)) for _, h in iter_batches(data)]
    assert kinds == [(1, True), (3, True), (5, True)]
    rewritten = unwrap_kafka_batch(data, 0, next(iter_batches(data))[1])
    assert kafka_records.unpack_header(rewritten).compression == kafka_records.GZIP
    assert whole[16:] in data  # CRC onwards as the client sent it (offset, epoch patched)
    records = read_records(data)
    assert [(r.offset, r.key, r.value, r.headers) for r in records] == [
        (1, b"d", b"1", [("h", b"x")]),
        (2, b"e", b"1", [("h", b"x")]),
        (3, b"a", b"1", [("h", b"x")]),
        (4, b"b", b"1", [("h", b"x")]),
        (5, b"c", b"2", [("h", b"x")]),
    ]


async def test_a_damaged_batch_leaves_the_log_as_it_is_and_uncleanable(tmp_path: Path) -> None:
    """The cleaner checks each batch's CRC: a copy must not turn damage into a valid
    batch. The pass fails, nothing is swapped, and the log is not tried again."""
    log = compacted(tmp_path)
    overwrite_many(log, rounds=4)
    first = log.segments[0].path
    raw = bytearray(first.read_bytes())
    raw[-3] ^= 0x20  # inside the last batch's records
    first.write_bytes(bytes(raw))
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*.log")}
    manager = LogCleanerManager(lambda: [(log, log.log_end_offset)], 60_000, _Quiet())
    assert await manager.clean_filthiest()
    assert manager.stats()["uncleanable_partitions"] == [tmp_path.name]
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.log")} == before
    assert not list(tmp_path.glob("*.cleaned"))
    assert not await manager.clean_filthiest()  # skipped from now on


def test_a_truncation_moves_the_clean_dirty_boundary_back(tmp_path: Path) -> None:
    log = compacted(tmp_path, min_cleanable_dirty_ratio=0.01)
    overwrite_many(log)
    clean(log)
    assert log.first_dirty_offset == 100
    log.truncate_to(95)  # a follower cut back to where its new leader's log diverges
    overwrite_many(log, rounds=2)  # offsets from 95 on are new, never cleaned
    plan = cleaner.plan(log, log.log_end_offset, log.now_ms())
    assert plan is not None and plan.first_dirty <= 95
