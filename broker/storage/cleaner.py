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

Threads: the reading, decoding, writing, fsyncs and the swap's commit run in a worker
thread on its own file descriptors (the trio loop keeps serving); the rest of the swap
(renames and unlinks) and the in-memory segment list change run on the loop, and only
if the segments are still the ones the pass planned for. Retention and truncation, which
change them, first discard a pass's copies, committed or not (``Log._segments_changing``),
so a restart never completes a swap over segments that changed after it was made.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from minibroker.broker.common.atomic_file import fsync_dir, write_atomic
from minibroker.broker.storage.log import Log
from minibroker.broker.storage.segment import (
    MAX_RELATIVE_OFFSET,
    Segment,
    build_index,
    index_bytes,
)
from minibroker.broker.storage.swap import cleaned_index, cleaned_log, commit, finish_steps
from minibroker.protocol.batch import (
    HEADER_SIZE,
    PRODUCER_FLAG,
    BatchHeader,
    batch_size_at,
    check_batch,
    decode_rows,
    encode_batch,
    increment_sequence,
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

    def size_of(self, segment: Segment) -> int:
        """Its size when planned: the bytes the worker reads (sealed files do not grow)."""
        return self.sizes[self.segments.index(segment)]

    @property
    def dirty(self) -> list[Segment]:
        return [s for s in self.segments if s.base_offset >= self.first_dirty]


@dataclass
class Cleaned:
    """The worker's copy of one group of segments, written as ``.cleaned`` files."""

    base: int
    end: int  # base offset of the segment after the group: what the swap replaces up to
    next_offset: int
    max_timestamp: int
    mtime_ns: int
    size: int
    index: tuple[list[int], list[int], int]


@dataclass
class Stats:
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    segments: list[int] = field(default_factory=list)


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


def plan(log: Log, high_watermark: int, now_ms: int) -> Plan | None:
    """The pass this log needs now, or None (not compacted, nothing dirty, ratio too low)."""
    cfg = log.config
    if not cfg.compact or log.closed or len(log.segments) < 2:
        return None
    lag = cfg.min_compaction_lag_ms
    cleanable: list[Segment] = []
    segments = log.segments
    for i, segment in enumerate(segments[:-1]):
        if segments[i + 1].base_offset > high_watermark:
            break  # as retention: only what every in-sync replica has
        if lag > 0 and segment.max_timestamp > now_ms - lag:
            break
        cleanable.append(segment)
    if not cleanable:
        return None
    first_dirty = first_dirty_offset(log)
    uncleanable = segments[len(cleanable)].base_offset
    dirty_bytes = sum(s.size for s in cleanable if s.base_offset >= first_dirty)
    total = sum(s.size for s in cleanable)
    if dirty_bytes == 0:
        return None
    ratio = dirty_bytes / total
    if ratio < cfg.min_cleanable_dirty_ratio:
        return None
    protected = frozenset(
        e.batches[-1].last_offset for e in log.producers.producers.values() if e.batches
    )
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
    )


def groups(plan: Plan) -> list[list[Segment]]:
    """Consecutive segments whose sizes add up to at most ``segment.bytes`` (Kafka's
    groupSegmentsBySize): each group becomes one cleaned segment."""
    limit = plan.log.config.segment_bytes
    out: list[list[Segment]] = []
    for segment in plan.segments:
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


def _batches(path: Path, size: int, stop: threading.Event) -> Iterator[tuple[bytes, int, int]]:
    """``(buffer, position in it, batch size)`` for each whole batch of a segment file,
    read through a descriptor of our own in ``READ_CHUNK`` reads."""
    fd = os.open(path, os.O_RDONLY)
    last_yield = time.perf_counter()
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
                    raise CleaningAborted(f"bad batch length at byte {position + at} of {path}")
                yield chunk, at, length
                at += length
                now = time.perf_counter()
                if now - last_yield >= YIELD_S:
                    time.sleep(0)  # let go of the GIL: the loop gets it if it waits
                    last_yield = now
            if at == 0:  # one batch larger than the chunk: read it whole
                length = batch_size_at(chunk, 0)
                if length is None or position + length > size:
                    raise CleaningAborted(f"torn batch at byte {position} of {path}")
                big = os.pread(fd, length, position)
                yield big, 0, length
                at = length
            position += at
    finally:
        os.close(fd)


def build_offset_map(plan: Plan, stop: threading.Event) -> dict[bytes, int]:
    """Each key of the dirty section -> its latest offset (Kafka's SkimpyOffsetMap, as a
    dict: exact, and as large as the dirty section's distinct keys)."""
    latest: dict[bytes, int] = {}
    for segment in plan.dirty:
        for buf, pos, length in _batches(segment.path, plan.size_of(segment), stop):
            # CRC checked: a copy must never launder a damaged batch into a valid one.
            header = check_batch(buf, pos, length)
            base = header.base_offset
            for i, row in enumerate(decode_rows(buf, pos, header)):
                if row[1] is not None:
                    latest[row[1]] = base + i
    return latest


