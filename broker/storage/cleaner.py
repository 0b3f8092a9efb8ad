"""Log compaction (Kafka's LogCleaner / Cleaner) for ``cleanup.policy=compact`` logs.

A log is a clean section (cleaned before) followed by a dirty one, up to the first
uncleanable offset: the active segment, anything not wholly below the high watermark,
and segments with a record younger than ``min.compaction.lag.ms`` are never touched.
A pass (``plan`` then ``clean_log``) maps each key of the dirty section to its latest
offset, then rewrites every cleanable segment, grouped up to ``segment.bytes``, keeping a
record when no later record of its key exists. Offsets never change: removed records
leave gaps, as in Kafka. Records without a key are dropped (Kafka's cleaner counts them
invalid), and a tombstone (null value) goes once its batch is older than
``delete.retention.ms``, so a consumer reading from the start within that time still
sees the delete.

Batches: our batches number their records contiguously (``last_offset_delta`` is
``record_count - 1``), so a batch whose records all stay is copied byte for byte, and
one that loses records is re-encoded as one batch per run of consecutive kept offsets,
keeping its leader epoch and, for an idempotent producer, its producer id, epoch and
the runs' own sequence numbers. A run never spans two original batches, so every old
batch boundary stays a boundary (a follower's log end always is one) and followers copy
the cleaned log as it is. A producer's last batch stays whole (Kafka keeps it for the
producer state), so the state a replay rebuilds is the one the log had.

Transactions (Kafka's cleaner): nothing at or above the last stable offset is cleanable
(an open transaction may still abort). An aborted transaction's batches are dropped whole
and their keys never enter the offset map, so they hide no committed record. Markers
(control batches) go once no record of their transaction remains and then
``delete.retention.ms`` has passed (cleaner_txn.py); the cleaned segment's
aborted-transactions index holds the entries of the abort markers it keeps, and is
swapped in with it.

Memory: a pass holds one batch at a time, its records streamed and re-encoded in chunks
(cleaner_batch.py: ``log.cleaner.io.buffer.size``; a batch that does not fit is copied as
it is and logged), and the key -> offset map (offset_map.py), which holds what
``log.cleaner.dedupe.buffer.size`` allows: when it fills, the pass cleans up to the
offset it reached, checkpoints that, and the next pass goes on from there (as Kafka's).

Threads: the reading, decoding, writing, fsyncs and the swap's commit run in a worker
thread on its own file descriptors (the trio loop keeps serving); the rest of the swap
(renames and unlinks) and the in-memory segment list change run on the loop, and only
if the segments are still the ones the pass planned for. Retention and truncation, which
change them, first discard a pass's copies, committed or not (``Log._segments_changing``),
so a restart never completes a swap over segments that changed after it was made.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from minibroker.broker.common.atomic_file import fsync_dir, write_atomic
from minibroker.broker.storage.cleaner_batch import (
    MAX_REPORTED,
    UNREADABLE,
    Budget,
    Output,
    Rewriter,
    Stats,
    Uncleanable,
    keys,
    rows,
    skim,
)
from minibroker.broker.storage.cleaner_txn import DROP, KEEP, CleanedTxns, stamped
from minibroker.broker.storage.log import Log
from minibroker.broker.storage.offset_map import OffsetMap
from minibroker.broker.storage.segment import (
    MAX_RELATIVE_OFFSET,
    IndexBuilder,
    Segment,
    index_bytes,
)
from minibroker.broker.storage.swap import (
    cleaned_index,
    cleaned_log,
    cleaned_time_index,
    cleaned_txn_index,
    commit,
    finish_steps,
)
from minibroker.broker.storage.txn_index import AbortedTxn, pack_entries
from minibroker.protocol.batch import (
    CONTROL_FLAG,
    CRC_START,
    HEADER_SIZE,
    KAFKA_FLAG,
    PRODUCER_FLAG,
    TRANSACTIONAL_FLAG,
    BatchHeader,
    CorruptBatch,
    batch_size_at,
    check_batch,
    check_wrapped_header,
    crc_span,
    producer_fields,
    unpack_header,
)

CHECKPOINT = "cleaner-offset-checkpoint"
READ_CHUNK = 1 << 20
# The worker thread lets go of the GIL this often. Otherwise CPython hands it over only
# after the waiter's switch interval, several times per loop wake-up. Measured with
# `minibroker bench cleaner` (3 runs of 3 rounds each): loop lateness p99 12-14 ms never
# letting go, 5-6 ms after every batch (the pass 3x slower: a sleep(0) costs ~100 us),
# 6-9.5 ms at this interval, for a pass time within the runs' noise.
YIELD_S = 0.0005


class CleaningAborted(Exception):
    """The pass stopped (broker shutting down) or its segments changed under it."""


@dataclass
class Plan:
    """What one pass over one log will clean, fixed on the trio loop before it starts."""

    log: Log
    segments: list[Segment]  # every cleanable segment, log start first
    sizes: list[int]
    first_dirty: int
    first_uncleanable: int
    dirty_ratio: float
    now_ms: int
    protected: frozenset[int]  # last offsets of each producer's last batch: kept whole
    changes: int  # the log's retention/truncation count when planned
    budget: Budget = field(default_factory=Budget)
    # Aborted transactions below first_uncleanable: producer id -> ((first, marker), ...),
    # copied from the aborted-transactions index when planned (the worker reads it).
    aborted: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    # The walk through transactions, group after group (cleaner_txn.py).
    txns: CleanedTxns = field(default_factory=lambda: CleanedTxns((), {}))

    def skips(self, buf: bytes, pos: int, header: BatchHeader) -> bool:
        """Whether a batch is a marker (copied as it is) or an aborted transaction's
        (dropped), rather than records to compact: per batch, nothing for others."""
        attributes = header.attributes
        if not attributes & (CONTROL_FLAG | TRANSACTIONAL_FLAG):
            return False
        return bool(attributes & CONTROL_FLAG) or self.is_aborted(buf, pos, header)

    def is_aborted(self, buf: bytes, pos: int, header: BatchHeader) -> bool:
        if not header.attributes & TRANSACTIONAL_FLAG or not header.attributes & PRODUCER_FLAG:
            return False
        ranges = self.aborted.get(producer_fields(buf, pos, header)[0])
        offset = header.base_offset
        return ranges is not None and any(first <= offset < last for first, last in ranges)

    def size_of(self, segment: Segment) -> int:
        """Its size when planned: the bytes the worker reads (sealed files do not grow)."""
        return self.sizes[self.segments.index(segment)]

    @property
    def dirty(self) -> list[Segment]:
        """Segments with dirty records: the first may start below ``first_dirty`` (a pass
        whose offset map filled stopped inside it)."""
        return [s for s in self.segments if s.next_offset > self.first_dirty]

    @property
    def record_limit(self) -> int:
        return self.budget.record_limit(self.log.config.max_message_bytes)


@dataclass
class Cleaned:
    """The worker's copy of one group of segments, written as ``.cleaned`` files."""

    base: int
    end: int  # base offset of the segment after the group: what the swap replaces up to
    next_offset: int
    max_timestamp: int
    mtime_ns: int
    size: int
    index: IndexBuilder
    aborted: list[AbortedTxn]  # its .txnindex entries


