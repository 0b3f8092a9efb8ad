"""The log cleaner and transactions (Kafka's cleaner): aborted transactions' records are
dropped and shadow nothing, markers stay, nothing at or above the LSO is cleaned, and the
aborted-transactions index follows the cleaned segments."""

from __future__ import annotations

from pathlib import Path

from minibroker.broker.storage import Log, LogConfig, cleaner
from minibroker.broker.storage.txn_index import AbortedTxn, index_path
from minibroker.protocol import encode_batch, iter_batches
from minibroker.protocol.batch import CONTROL_FLAG, TRANSACTIONAL_FLAG, decode_rows

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
