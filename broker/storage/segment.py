"""One segment: a file of concatenated batches plus its sparse offset and time indexes.

The file holds batches exactly as they travel on the wire. The index maps a
relative offset to a file position about every ``index_interval_bytes``; a read
bisects it, reads from that position in one pread and walks batch headers in memory.

The offset index is a cache: it is kept in memory, written to its file lazily (on
flush, roll and close, so an append costs exactly one ``os.write``), and checked against
the batch headers when the log is opened, where a missing, stale or garbled index
file is rewritten. The time index (``.timeindex``, time_index.py) is made at the offset
index's entries, written and checked the same way, but read from its file.

File handles are a budget (a broker with many partitions would otherwise run out):
only the active segment keeps its log file open; the index file is opened just for
the moment it is written or checked; a sealed (rolled) segment opens its log file on
the first read and sits in a small process-wide LRU of open handles, so a partition
at rest costs about one descriptor.

The index stores a relative offset and a file position as signed 32-bit integers:
``fits`` tells the log when a segment must roll before either could overflow, and a
scan stops at a batch the index could not hold (recovery cuts there).
"""

from __future__ import annotations

import errno
import os
import struct
from bisect import bisect_right
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

from minibroker.broker.common.descriptors import SEALED_OPEN
from minibroker.broker.storage import time_index
from minibroker.broker.storage.time_index import TIME_ENTRY
from minibroker.protocol.batch import (
    BASE_AND_LENGTH,
    HEADER,
    HEADER_SIZE,
    LAST_DELTA,
    LAST_DELTA_AT,
    LOG_OVERHEAD,
    PRODUCER_FIELDS,
    PRODUCER_FLAG,
    CorruptBatch,
    check_batch,
)

_INDEX_ENTRY = struct.Struct(">ii")  # relative offset, file position
# The fields a header walk needs, by their byte positions in the batch header.
# Recovery and header scans read the file in chunks this big (a batch larger than a
# chunk is read on its own), so a scan is a handful of preads, not one per batch.
SCAN_CHUNK = 1 << 20
# Largest relative offset and file position the index's ">ii" entries can hold.
MAX_RELATIVE_OFFSET = 2**31 - 1
MAX_POSITION = 2**31 - 1
# Sealed segments' log files kept open at once, over all partitions of the process.
MAX_OPEN_SEALED = SEALED_OPEN  # budgeted in broker/common/descriptors.py


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class BatchInfo(NamedTuple):
    """What a scan learns about one batch without decoding its records."""

    position: int
    base_offset: int
    size: int
    next_offset: int
    max_timestamp: int
    # (producer_id, producer_epoch, base_sequence) of an idempotent producer's batch.
    producer: tuple[int, int, int] | None = None
    attributes: int = 0  # the batch's attributes (transactional, control: batch.py)


class ScanResult(NamedTuple):
    batches: list[BatchInfo]
    valid_bytes: int  # every byte below this is a whole, consistent batch
    next_offset: int
    max_timestamp: int
    problem: str | None  # why the scan stopped before the end of the file, if it did