# --- the clean/dirty boundary ------------------------------------------------------------------


def first_dirty_offset(log: Log) -> int:
    """The checkpointed start of the dirty section (Kafka's cleaner-offset-checkpoint)."""
    if log.first_dirty_offset is None:
        try:
            log.first_dirty_offset = int((log.dir / CHECKPOINT).read_text().strip())
        except (FileNotFoundError, ValueError):
            log.first_dirty_offset = log.log_start_offset
    return max(log.first_dirty_offset, log.log_start_offset)


def _checkpoint(log: Log, offset: int) -> None:
    log.first_dirty_offset = offset
    write_atomic(log.dir / CHECKPOINT, b"%d\n" % offset)


def plan(log: Log, high_watermark: int, now_ms: int, budget: Budget | None = None) -> Plan | None:
    """The pass this log needs now, or None (not compacted, nothing dirty, ratio too low)."""
    cfg = log.config
    if not cfg.compact or log.closed or len(log.segments) < 2:
        return None
    lag = cfg.min_compaction_lag_ms
    cleanable: list[Segment] = []
    segments = log.segments
    # Only what every in-sync replica has (as retention), and no undecided transaction.
    stable = log.last_stable_offset(high_watermark)
    for i, segment in enumerate(segments[:-1]):
        if segments[i + 1].base_offset > stable:
            break
        if lag > 0 and segment.max_timestamp > now_ms - lag:
            break
        cleanable.append(segment)
    if not cleanable:
        return None
    first_dirty = first_dirty_offset(log)
    uncleanable = segments[len(cleanable)].base_offset
    dirty_bytes = sum(s.size for s in cleanable if s.next_offset > first_dirty)
    total = sum(s.size for s in cleanable)
    if dirty_bytes == 0:
        return None
    ratio = dirty_bytes / total
    if ratio < cfg.min_cleanable_dirty_ratio:
        return None
    protected = frozenset(
        e.batches[-1].last_offset for e in log.producers.producers.values() if e.batches
    )
    aborted: dict[int, list[tuple[int, int]]] = {}
    reaching = [e for e in log.txn_index.entries if e.first_offset < uncleanable]
    for entry in reaching:
        aborted.setdefault(entry.producer_id, []).append((entry.first_offset, entry.last_offset))
    # Producers whose last entry is a marker (a bumped epoch cleared their batches).
    last_word = {p.producer_id: p.epoch for p in log.producers.producers.values() if not p.batches}
    return Plan(
        log,
        cleanable,
        [s.size for s in cleanable],
        first_dirty,
        uncleanable,
        ratio,
        now_ms,
        protected,
        log.changes,
        dataclasses.replace(budget or Budget(), max_decompressed=cfg.max_decompressed_bytes),
        {pid: tuple(ranges) for pid, ranges in aborted.items()},
        CleanedTxns(reaching, last_word),
    )