def _kept_batches(
    buf: bytes,
    pos: int,
    header: BatchHeader,
    latest: dict[bytes, int],
    plan: Plan,
    stats: Stats,
) -> list[bytes] | None:
    """The batches to write for one batch: None to copy it as it is."""
    if header.attributes & PRODUCER_FLAG and header.last_offset in plan.protected:
        return None
    rows = decode_rows(buf, pos, header)
    stats.records_read += len(rows)
    base = header.base_offset
    ts = header.max_timestamp
    tombstones_expire = ts >= 0 and plan.now_ms - ts > plan.log.config.delete_retention_ms
    kept = [
        i
        for i, row in enumerate(rows)
        if row[1] is not None
        and latest.get(row[1], -1) <= base + i
        and not (row[2] is None and tombstones_expire)
    ]
    stats.records_kept += len(kept)
    if len(kept) == len(rows):
        return None
    producer = producer_fields(buf, pos, header)
    out = []
    first_ts = header.first_timestamp
    start = 0
    while start < len(kept):
        end = start + 1
        while end < len(kept) and kept[end] == kept[end - 1] + 1:
            end += 1
        run = [
            (first_ts + rows[i][0], rows[i][1], rows[i][2], rows[i][3] if len(rows[i]) == 4 else ())
            for i in kept[start:end]
        ]
        extra = {}
        if producer is not None:
            pid, epoch, seq = producer
            extra = {
                "producer_id": pid,
                "producer_epoch": epoch,
                "base_sequence": increment_sequence(seq, kept[start]),
            }
        out.append(
            encode_batch(
                run, base_offset=base + kept[start], leader_epoch=header.leader_epoch, **extra
            )
        )
        start = end
    return out


def clean_group(
    plan: Plan, group: list[Segment], end: int, latest: dict[bytes, int], stop: threading.Event
) -> tuple[Cleaned, Stats]:
    """Write the group's cleaned copy as ``.cleaned`` files (fsynced); nothing is swapped."""
    directory = plan.log.dir
    base = group[0].base_offset
    stats = Stats(segments=[s.base_offset for s in group])
    batches: list[tuple[int, int, int]] = []
    next_offset = base
    max_ts = -1
    written = 0
    pending: list[bytes] = []
    pending_bytes = 0
    path = cleaned_log(directory, base)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for segment in group:
            size = plan.size_of(segment)
            stats.bytes_read += size
            for buf, pos, length in _batches(segment.path, size, stop):
                header = check_batch(buf, pos, length)
                out = _kept_batches(buf, pos, header, latest, plan, stats)
                for data in [buf[pos : pos + length]] if out is None else out:
                    h = unpack_header(data) if out is not None else header
                    batches.append((written, h.base_offset, len(data)))
                    written += len(data)
                    next_offset = h.base_offset + h.last_offset_delta + 1
                    max_ts = max(max_ts, h.max_timestamp)
                    pending.append(data)
                    pending_bytes += len(data)
                if pending_bytes >= READ_CHUNK:
                    _write_all(fd, b"".join(pending))
                    pending, pending_bytes = [], 0
        _write_all(fd, b"".join(pending))
        os.fsync(fd)
    finally:
        os.close(fd)
    # Keep the sources' age (Kafka sets the cleaned segment's lastModified so): the
    # segment is no younger for retention and segment.ms than the records it holds.
    mtime_ns = max(os.stat(s.path).st_mtime_ns for s in group)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    index = build_index(batches, base, max(1, plan.log.config.index_interval_bytes))
    with open(cleaned_index(directory, base), "wb") as fh:
        fh.write(index_bytes(index[0], index[1]))
    stats.bytes_written = written
    return Cleaned(base, end, next_offset, max_ts, mtime_ns, written, index), stats


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


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
    segment.install_index(*cleaned.index)
    log.replace_segments(group, segment)
    return segment


def discard(plan: Plan, cleaned_base: int) -> None:
    cleaned_log(plan.log.dir, cleaned_base).unlink(missing_ok=True)
    cleaned_index(plan.log.dir, cleaned_base).unlink(missing_ok=True)


def finish(plan: Plan) -> None:
    """The pass cleaned everything below ``first_uncleanable``: that is the new boundary."""
    _checkpoint(plan.log, plan.first_uncleanable)


def clean_now(plan: Plan) -> Stats:
    """A whole pass in the calling thread (tests and tools; the broker's runs in
    ``cleaner_manager``, its IO in a worker thread)."""
    stop = threading.Event()
    total = Stats()
    latest = build_offset_map(plan, stop)
    for group, end in with_ends(plan):
        cleaned, stats = clean_group(plan, group, end, latest, stop)
        _add(total, stats)
        commit(plan.log.dir, cleaned.base, cleaned.end)
        swap_in(plan, group, cleaned)
    fsync_dir(plan.log.dir)
    finish(plan)
    return total


def with_ends(plan: Plan) -> list[tuple[list[Segment], int]]:
    """Each group with the base offset of the segment after it (the swap's end)."""
    out = []
    segments = plan.log.segments
    for group in groups(plan):
        after = segments[segments.index(group[-1]) + 1]
        out.append((group, after.base_offset))
    return out


def _add(total: Stats, stats: Stats) -> None:
    total.bytes_read += stats.bytes_read
    total.bytes_written += stats.bytes_written
    total.records_read += stats.records_read
    total.records_kept += stats.records_kept
    total.segments += stats.segments
