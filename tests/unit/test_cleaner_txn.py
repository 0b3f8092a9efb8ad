"""The log cleaner and transactions (Kafka's cleaner): aborted transactions' records are
dropped and shadow nothing, markers go once nothing of their transaction is left and the
delete horizon passed, nothing at or above the LSO is cleaned, and the aborted-transactions
index follows the cleaned segments inside the crash-safe swap."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from minibroker.broker.storage import Log, LogConfig, cleaner
from minibroker.broker.storage.cleaner_txn import horizon_of
from minibroker.broker.storage.swap import swap_steps
from minibroker.broker.storage.txn_index import AbortedTxn, index_path
from minibroker.protocol import encode_batch, iter_batches
from minibroker.protocol.batch import (
    CONTROL_FLAG,
    TRANSACTIONAL_FLAG,
    decode_rows,
    read_control_batch,
)

NOW = 10_000_000
P1, P2 = 21, 22


def compacted(path: Path) -> Log:
    config = LogConfig(segment_bytes=300, cleanup_policy="compact")
    return Log.open(path, config, now_ms=lambda: NOW)


def put(log: Log, key: str, value: str, *, pid: int = -1, seq: int = 0) -> None:
    fields = {}
    if pid >= 0:
        fields = dict(
            producer_id=pid, producer_epoch=0, base_sequence=seq, attributes=TRANSACTIONAL_FLAG
        )
    batch = encode_batch([(NOW - 1000, key.encode(), value.encode(), [])], **fields)
    log.append_as_leader(batch, leader_epoch=1)


def batches(log: Log) -> list[tuple[int, int, list]]:
    """(base offset, attributes, records' values) of every batch, from the segment files."""
    out = []
    for segment in log.segments:
        data = segment.path.read_bytes()
        for pos, header in iter_batches(data):
            values = [] if header.attributes & CONTROL_FLAG else decode_rows(data, pos, header)
            out.append((header.base_offset, header.attributes, [r[2] for r in values]))
    return out


def clean(log: Log) -> cleaner.Stats | None:
    plan = cleaner.plan(log, log.log_end_offset, NOW)
    return None if plan is None else cleaner.clean_now(plan)


def test_aborted_records_go_markers_stay_and_committed_ones_compact(tmp_path: Path) -> None:
    log = compacted(tmp_path)
    put(log, "k", "plain-1")  # 0
    put(log, "k", "aborted", pid=P1)  # 1: would shadow plain-1 if it counted
    log.append_marker(P1, 0, 0, False, 1)  # 2: abort
    put(log, "j", "committed-old", pid=P2)  # 3
    log.append_marker(P2, 0, 0, True, 1)  # 4: commit
    put(log, "j", "committed-new", pid=P2, seq=1)  # 5
    log.append_marker(P2, 0, 0, True, 1)  # 6
    # P1 writes again: its aborted batch is no longer its last, which the cleaner keeps
    # whole (the producer state a replay rebuilds needs it).
    put(log, "q", "p1-later", pid=P1, seq=1)  # 7
    log.append_marker(P1, 0, 0, True, 1)  # 8
    put(log, "z", "tail")  # 9
    log.roll()
    assert clean(log) is not None
    kept = batches(log)
    values = [v for _, _, vs in kept for v in vs]
    assert b"aborted" not in values  # dropped
    assert b"plain-1" in values  # the aborted record hid nothing
    assert b"committed-old" not in values and b"committed-new" in values
    markers = [base for base, attributes, _ in kept if attributes & CONTROL_FLAG]
    assert markers == [2, 4, 6, 8]
    # The cleaned segment keeps the abort's index entry; the replaced ones' files are gone.
    assert log.txn_index.entries == [AbortedTxn(P1, 1, 2, 3)]
    assert index_path(tmp_path, 0).stat().st_size > 0
    assert sorted(p.name for p in tmp_path.glob("*.txnindex")) == [index_path(tmp_path, 0).name]


def test_nothing_from_an_open_transaction_on_is_cleaned(tmp_path: Path) -> None:
    log = compacted(tmp_path)
    for i in range(6):
        put(log, "k", f"v{i}")
    log.roll()
    first_open = log.log_end_offset
    put(log, "k", "open", pid=P1)  # an undecided transaction
    for i in range(6):
        put(log, "k", f"w{i}")
    log.roll()
    plan = cleaner.plan(log, log.log_end_offset, NOW)
    assert plan is not None
    assert plan.first_uncleanable <= first_open
    cleaner.clean_now(plan)
    values = [v for _, _, vs in batches(log) for v in vs]
    assert b"open" in values and b"w0" in values  # at and after the LSO: untouched


# --- markers go: once nothing of their transaction is left, after the delete horizon -------


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> int:
        return self.now


RETENTION = 60_000  # delete.retention.ms


def timed(path: Path, clock: Clock) -> Log:
    config = LogConfig(
        segment_bytes=300,
        cleanup_policy="compact",
        min_cleanable_dirty_ratio=0.01,
        delete_retention_ms=RETENTION,
    )
    return Log.open(path, config, now_ms=clock)


def clean_after_more(log: Log, clock: Clock, n: int) -> None:
    """A pass at the clock's time (new dirty data first: a pass needs some to run)."""
    put(log, f"filler{n}", "x")
    log.roll()
    plan = cleaner.plan(log, log.log_end_offset, clock.now)
    assert plan is not None
    cleaner.clean_now(plan)


def marker_batches(log: Log) -> dict[int, int | None]:
    """Each marker's offset -> its delete horizon (None: not yet removable)."""
    out = {}
    for segment in log.segments:
        data = segment.path.read_bytes()
        for pos, header in iter_batches(data):
            if header.attributes & CONTROL_FLAG:
                out[header.base_offset] = horizon_of(data, pos, header)
                read_control_batch(data, pos, header)  # still a marker a consumer can read
    return out


def test_markers_go_once_their_transaction_is_gone_and_the_delete_horizon_passed(
    tmp_path: Path,
) -> None:
    clock = Clock()
    log = timed(tmp_path, clock)
    put(log, "k", "aborted", pid=P1)  # 0
    log.append_marker(P1, 0, 0, False, 1)  # 1: abort
    put(log, "j", "committed-old", pid=P2)  # 2
    log.append_marker(P2, 0, 0, True, 1)  # 3: commit, its record overwritten below
    put(log, "j", "committed-new", pid=P2, seq=1)  # 4
    log.append_marker(P2, 0, 0, True, 1)  # 5: commit, its record stays
    put(log, "q", "p1-later", pid=P1, seq=1)  # 6 (P1's last batch: kept whole)
    log.append_marker(P1, 0, 0, True, 1)  # 7
    # Pass 1 drops the aborted record and the overwritten one: their markers stay (the
    # walk met records of theirs), the abort's index entry in the cleaned segment's file.
    clean_after_more(log, clock, 1)
    assert marker_batches(log) == {1: None, 3: None, 5: None, 7: None}
    assert log.txn_index.entries == [AbortedTxn(P1, 0, 1, 2)]
    assert index_path(tmp_path, 0).exists()
    # Pass 2: nothing of transactions 1 and 3 is left: stamped with their delete horizon,
    # and the abort's index entry goes (no reader needs it: no record of it is left).
    clock.now += 1000
    clean_after_more(log, clock, 2)
    horizon = clock.now + RETENTION
    assert marker_batches(log) == {1: horizon, 3: horizon, 5: None, 7: None}
    assert log.txn_index.entries == []
    assert not list(tmp_path.glob("*.txnindex"))
    # Before the horizon they stay (a consumer from the start still sees them) ...
    clock.now = horizon - 1
    clean_after_more(log, clock, 3)
    assert marker_batches(log) == {1: horizon, 3: horizon, 5: None, 7: None}
    # ... and at it they go. Markers with records still in the log never do.
    clock.now = horizon
    clean_after_more(log, clock, 4)
    assert marker_batches(log) == {5: None, 7: None}
    values = [v for _, _, vs in batches(log) for v in vs]
    assert b"committed-new" in values and b"p1-later" in values
    assert b"aborted" not in values and b"committed-old" not in values
    # A restart reads the same state back (files, producer state replay).
    log.close()
    log = timed(tmp_path, clock)
    assert marker_batches(log) == {5: None, 7: None}
    assert log.txn_index.entries == []
    assert log.last_stable_offset(log.log_end_offset) == log.log_end_offset


def test_a_producers_last_word_marker_stays(tmp_path: Path) -> None:
    """A marker that bumped its producer's epoch and is its last entry stays (a replay
    takes the epoch from it: Kafka's lastRecordsOfActiveProducers), past any horizon."""
    clock = Clock()
    log = timed(tmp_path, clock)
    put(log, "k", "aborted", pid=P1)  # 0
    log.append_marker(P1, 0, 0, False, 1)  # 1
    log.append_marker(P1, 1, 1, False, 1)  # 2: the fencing abort, epoch 1, no records
    for n in range(1, 4):
        clock.now += RETENTION
        clean_after_more(log, clock, n)
    assert set(marker_batches(log)) == {2}
    log.close()
    log = timed(tmp_path, clock)
    assert log.producers.producers[P1].epoch == 1


def test_a_crash_at_any_step_of_the_swap_keeps_the_aborted_index_whole(
    tmp_path: Path,
) -> None:
    """The cleaned segment's .txnindex is part of the swap: a crash anywhere leaves the
    old segments with their entries or the new one with its, no stale or orphan file."""
    source = tmp_path / "source"
    log = compacted(source)
    for i in range(12):  # aborted and committed transactions over many segments
        pid = P1 if i % 2 else P2
        put(log, f"k{i % 3}", f"v{i}", pid=pid, seq=i // 2)
        log.append_marker(pid, 0, 0, i % 2 == 0, 1)
        if i == 5:  # the first ones' aborted records dropped: their markers go next
            put(log, "mid", "x")
            log.roll()
            assert clean(log) is not None
    put(log, "last", "x")
    log.roll()
    old = list(log.txn_index.entries)
    log.close()
    # What a whole pass makes, for comparison.
    shutil.copytree(source, tmp_path / "whole")
    whole = compacted(tmp_path / "whole")
    clean(whole)
    new = list(whole.txn_index.entries)
    assert new and len(new) < len(old) and all(e in old for e in new)
    step = 0
    while True:
        work = tmp_path / f"crash-{step}"
        shutil.copytree(source, work)
        log = Log.open(
            work, LogConfig(segment_bytes=100_000, cleanup_policy="compact"), now_ms=lambda: NOW
        )
        plan = cleaner.plan(log, log.log_end_offset, NOW)
        assert plan is not None
        latest = cleaner.build_offset_map(plan, threading.Event())
        [(group, end)] = cleaner.with_ends(plan, latest)  # every segment into one
        assert len(group) > 2
        cleaner.clean_group(plan, group, end, latest, threading.Event())
        steps = swap_steps(work, group[0].base_offset, end)
        for op in steps[:step]:
            op()
        reopened = compacted(work)  # the crash, then a restart
        committed = step >= 1
        assert reopened.txn_index.entries == (new if committed else old), step
        bases = {f"{s.base_offset:020d}" for s in reopened.segments}
        assert {p.stem for p in work.glob("*.txnindex")} <= bases, step
        assert not list(work.glob("*.cleaned")) and not list(work.glob("*.swap"))
        reopened.close()
        if step == len(steps):
            break
        step += 1