def groups(plan: Plan, end: int) -> list[list[Segment]]:
    """Consecutive segments below ``end`` (the offset map's reach) whose sizes add up to at
    most ``segment.bytes`` (Kafka's groupSegmentsBySize): each becomes one cleaned segment."""
    limit = plan.log.config.segment_bytes
    out: list[list[Segment]] = []
    for segment in plan.segments:
        if segment.base_offset >= end:
            break
        group = out[-1] if out else None
        if (
            group
            and sum(s.size for s in group) + segment.size <= limit
            and segment.next_offset - 1 - group[0].base_offset <= MAX_RELATIVE_OFFSET
        ):
            group.append(segment)
        else:
            out.append([segment])
    return out


# --- the worker thread's part ------------------------------------------------------------------


class _Yielder:
    """Lets go of the GIL after every YIELD_S of work, and stops the pass when asked to.
    One per phase of a pass, shared by its loops: the interval is the phase's work, and
    a sleep that took long (the machine busy) does not count as work."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.last = time.perf_counter()

    def __call__(self) -> None:
        now = time.perf_counter()
        if now - self.last >= YIELD_S:
            if self.stop.is_set():
                raise CleaningAborted("stopping")
            time.sleep(0)  # let go of the GIL: the loop gets it if it waits
            self.last = time.perf_counter()


def _batches(
    path: Path, size: int, stop: threading.Event, limit: int, pause: _Yielder
) -> Iterator[tuple[bytes | None, int, int]]:
    """``(buffer, position in it, batch size)`` for each whole batch of a segment file,
    read through a descriptor of our own in ``READ_CHUNK`` reads; a batch larger than
    ``limit`` is not read but given as ``(None, file position, size)``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        position = 0
        while position < size:
            if stop.is_set():
                raise CleaningAborted("stopping")
            chunk = os.pread(fd, min(READ_CHUNK, size - position), position)
            at = 0
            while True:
                length = batch_size_at(chunk, at)
                if length is None or at + length > len(chunk):
                    break
                if length < HEADER_SIZE:
                    raise CorruptBatch(f"bad batch length at byte {position + at} of {path}")
                yield chunk, at, length
                at += length
                pause()
            if at == 0:  # one batch larger than the chunk: read it whole, within the limit
                length = batch_size_at(chunk, 0)
                if length is None or length < HEADER_SIZE or position + length > size:
                    raise CorruptBatch(f"torn batch at byte {position} of {path}")
                if length > limit:
                    yield None, position, length
                else:
                    yield os.pread(fd, length, position), 0, length
                at = length
            position += at
    finally:
        os.close(fd)