class Segment:
    __slots__ = (
        "_fd",
        "_index_written",
        "active",
        "base_offset",
        "created_ms",
        "index",
        "index_path",
        "max_timestamp",
        "next_offset",
        "path",
        "size",
        "time_path",
    )

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        interval: int,
        now_ms: int,
        *,
        fresh: bool = False,
    ) -> None:
        """Describe the segment starting at ``base_offset``; no file stays open yet.

        ``fresh`` empties (or creates) the files at that name (a crash between the two
        unlinks of a deleted segment can leave a stale index behind, for instance).
        """
        self.base_offset = base_offset
        self.path = directory / (segment_name(base_offset) + ".log")
        self.index_path = directory / (segment_name(base_offset) + ".index")
        self.time_path = directory / (segment_name(base_offset) + time_index.SUFFIX)
        self._fd: int | None = None
        self.active = False
        if fresh:
            for path in (self.path, self.index_path, self.time_path):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
            self.size = 0
        else:
            try:
                self.size = os.stat(self.path).st_size
            except FileNotFoundError:
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644))
                self.size = 0
        # Both indexes, made batch by batch as recovery makes them. Its offset-index
        # entries stay (every read bisects them); its time-index bytes are only those not
        # yet in the file (a lookup reads the file).
        self.index = IndexBuilder(base_offset, max(1, interval))
        self._index_written = 0  # offset-index entries in the file
        self.max_timestamp = -1
        self.next_offset = base_offset
        self.created_ms = now_ms

    # --- file handles ---------------------------------------------------------------------

    @property
    def fd(self) -> int:
        """The log file's descriptor, opened on demand (sealed ones through the LRU)."""
        fd = self._fd
        if fd is None:
            fd = self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            if not self.active:
                _SEALED.admit(self)
        elif not self.active:
            _SEALED.touch(self)
        return fd

    def activate(self) -> None:
        """Make this the partition's write target: its log file stays open."""
        _SEALED.forget(self)
        self.active = True
        _ = self.fd

    def seal(self) -> None:
        """No longer written: give the descriptor back (reads reopen it through the LRU)."""
        self.active = False
        self.close_handle()

    def close_handle(self) -> None:
        _SEALED.forget(self)
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    @property
    def index_offsets(self) -> list[int]:
        """Relative offsets of the offset index's entries (strictly increasing)."""
        return self.index.offsets

    @property
    def index_positions(self) -> list[int]:
        """Their file positions: each the start of the batch at that offset."""
        return self.index.positions

    def fits(self, size: int, next_offset: int) -> bool:
        """Whether ``size`` more bytes ending before ``next_offset`` stay indexable here."""
        return (
            self.size + size <= MAX_POSITION
            and next_offset - 1 - self.base_offset <= MAX_RELATIVE_OFFSET
        )

    # --- writing --------------------------------------------------------------------------

    def append(
        self,
        data: bytes | bytearray | memoryview,
        first_offset: int,
        next_offset: int,
        max_ts: int,
        batch_starts: list[tuple[int, int, int]] | None = None,
    ) -> None:
        """Append whole batches with one ``os.write``.

        ``batch_starts`` lists ``(position in data, base offset, max timestamp)`` of each
        batch so the indexes get an entry every ``interval`` bytes even inside one large
        request; without it only the first batch can be indexed. Entries are made by
        the segment's ``IndexBuilder`` (recovery's rule, so a reopen finds the same
        bytes) before the write, and taken back if it fails: none for missing bytes.
        """
        if batch_starts is None:
            batch_starts = [(0, first_offset, max_ts)]
        size = self.size
        index = self.index
        mark = index.mark()
        ends = [position for position, _, _ in batch_starts[1:]]
        ends.append(len(data))
        for (position, base, batch_ts), end in zip(batch_starts, ends, strict=True):
            index.add(size + position, base, end - position, batch_ts)
        try:
            written = os.write(self.fd, data)
        except OSError:
            index.rollback(mark)  # no entry for bytes that are not there
            self._cut_back(size)
            raise
        if written != len(data):  # a short write on a regular file means the disk is full
            index.rollback(mark)
            self._cut_back(size)
            raise OSError(
                errno.ENOSPC,
                f"No space left on device (short write: {written} of {len(data)} bytes)",
                str(self.path),
            )
        self.size = size + written
        self.next_offset = next_offset
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts

    def _cut_back(self, size: int) -> None:
        """Leave no partial batch behind a failed write: whole batches below ``size`` only."""
        try:
            os.ftruncate(self.fd, size)
        except OSError:
            pass  # recovery on the next open cuts a torn tail anyway

    def _write_pending_index(self, *, sync: bool = False) -> None:
        """Both indexes' unwritten entries onto their files (fsynced with ``sync``)."""
        index = self.index
        written = self._index_written
        if len(index.offsets) > written or sync:
            data = index_bytes(index.offsets[written:], index.positions[written:])
            _append_file(self.index_path, data, sync=sync)
            self._index_written = len(index.offsets)
        if index.time_entries or sync:
            _append_file(self.time_path, index.time_entries, sync=sync)
            index.time_entries.clear()

    def write_index(self) -> None:
        """The indexes' unwritten entries onto their files, not fsynced (a roll's flush
        fsyncs them with the log file, off the loop)."""
        self._write_pending_index()

    def flush(self) -> None:
        self._write_pending_index(sync=True)
        os.fsync(self.fd)

    def close(self) -> None:
        try:
            self._write_pending_index()
        except OSError:
            pass  # the index is rebuilt from the batches on open anyway
        self.active = False
        self.close_handle()

    def delete(self) -> None:
        """Remove the segment's files: log, offset and time indexes, aborted-transactions index."""
        self.close()
        txn_index = self.path.with_suffix(".txnindex")
        for path in (self.path, self.index_path, self.time_path, txn_index):
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    # --- reading --------------------------------------------------------------------------

    def pread(self, size: int, position: int) -> bytes:
        return os.pread(self.fd, size, position)

    def lookup(self, offset: int) -> int:
        """A file position at or before the batch holding ``offset`` (from the sparse index)."""
        i = bisect_right(self.index_offsets, offset - self.base_offset) - 1
        return self.index_positions[i] if i >= 0 else 0

    def lookup_span(self, offset: int) -> tuple[int, int]:
        """``(start, bound)``: the batch holding ``offset`` begins in ``[start, bound)``.

        ``bound`` is the next index entry's position (or the segment size), which is what
        lets a read fetch the walk and the data in one pread.
        """
        i = bisect_right(self.index_offsets, offset - self.base_offset) - 1
        start = self.index_positions[i] if i >= 0 else 0
        bound = self.index_positions[i + 1] if i + 1 < len(self.index_positions) else self.size
        return start, bound

    def time_lookup(self, timestamp: int) -> int:
        """A file position at or before the first batch holding a record at or after
        ``timestamp`` (Kafka's timeIndex.lookup, then offsetIndex.lookup): after the last
        time index entry older than it, every record up to whose offset is older."""
        relative = time_index.last_below(self.time_path, self.index.time_entries, timestamp)
        return 0 if relative is None else self.lookup(self.base_offset + relative + 1)

    def find_position(self, offset: int) -> int | None:
        """Position of the batch containing ``offset``, or None if this segment lacks it."""
        if offset < self.base_offset or offset >= self.next_offset:
            return None
        start, bound = self.lookup_span(offset)
        data = self.pread(bound - start + HEADER_SIZE, start)
        found = walk_to(data, offset)
        return None if found is None else start + found

    # --- recovery -------------------------------------------------------------------------

    def rebuild_index(self, batches: list[BatchInfo]) -> list[tuple[Path, str]]:
        """Recompute both indexes from every batch's ``BatchInfo`` (a scan's).

        A file is rewritten only when its bytes differ, so a clean open writes nothing.
        Returns ``(file, why)`` for each file rewritten: missing, behind the log (a crash
        lost its unwritten tail: normal for the active segment), or corrupt.
        """
        index = IndexBuilder(self.base_offset, self.index.interval)
        for b in batches:
            index.add(b.position, b.base_offset, b.size, b.max_timestamp)
        wanted = index_bytes(index.offsets, index.positions)
        rewritten = []
        for path, data in ((self.index_path, wanted), (self.time_path, index.time_entries)):
            why = _sync_file(path, data)
            if why is not None:
                rewritten.append((path, why))
        self.install_index(index)
        return rewritten

    def install_index(self, index: IndexBuilder) -> None:
        """Take indexes whose files are written (the cleaner's worker thread builds its
        copy's, recovery its own): nothing of them is pending."""
        index.time_entries.clear()
        self.index = index
        self._index_written = len(index.offsets)

    def drop_pending(self) -> None:
        """Forget unwritten index entries (files replaced under this segment object)."""
        self._index_written = len(self.index.offsets)
        self.index.time_entries.clear()

    def truncate_file(self, size: int) -> None:
        os.truncate(self.path, size)
        self.size = size

    def quarantine(self) -> Path:
        """Rename the log file aside (``*.log.corrupt``) and drop the index: kept for a
        human to inspect, invisible to the next open."""
        self.close_handle()
        target = self.path.with_name(self.path.name + ".corrupt")
        os.replace(self.path, target)
        for path in (self.index_path, self.time_path, self.path.with_suffix(".txnindex")):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        return target


