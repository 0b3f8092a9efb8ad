"""One batch through the log cleaner in bounded memory: its records streamed, the kept
ones re-encoded a chunk at a time, and the copy as it is when that cannot be done.

Budget (Kafka's names, one cleaner thread): ``log.cleaner.io.buffer.size`` is split as
Kafka splits it, half to read and half to write. Reading: a batch is read whole only up
to the larger of that half and the topic's ``max.message.bytes`` (Kafka grows its
buffers to that size; a larger one is copied in pieces); its records are streamed (a
stock client's compressed block through ``record_stream``'s fixed window, with values
skipped until a record is known to be kept), and a record is held whole only up to the
same limit. Writing: kept records are re-encoded into batches of about half the buffer
each (uncompressed bytes), compressed with the batch's own codec. So one batch costs
about ``io.buffer.size + 3 * max(io.buffer.size / 2, max.message.bytes)`` (the batch, a
stock client's batch unwrapped, one record) whatever it inflates to: a 60 KB zstd batch
of 2 GB of zeros costs that, not 2 GB. Decompressing past ``max_decompressed`` (the
limit produce validation applies) is not memory but time: such a batch is copied too.

A batch that does not fit (a record over the cap, a batch over it, records that do not
decode although its CRC holds: bytes that reached the disk before anything checked
them) is copied as it is, which is always safe for compaction (a record too many is
kept, never one too few), and reported in ``Stats.copied`` for the manager to log.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter

from minibroker.broker.storage.segment import IndexBuilder
from minibroker.protocol.batch import (
    KAFKA_FLAG,
    BatchHeader,
    CorruptBatch,
    decode_rows,
    encode_batch,
    increment_sequence,
    patch_base_offset,
    patch_leader_epoch,
    producer_fields,
    unpack_header,
    unwrap_kafka_batch,
    wrap_kafka_batch,
)
from minibroker.protocol.batch_stream import stream_rows
from minibroker.protocol.errors import ProtocolError
from minibroker.protocol.kafka import record_stream
from minibroker.protocol.kafka import records as kafka_records

# Kafka's defaults for log.cleaner.io.buffer.size and log.cleaner.dedupe.buffer.size.
IO_BUFFER_SIZE = 524288
DEDUPE_BUFFER_SIZE = 134217728
FLUSH_BYTES = 1 << 20  # the output file is written in pieces of about this size
# Kafka's per-record overhead bound in a v2 batch (length, attributes, deltas, lengths):
# what a record adds to a chunk beyond its key, value and headers.
RECORD_OVERHEAD = 21
KAFKA_ATTRIBUTES_AT = kafka_records.CRC_START - kafka_records.MAGIC_AT
_KEY = itemgetter(1)
# At most this many copied batches are named per pass (the rest are counted).
MAX_REPORTED = 100


@dataclass(frozen=True)
class Budget:
    """The cleaner's memory settings (broker configs of Kafka's names)."""

    io_buffer_size: int = IO_BUFFER_SIZE
    dedupe_buffer_size: int = DEDUPE_BUFFER_SIZE
    # A compressed batch inflating past this is copied as it is: not memory (records are
    # streamed) but time. ``cleaner.plan`` sets the log's message.max.decompressed.bytes,
    # the limit produce validation applies, so what was accepted can be cleaned.
    max_decompressed: int = record_stream.DEFAULT_MAX_DECOMPRESSED

    @property
    def half(self) -> int:
        return max(1, self.io_buffer_size // 2)

    def record_limit(self, max_message_bytes: int) -> int:
        """The largest record, and the largest batch, held whole."""
        return max(self.half, max_message_bytes)


class Uncleanable(Exception):
    """This batch cannot be cleaned in the budget: copy it as it is (the reason says why)."""


@dataclass
class Stats:
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    segments: list[int] = field(default_factory=list)
    copied: list[tuple[int, str]] = field(default_factory=list)  # (base offset, reason)
    copied_count: int = 0

    def note_copied(self, offset: int, reason: str) -> None:
        self.copied_count += 1
        if len(self.copied) < MAX_REPORTED:
            self.copied.append((offset, reason))


# What reading a batch's records raises when they cannot be cleaned: its callers copy
# the batch as it is. (Plain iterators, not wrapped in a generator that converts the
# errors: a generator layer is a Python call per record.)
# TypeError: a key that is not bytes (msgpack str) in a batch decoded at once.
UNREADABLE = (Uncleanable, ProtocolError, CorruptBatch, TypeError)


def rows(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader, budget: Budget, limit: int
) -> Iterable[tuple]:
    """The batch's records as ``(timestamp_delta, key, value[, headers])``, streamed;
    one of UNREADABLE when they cannot be read in the budget or do not decode. A Kafka
    batch's records are held whole (values too): ``skim`` it first to know they fit."""
    if header.attributes & KAFKA_FLAG:
        return _kafka_rows(buf, pos, header, budget, values=True)
    return _native_rows(buf, pos, header, budget, limit)