def build_offset_map(plan: Plan, stop: threading.Event) -> OffsetMap:
    """Each key of the dirty section -> its latest offset, in the dedupe buffer's budget.
    Its ``reached`` is ``first_uncleanable``, or the offset where it filled (Kafka's
    buildOffsetMap: this pass cleans below it, the next one goes on from there)."""
    latest = OffsetMap(plan.budget.dedupe_buffer_size)
    first_dirty = plan.first_dirty
    limit = plan.record_limit
    pause = _Yielder(stop)
    for segment in plan.dirty:
        for buf, pos, length in _batches(segment.path, plan.size_of(segment), stop, limit, pause):
            if buf is None:
                continue  # too large to read: copied as it is, its keys unmapped (kept)
            # CRC checked: a copy must never launder a damaged batch into a valid one.
            header = check_batch(buf, pos, length)
            if header.next_offset <= first_dirty or plan.skips(buf, pos, header):
                continue  # a marker's or an aborted transaction's keys shadow nothing
            base = header.base_offset
            put = latest.put
            try:
                for i, key in enumerate(keys(buf, pos, header, plan.budget, limit)):
                    if key is not None and base + i >= first_dirty and not put(key, base + i):
                        latest.reached = base + i
                        return latest
                    if not i & 0xFFF:
                        pause()
            except UNREADABLE:
                continue  # copied as it is by clean_group, which reports it
    latest.reached = plan.first_uncleanable
    return latest


def _clean_batch(
    buf: bytes,
    pos: int,
    header: BatchHeader,
    latest: OffsetMap,
    plan: Plan,
    out: Output,
    stats: Stats,
    pause: _Yielder,
) -> None:
    """Write one batch's kept records, or the batch as it is."""
    length = header.size
    attributes = header.attributes
    if attributes & CONTROL_FLAG:
        _clean_marker(buf, pos, header, plan, out, stats)
        return
    aborted = attributes & TRANSACTIONAL_FLAG and _aborted(buf, pos, header, plan)
    if attributes & PRODUCER_FLAG and header.last_offset in plan.protected:
        out.add(memoryview(buf)[pos : pos + length], header)
        return
    if aborted:
        stats.records_read += header.record_count  # an aborted transaction's: dropped
        return
    base = header.base_offset
    ts = header.max_timestamp
    tombstones_expire = ts >= 0 and plan.now_ms - ts > plan.log.config.delete_retention_ms
    mark = out.mark()
    rewriter = Rewriter(buf, pos, header, out, plan.budget.half)
    get = latest.get
    keep = rewriter.keep
    run = rewriter.run
    count = 0
    try:
        if header.attributes & KAFKA_FLAG and not _loses_records(
            buf, pos, header, latest, plan, tombstones_expire, pause
        ):
            out.add(memoryview(buf)[pos : pos + length], header)
            stats.records_read += header.record_count
            stats.records_kept += header.record_count
            return
        for i, row in enumerate(rows(buf, pos, header, plan.budget, plan.record_limit)):
            key = row[1]
            if (
                key is not None
                and get(key) <= base + i
                and not (row[2] is None and tombstones_expire)
            ):
                keep(i, row)
            elif run or not rewriter.dropped:
                rewriter.drop()
            count = i + 1
            if not i & 0xFFF:
                pause()
        rewritten = rewriter.finish()
    except (*UNREADABLE, ValueError, OverflowError, struct.error) as exc:
        # Uncleanable, or records that decode but cannot be encoded again (a timestamp
        # delta past int64 ...): bytes nothing checked on their way in. Kept as they are.
        out.rollback(mark)
        out.add(memoryview(buf)[pos : pos + length], header)
        reason = str(exc) if isinstance(exc, UNREADABLE) else f"{type(exc).__name__}: {exc}"
        stats.note_copied(base, reason)
        return
    stats.records_read += count
    stats.records_kept += rewriter.kept
    if not rewritten:
        if rewriter.encoded:
            out.rollback(mark)
        out.add(memoryview(buf)[pos : pos + length], header)


def _aborted(buf: bytes, pos: int, header: BatchHeader, plan: Plan) -> bool:
    """A transactional batch met on the walk: whether its transaction was aborted."""
    producer = producer_fields(buf, pos, header)
    if producer is None:
        return False
    return plan.txns.on_batch(producer[0], header.last_offset, True)