class IndexBuilder:
    """A segment's sparse offset and time indexes built batch by batch, so a writer of
    millions of batches (the cleaner) holds its entries only, not a list of every batch.
    One rule for every writer: a segment's appends, recovery's rebuild and the cleaner's
    copy come to the same bytes for the same batches."""

    __slots__ = (
        "base_offset",
        "interval",
        "max_ts",
        "offsets",
        "positions",
        "since",
        "time_entries",
        "time_last",
    )

    def __init__(self, base_offset: int, interval: int) -> None:
        self.base_offset = base_offset
        self.interval = interval
        self.offsets: list[int] = []
        self.positions: list[int] = []
        self.since = 0
        self.max_ts = -1
        self.time_entries = bytearray()  # the .timeindex file's bytes
        self.time_last = -1

    def add(self, position: int, base: int, size: int, max_ts: int) -> None:
        """The next batch: ``size`` bytes at ``position``, first offset ``base``, its max
        timestamp ``max_ts``."""
        if not self.offsets or self.since >= self.interval:
            self.offsets.append(base - self.base_offset)
            self.positions.append(position)
            if self.max_ts > self.time_last:
                self.time_entries += TIME_ENTRY.pack(self.max_ts, base - 1 - self.base_offset)
                self.time_last = self.max_ts
            self.since = 0
        self.since += size
        if max_ts > self.max_ts:
            self.max_ts = max_ts

    def mark(self) -> tuple:
        return len(self.offsets), self.since, self.max_ts, len(self.time_entries), self.time_last

    def rollback(self, mark: tuple) -> None:
        """Back to ``mark()``: the batches added since are gone."""
        del self.offsets[mark[0] :], self.positions[mark[0] :], self.time_entries[mark[3] :]
        self.since, self.max_ts, self.time_last = mark[1], mark[2], mark[4]