def _native_rows(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader, budget: Budget, limit: int
) -> Iterable[tuple]:
    """One of our batches' rows: decoded at once when the batch is within half the io
    buffer (C-level, its objects bounded by its size: most batches), else streamed."""
    if header.size <= budget.half:
        return decode_rows(buf, pos, header)
    return stream_rows(buf, pos, header, window=budget.half, max_record=limit)


def skim(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader, budget: Budget, limit: int
) -> Iterator[tuple[bytes | None, bool, int]]:
    """``(key, value is null, bytes the record would hold)`` for each record, values
    skipped unread (a stock client's batch: a 2 GB value of zeros is never held)."""
    if header.attributes & KAFKA_FLAG:
        for r in _kafka_rows(buf, pos, header, budget, values=False):
            yield r[1], r[2] is None, r[4]
    else:
        for r in _native_rows(buf, pos, header, budget, limit):
            yield r[1], r[2] is None, row_size(r)


def keys(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader, budget: Budget, limit: int
) -> Iterator[bytes | None]:
    """Each record's key (the offset map's read), values skipped unread."""
    if header.attributes & KAFKA_FLAG:
        return map(_KEY, _kafka_rows(buf, pos, header, budget, values=False))
    return map(_KEY, _native_rows(buf, pos, header, budget, limit))


def _kafka_rows(
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    budget: Budget,
    *,
    values: bool,
) -> Iterator[tuple]:
    """A stock client's v2 batch through ``record_stream``. ``values=False`` yields
    ``(timestamp_delta, key, None or b"", headers, record size)``: b"" for a value that
    is there but was skipped."""
    kafka = unwrap_kafka_batch(buf, pos, header)
    limit = budget.max_decompressed
    for r in record_stream.iter_records(kafka, values=values, max_decompressed=limit):
        headers = r.headers
        if headers:
            try:
                headers = tuple((name.decode(), data) for name, data in headers)
            except UnicodeDecodeError:
                raise Uncleanable(f"record {r.offset_delta}: a header key is not UTF-8") from None
        if not values:
            size = RECORD_OVERHEAD + len(r.key or b"") + max(0, r.value_size)
            for name, data in headers:
                size += len(name) + len(data or b"") + 10
            yield r.timestamp_delta, r.key, None if r.value_size < 0 else b"", headers, size
        elif headers:
            yield r.timestamp_delta, r.key, r.value, headers
        else:
            yield r.timestamp_delta, r.key, r.value


def row_size(row: tuple) -> int:
    """About the bytes a row adds to an encoded chunk."""
    size = RECORD_OVERHEAD + len(row[1] or b"") + len(row[2] or b"")
    if len(row) == 4:
        for name, value in row[3]:
            size += len(name) + len(value or b"") + 10
    return size