def _clean_marker(
    buf: bytes, pos: int, header: BatchHeader, plan: Plan, out: Output, stats: Stats
) -> None:
    """A marker stays, goes, or is written again with its delete horizon (cleaner_txn.py)."""
    fate = KEEP
    if header.attributes & PRODUCER_FLAG:
        fate = plan.txns.marker(buf, pos, header, plan.now_ms)
    stats.records_read += header.record_count
    if fate == KEEP:
        out.add(memoryview(buf)[pos : pos + header.size], header)
    elif fate == DROP:
        return
    else:
        horizon = plan.now_ms + plan.log.config.delete_retention_ms
        data = stamped(buf, pos, header, horizon)
        out.add(data, unpack_header(data))
    stats.records_kept += header.record_count


def _loses_records(
    buf: bytes,
    pos: int,
    header: BatchHeader,
    latest: OffsetMap,
    plan: Plan,
    tombstones_expire: bool,
    pause: _Yielder,
) -> bool:
    """Whether a stock client's batch loses records, read with its values skipped; and
    Uncleanable if one record is over the limit (rewriting holds each kept one whole)."""
    base = header.base_offset
    get = latest.get
    limit = plan.record_limit
    loses = False
    for i, (key, null, size) in enumerate(skim(buf, pos, header, plan.budget, limit)):
        if size > limit:
            raise Uncleanable(f"record {base + i} holds {size} bytes, over the {limit}-byte limit")
        if key is None or get(key) > base + i or (null and tombstones_expire):
            loses = True
        if not i & 0xFFF:
            pause()
    return loses


def _copy_streamed(
    plan: Plan, path: Path, position: int, length: int, out: Output, stats: Stats
) -> None:
    """A batch over the read limit, copied in READ_CHUNK pieces, its CRC checked on the
    way (a damaged one fails the pass, as anywhere)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        head = os.pread(fd, min(READ_CHUNK, length), position)
        header = unpack_header(head)
        if header.record_count <= 0 or header.last_offset_delta != header.record_count - 1:
            raise CorruptBatch(f"batch at byte {position} of {path}: bad record count")
        if header.attributes & TRANSACTIONAL_FLAG:  # copied, aborted or not: its marker stays
            _aborted(head, 0, header, plan)
        out.index.add(out.written, header.base_offset, length, header.max_timestamp)
        start, checksum = crc_span(head, 0, header)
        if start != CRC_START:
            check_wrapped_header(head, 0, header)
        crc = checksum(memoryview(head)[start:])
        out.add_raw(head)
        done = len(head)
        while done < length:
            piece = os.pread(fd, min(READ_CHUNK, length - done), position + done)
            if not piece:
                raise CorruptBatch(f"batch at byte {position} of {path} is cut off")
            crc = checksum(piece, crc)
            out.add_raw(piece)
            done += len(piece)
        if crc != header.crc:
            raise CorruptBatch(f"batch at byte {position} of {path}: CRC does not match")
    finally:
        os.close(fd)
    out.next_offset = header.next_offset
    out.max_timestamp = max(out.max_timestamp, header.max_timestamp)
    stats.note_copied(header.base_offset, f"batch of {length} bytes is over the read limit")


def clean_group(
    plan: Plan, group: list[Segment], end: int, latest: OffsetMap, stop: threading.Event
) -> tuple[Cleaned, Stats]:
    """Write the group's cleaned copy as ``.cleaned`` files (fsynced); nothing is swapped."""
    directory = plan.log.dir
    base = group[0].base_offset
    stats = Stats(segments=[s.base_offset for s in group])
    limit = plan.record_limit
    pause = _Yielder(stop)
    path = cleaned_log(directory, base)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    out = Output(fd, base, max(1, plan.log.config.index_interval_bytes))
    try:
        for segment in group:
            size = plan.size_of(segment)
            stats.bytes_read += size
            for buf, pos, length in _batches(segment.path, size, stop, limit, pause):
                if buf is None:
                    _copy_streamed(plan, segment.path, pos, length, out, stats)
                    continue
                header = check_batch(buf, pos, length)
                _clean_batch(buf, pos, header, latest, plan, out, stats, pause)
        out.flush()
        os.fsync(fd)
    finally:
        os.close(fd)
    # Keep the sources' age (Kafka sets the cleaned segment's lastModified so): the
    # segment is no younger for retention and segment.ms than the records it holds.
    mtime_ns = max(os.stat(s.path).st_mtime_ns for s in group)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    index = out.index
    with open(cleaned_index(directory, base), "wb") as fh:
        fh.write(index_bytes(index.offsets, index.positions))
    with open(cleaned_time_index(directory, base), "wb") as fh:
        fh.write(index.time_entries)
    # Not derived from the segment alone (recovery could not rebuild it): durable before
    # the commit, as the log copy is.
    aborted = plan.txns.take_index()
    with open(cleaned_txn_index(directory, base), "wb") as fh:
        fh.write(pack_entries(aborted))
        fh.flush()
        os.fsync(fh.fileno())
    written = out.written
    stats.bytes_written = written
    cleaned = Cleaned(
        base,
        end,
        out.next_offset,
        out.max_timestamp,
        mtime_ns,
        written,
        index,
        aborted,
    )
    return cleaned, stats