def index_bytes(offsets: list[int], positions: list[int]) -> bytes:
    """An index file's contents."""
    return b"".join(_INDEX_ENTRY.pack(o, p) for o, p in zip(offsets, positions, strict=True))


def _sync_file(path: Path, wanted: bytes | bytearray) -> str | None:
    """Make an index file hold ``wanted``; why it had to be rewritten, or None. Never
    raises: an index file that cannot be read or written is rebuilt on the next open
    (meanwhile the offset index serves from memory, and a time lookup reads only whole
    entries, each valid alone, or none)."""
    try:
        with open(path, "rb") as fh:
            current = fh.read(len(wanted) + 1)
    except FileNotFoundError:
        why = "missing"
    except OSError as exc:
        why = f"unreadable: {exc}"
    else:
        if current == wanted:
            return None
        whole = len(current) % _entry_size(path) == 0
        why = "behind the log" if whole and wanted.startswith(current) else "corrupt"
    try:
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(wanted)
        os.replace(tmp, path)
    except OSError as exc:
        why += f"; not rewritten: {exc}"
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass
    return why


def _entry_size(path: Path) -> int:
    return TIME_ENTRY.size if path.suffix == time_index.SUFFIX else _INDEX_ENTRY.size


def _append_file(path: Path, data: bytes | bytearray, *, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        if data:
            os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def walk_to(data: bytes | memoryview, offset: int) -> int | None:
    """Position in ``data`` (which starts at a batch) of the batch holding ``offset``.

    None when ``data`` ends before that batch's header does.
    """
    position = 0
    end = len(data)
    while position + HEADER_SIZE <= end:
        base, length = BASE_AND_LENGTH.unpack_from(data, position)
        if base + LAST_DELTA.unpack_from(data, position + LAST_DELTA_AT)[0] >= offset:
            return position
        if length + LOG_OVERHEAD < HEADER_SIZE:  # cannot happen below ``size``; never loop forever
            raise CorruptBatch(f"batch length {length} at byte {position} of a segment walk")
        position += length + LOG_OVERHEAD
    return None


def scan_segment(segment: Segment, *, verify: bool, gaps: bool = False) -> ScanResult:
    """Walk every batch of the segment, checking that the offsets continue.

    ``verify`` also checks each batch's CRC and record count (the active segment on
    open, the only one a crash can tear); without it the scan reads headers only.
    ``gaps``: offsets may skip forwards (a compacted log's); otherwise a batch must start
    where the previous one ended, which catches a damaged base offset.
    It stops at the first batch that is torn, inconsistent or out of sequence.
    """
    batches: list[BatchInfo] = []
    expected = segment.base_offset
    max_ts = -1
    position = 0
    file_size = segment.size
    chunk = b""
    chunk_start = 0
    problem = None
    # Header-only scans read small chunks: large batches make most of a big chunk waste.
    chunk_size = SCAN_CHUNK if verify else 64 * 1024
    while position < file_size:
        if position + HEADER_SIZE > file_size:
            problem = "torn batch header"
            break
        rel = position - chunk_start
        if rel + HEADER_SIZE > len(chunk):
            chunk = segment.pread(min(chunk_size, file_size - position), position)
            chunk_start, rel = position, 0
        h = HEADER.unpack_from(chunk, rel)
        base, size = h[0], h[1] + LOG_OVERHEAD
        if size < HEADER_SIZE:
            problem = f"bad batch length {h[1]}"
            break
        if position + size > file_size:
            problem = "torn batch"
            break
        if base != expected and not (gaps and base > expected):
            problem = f"batch offset {base} where {expected} was expected"
            break
        if (
            base + h[5] - segment.base_offset > MAX_RELATIVE_OFFSET
            or position + size > MAX_POSITION
        ):
            problem = f"batch at byte {position} (offset {base}) is beyond what the index holds"
            break
        if verify:
            if rel + size > len(chunk):
                chunk = segment.pread(min(max(chunk_size, size), file_size - position), position)
                chunk_start, rel = position, 0
            try:
                check_batch(chunk, rel, size)
            except CorruptBatch as exc:
                problem = str(exc)
                break
        elif h[8] <= 0 or h[5] != h[8] - 1:
            problem = f"batch at byte {position}: record count {h[8]}, last delta {h[5]}"
            break
        expected = base + h[5] + 1
        producer = None
        if h[4] & PRODUCER_FLAG:
            if size < HEADER_SIZE + PRODUCER_FIELDS.size:
                problem = f"batch at byte {position} is cut off inside its producer fields"
                break
            if rel + HEADER_SIZE + PRODUCER_FIELDS.size > len(chunk):
                chunk = segment.pread(min(chunk_size, file_size - position), position)
                chunk_start, rel = position, 0
            producer = PRODUCER_FIELDS.unpack_from(chunk, rel + HEADER_SIZE)
        batches.append(BatchInfo(position, base, size, expected, h[7], producer, h[4]))
        if h[7] > max_ts:
            max_ts = h[7]
        position += size
    return ScanResult(batches, position, expected, max_ts, problem)


def first_batch_reaching(
    segment: Segment, timestamp: int, min_offset: int
) -> tuple[int, int] | None:
    """``(position, size)`` of the first batch whose max timestamp reaches ``timestamp``
    and whose records reach ``min_offset`` (the log start), reading headers from the time
    index's position on (Kafka's findOffsetByTimestamp); None if none does."""
    position = segment.time_lookup(timestamp)
    file_size = segment.size
    chunk, chunk_start = b"", 0
    while position + HEADER_SIZE <= file_size:
        rel = position - chunk_start
        if rel + HEADER_SIZE > len(chunk):
            chunk = segment.pread(min(64 * 1024, file_size - position), position)
            chunk_start, rel = position, 0
        h = HEADER.unpack_from(chunk, rel)
        size = h[1] + LOG_OVERHEAD
        if size < HEADER_SIZE:
            return None  # a damaged length: never loop (recovery deals with the file)
        if h[7] >= timestamp and h[0] + h[5] >= min_offset:
            return position, size
        position += size
    return None


def scan_headers(segment: Segment) -> tuple[list[tuple[int, int, int]], int]:
    """``(position, base_offset, size)`` of each whole batch (headers only), and the max timestamp."""
    result = scan_segment(segment, verify=False)
    return [(b.position, b.base_offset, b.size) for b in result.batches], result.max_timestamp


class _SealedHandles:
    """LRU of sealed segments whose log file is open; the oldest is closed past the cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open: OrderedDict[int, Segment] = OrderedDict()

    def admit(self, segment: Segment) -> None:
        self.open[id(segment)] = segment
        while len(self.open) > self.cap:
            _, oldest = self.open.popitem(last=False)
            oldest.close_handle()

    def touch(self, segment: Segment) -> None:
        if id(segment) in self.open:
            self.open.move_to_end(id(segment))
        else:
            self.admit(segment)

    def forget(self, segment: Segment) -> None:
        self.open.pop(id(segment), None)


_SEALED = _SealedHandles(MAX_OPEN_SEALED)


def open_sealed_count() -> int:
    """How many sealed segments hold an open descriptor now (tests, stats)."""
    return len(_SEALED.open)