class Output:
    """The cleaned copy's file, written sequentially, with a mark to roll back to (a
    batch re-encoded in chunks that turns out to keep every record is copied instead)."""

    def __init__(self, fd: int, base_offset: int, interval: int) -> None:
        self.fd = fd
        self.pending = bytearray()
        self.flushed = 0
        self.index = IndexBuilder(base_offset, interval)
        self.next_offset = base_offset
        self.max_timestamp = -1

    @property
    def written(self) -> int:
        return self.flushed + len(self.pending)

    def add(self, data: bytes | bytearray | memoryview, header: BatchHeader) -> None:
        self.index.add(self.written, header.base_offset, len(data), header.max_timestamp)
        self.pending += data
        self.next_offset = header.next_offset
        self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
        if len(self.pending) >= FLUSH_BYTES:
            self.flush()

    def add_raw(self, data: bytes | bytearray | memoryview) -> None:
        """Bytes of a batch copied in pieces (its caller, ``cleaner._copy_streamed``,
        indexes it and sets the offsets)."""
        self.pending += data
        if len(self.pending) >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        view = memoryview(self.pending)
        while view:
            view = view[os.write(self.fd, view) :]
        view.release()
        self.flushed += len(self.pending)
        self.pending.clear()

    def mark(self) -> tuple:
        return (self.written, self.index.mark(), self.next_offset, self.max_timestamp)

    def rollback(self, mark: tuple) -> None:
        written, index, self.next_offset, self.max_timestamp = mark
        if written >= self.flushed:
            del self.pending[written - self.flushed :]
        else:
            self.pending.clear()
            os.ftruncate(self.fd, written)
            os.lseek(self.fd, written, os.SEEK_SET)
            self.flushed = written
        self.index.rollback(index)


class Rewriter:
    """A batch's kept records as batches of consecutive offsets (our batches number their
    records contiguously, so a gap ends a batch), each at most ``chunk`` bytes of records:
    our own encoding for our batches, a Kafka v2 batch of the same codec for a stock
    client's. Kept rows wait until a record is dropped or a chunk fills, so a batch that
    keeps everything and fits one chunk is never encoded."""

    def __init__(
        self,
        buf: bytes | bytearray | memoryview,
        pos: int,
        header: BatchHeader,
        out: Output,
        chunk: int,
    ) -> None:
        self.header = header
        self.out = out
        self.chunk = chunk
        self.producer = producer_fields(buf, pos, header)
        self.codec = None
        if header.attributes & KAFKA_FLAG:
            # The v2 batch's attributes, after its magic byte and CRC-32C.
            at = pos + header.records_at + KAFKA_ATTRIBUTES_AT
            self.codec = buf[at + 1] & kafka_records.COMPRESSION_MASK
        self.run: list[tuple] = []
        self.run_start = 0
        self.run_bytes = 0
        self.dropped = False
        self.encoded = False
        self.kept = 0

    def keep(self, index: int, row: tuple) -> None:
        """Keep the record at ``index`` (its key is not null: only keyed records stay)."""
        if not self.run:
            self.run_start = index
        self.run.append(row)
        self.kept += 1
        value = row[2]
        self.run_bytes += (
            row_size(row)
            if len(row) == 4
            else RECORD_OVERHEAD + len(row[1]) + (0 if value is None else len(value))
        )
        if self.run_bytes >= self.chunk:
            self._emit()

    def drop(self) -> None:
        """Drop the next record (callers skip the call while ``run`` is empty and
        ``dropped`` set: a batch mostly dropped costs no call per record)."""
        self.dropped = True
        self._emit()

    def finish(self) -> bool:
        """True if the batch was rewritten; False: copy it as it is (nothing dropped)."""
        if not self.dropped:
            return False
        self._emit()
        return True

    def _emit(self) -> None:
        if not self.run:
            return
        header = self.header
        first_ts = header.first_timestamp
        base = header.base_offset + self.run_start
        records = [(first_ts + r[0], r[1], r[2], r[3] if len(r) == 4 else ()) for r in self.run]
        pid, epoch, seq = self.producer if self.producer is not None else (-1, -1, -1)
        if self.producer is not None:
            seq = increment_sequence(seq, self.run_start)
        if self.codec is None:
            extra = {}
            if self.producer is not None:
                extra = {"producer_id": pid, "producer_epoch": epoch, "base_sequence": seq}
            data = encode_batch(
                records, base_offset=base, leader_epoch=header.leader_epoch, **extra
            )
        else:
            raw = kafka_records.encode_batch(
                records,
                compression=self.codec,
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=seq,
            )
            data = wrap_kafka_batch(raw, 0, kafka_records.unpack_header(raw))
            patch_base_offset(data, 0, base)
            patch_leader_epoch(data, 0, header.leader_epoch)
        self.out.add(data, unpack_header(data))
        self.encoded = True
        self.run.clear()  # the same list: callers hold it
        self.run_bytes = 0