# --- the loop's part ----------------------------------------------------------------------------


def still_planned(plan: Plan, group: list[Segment]) -> bool:
    """The group is still the log's, sealed, unchanged: the swap may go ahead."""
    log = plan.log
    if log.closed or log.changes != plan.changes:
        return False
    try:
        i = log.segments.index(group[0])
    except ValueError:
        return False
    return (
        log.segments[i : i + len(group)] == group
        and i + len(group) < len(log.segments)
        and all(s.size == plan.size_of(s) and not s.active for s in group)
    )


def swap_in(plan: Plan, group: list[Segment], cleaned: Cleaned) -> Segment:
    """After ``swap.commit``: replace the old segments on disk, then in memory. Renames and
    unlinks only (the loop's part: no fsync, see swap.py)."""
    log = plan.log
    for step in finish_steps(log.dir, cleaned.base, cleaned.end):
        step()
    segment = Segment(log.dir, cleaned.base, log.config.index_interval_bytes, plan.now_ms)
    segment.next_offset = cleaned.next_offset
    segment.max_timestamp = cleaned.max_timestamp
    segment.created_ms = cleaned.mtime_ns // 1_000_000
    segment.install_index(cleaned.index)
    log.replace_segments(group, segment, cleaned.aborted)
    return segment


def discard(plan: Plan, cleaned_base: int) -> None:
    cleaned_log(plan.log.dir, cleaned_base).unlink(missing_ok=True)
    cleaned_index(plan.log.dir, cleaned_base).unlink(missing_ok=True)
    cleaned_time_index(plan.log.dir, cleaned_base).unlink(missing_ok=True)
    cleaned_txn_index(plan.log.dir, cleaned_base).unlink(missing_ok=True)


def finish(plan: Plan, latest: OffsetMap | None = None) -> None:
    """The pass cleaned everything below what its offset map reached
    (``first_uncleanable``, or where the map filled): that is the new boundary."""
    _checkpoint(plan.log, _reached(plan, latest))


def clean_now(plan: Plan) -> Stats:
    """A whole pass in the calling thread (tests and tools; the broker's runs in
    ``cleaner_manager``, its IO in a worker thread)."""
    stop = threading.Event()
    total = Stats()
    latest = build_offset_map(plan, stop)
    for group, end in with_ends(plan, latest):
        cleaned, stats = clean_group(plan, group, end, latest, stop)
        _add(total, stats)
        commit(plan.log.dir, cleaned.base, cleaned.end)
        swap_in(plan, group, cleaned)
    fsync_dir(plan.log.dir)
    finish(plan, latest)
    return total


def _reached(plan: Plan, latest: OffsetMap | None) -> int:
    if latest is None or latest.reached is None:
        return plan.first_uncleanable
    return latest.reached


def with_ends(plan: Plan, latest: OffsetMap | None = None) -> list[tuple[list[Segment], int]]:
    """Each group below what the offset map reached (all, without one), with the base
    offset of the segment after it (the swap's end)."""
    reached = _reached(plan, latest)
    out = []
    segments = plan.log.segments
    for group in groups(plan, reached):
        after = segments[segments.index(group[-1]) + 1]
        out.append((group, after.base_offset))
    return out


def _add(total: Stats, stats: Stats) -> None:
    total.bytes_read += stats.bytes_read
    total.bytes_written += stats.bytes_written
    total.records_read += stats.records_read
    total.records_kept += stats.records_kept
    total.segments += stats.segments
    total.copied += stats.copied[: max(0, MAX_REPORTED - len(total.copied))]
    total.copied_count += stats.copied_count
