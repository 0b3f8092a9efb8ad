"""A v2 batch's records, read one at a time in bounded memory (sans-IO).

Kafka's LogValidator walks every record of every produced batch; a batch whose header
is CRC-valid can still lie about its records (a ``record_count`` or ``lastOffsetDelta``
that is not what it holds, negative or over-long varints, a length past the batch, a
fake compressed block). This module is the one place that reads the record grammar
(protocol/kafka/records.py has the layout) for the broker:

- ``iter_records(batch)`` yields each record as a ``StreamRecord``, field by field:
  the log cleaner's reader (a record at a time, any record size).
- ``walk_records(batch, ...)`` checks every record and returns a ``BatchSummary``
  without building a record: the produce path's validator (LogValidator's walk). Its
  hot loop runs in C (``_record_walk.c``, built by setup.py) where the extension is
  built, else in Python (``_Walk.run_python``); the two are held equal by tests, and
  both readers by one table of malformed batches.

Both take one whole batch (from its base offset on) whose header and CRC the caller has
checked (``records.check_batch``). Compressed records are decompressed ``WINDOW`` bytes
at a time (zlib's ``max_length``, lz4's frame decompressor, zstandard's stream reader),
so memory is bounded by the window (plus the record being yielded, for
``iter_records``), never by the decompressed size, which is refused above
``max_decompressed``. Raw snappy (librdkafka) is one block: its declared size is checked
against ``max_decompressed`` before it is decompressed whole; snappy-java's framed
blocks go chunk by chunk.

A defect raises ``RecordDefect`` (a ``CorruptKafkaBatch``) naming it, with the Kafka
error code the produce is answered with: INVALID_RECORD for records that do not parse
or do not match the header (Kafka's InvalidRecordException), CORRUPT_MESSAGE for a
compressed block that does not decompress, MESSAGE_TOO_LARGE above the decompressed
limit. ``walk_records`` also applies the per-record rules of the topic (timestamps,
keys of a compacted topic) and collects Kafka's per-record errors (``RecordError``:
batch index and message) before raising INVALID_TIMESTAMP or INVALID_RECORD, as
LogValidator's ``processRecordErrors`` does.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import Any, NamedTuple

from minibroker.protocol.errors import ErrorCode
from minibroker.protocol.kafka.records import (
    _XERIAL,
    CODEC_NAMES,
    GZIP,
    HEADER_SIZE,
    LZ4,
    NONE,
    SNAPPY,
    TIMESTAMP_TYPE_FLAG,
    ZSTD,
    CorruptKafkaBatch,
    KafkaBatchHeader,
    check_compression,
    unpack_header,
)

try:  # the walk's hot loop in C (setup.py builds it where a compiler is present)
    from minibroker.protocol.kafka._record_walk import scan as _scan
except ImportError:  # pragma: no cover - a build without a C compiler
    _scan = None

WINDOW = 64 * 1024  # decompressed bytes held at once
# A compressed batch that inflates past this is refused: the window bounds memory, this
# bounds the time spent on a decompression bomb. Kafka has no such limit; 64 MiB is 64x
# Kafka's default message.max.bytes, far beyond what real records compress by.
DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024
MAX_RECORD_ERRORS = 100  # per-record errors kept for the answer (the count is exact)
NO_LIMIT = 2**63 - 1
_MIN_RECORD = 6  # attributes, timestamp delta, offset delta, key, value, header count
_KEY_VALUE = ("key", "value")  # the two length-prefixed fields, walked alike
# A header's key and value, each with the least length it may have: a key is never null.
_HEADER_FIELDS = (("key", 0), ("value", -1))


class RecordDefect(CorruptKafkaBatch):
    """A batch whose records are malformed or break a rule: the produce's error code, the
    message, and Kafka's per-record errors (``RecordError``) where it has them."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        record_errors: list[RecordError] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.record_errors = record_errors or []


class RecordError(NamedTuple):
    """Kafka's BatchIndexAndErrorMessage: which record of the batch, and why."""

    batch_index: int
    message: str


class StreamRecord(NamedTuple):
    """One record as the batch carries it; its offset is base_offset + offset_delta and
    its timestamp base_timestamp + timestamp_delta (CreateTime)."""

    offset_delta: int
    timestamp_delta: int
    attributes: int
    key: bytes | None
    value: bytes | None  # None: a null value (tombstone), or not read (values=False)
    value_size: int  # -1 for a null value
    headers: tuple[tuple[bytes, bytes | None], ...]


class BatchSummary(NamedTuple):
    """What ``walk_records`` learned: the records' own timestamps and sizes."""

    record_count: int
    max_timestamp: int
    decompressed_bytes: int


def _invalid(message: str) -> RecordDefect:
    return RecordDefect(ErrorCode.INVALID_RECORD, message)


# --- varints: the one-byte case is inlined by the callers; these are the rest ----------------


def _uvarint(buf: bytes, p: int, max_bytes: int) -> tuple[int, int]:
    """An unsigned varint of at most ``max_bytes`` bytes (5: int32, 10: int64), as
    Kafka's ByteUtils reads it; IndexError when the buffer ends inside it."""
    value = shift = 0
    for _ in range(max_bytes):
        b = buf[p]
        p += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, p
        shift += 7
    raise _invalid(f"varint at byte {p - max_bytes} is longer than {max_bytes} bytes")


def _zigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


# --- decompression, WINDOW bytes at a time ---------------------------------------------------


def _chunks(codec: int, data: memoryview, limit: int) -> Iterator[bytes]:
    """The decompressed bytes of a compressed records block, at most WINDOW at a time;
    RecordDefect past ``limit`` bytes or when the block does not decompress."""
    name = CODEC_NAMES[codec]
    total = 0
    try:
        for chunk in _raw_chunks(codec, data, limit):
            total += len(chunk)
            if total > limit:
                raise RecordDefect(
                    ErrorCode.MESSAGE_TOO_LARGE,
                    f"{name} batch decompresses to more than {limit} bytes "
                    "(the broker's message.max.decompressed.bytes)",
                )
            yield chunk
    except RecordDefect:
        raise
    except Exception as exc:  # each codec library raises its own error types
        raise RecordDefect(
            ErrorCode.CORRUPT_MESSAGE, f"{name} block does not decompress: {exc}"
        ) from None


def _raw_chunks(codec: int, data: memoryview, limit: int) -> Iterator[bytes]:
    if codec == GZIP:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        tail: Any = data
        while not d.eof:
            out = d.decompress(tail, WINDOW)
            tail = d.unconsumed_tail
            if out:
                yield out
            elif not tail:
                raise ValueError("the gzip stream ends before its end marker")
        return
    if codec == LZ4:
        import lz4.frame

        d4 = lz4.frame.LZ4FrameDecompressor()
        out = d4.decompress(data, max_length=WINDOW)
        while True:
            if out:
                yield out
            if d4.eof:
                return
            if d4.needs_input:
                raise ValueError("the lz4 frame ends early")
            out = d4.decompress(b"", max_length=WINDOW)
    if codec == ZSTD:
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(data)
        while out := reader.read(WINDOW):
            yield out
        return
    if codec == SNAPPY:
        import cramjam

        blocks = [data]
        if bytes(data[: len(_XERIAL)]) == _XERIAL:  # snappy-java's framing: length-prefixed blocks
            blocks, pos = [], 16
            while pos < len(data):
                (n,) = struct.unpack_from(">i", data, pos)
                if n < 0 or pos + 4 + n > len(data):
                    raise ValueError(f"xerial block at byte {pos} is cut off")
                blocks.append(data[pos + 4 : pos + 4 + n])
                pos += 4 + n
        for block in blocks:
            if cramjam.snappy.decompress_raw_len(block) > limit:
                raise RecordDefect(
                    ErrorCode.MESSAGE_TOO_LARGE,
                    f"snappy block declares more than {limit} bytes "
                    "(the broker's message.max.decompressed.bytes)",
                )
            out = bytes(cramjam.snappy.decompress_raw(block))
            for at in range(0, len(out), WINDOW):
                yield out[at : at + WINDOW]
        return
    raise ValueError(f"codec {codec}")


class _Stream:
    """The records' bytes as a stream: a plain batch's bytes, or a compressed block
    decompressed into a window. ``buf[pos:]`` is what is held; ``fill(n)`` holds at
    least ``n`` bytes unless the stream ends first."""

    __slots__ = ("buf", "chunks", "consumed", "pos")

    def __init__(self, buf: bytes, chunks: Iterator[bytes] | None) -> None:
        self.buf = buf
        self.pos = 0
        self.chunks = chunks
        self.consumed = 0  # bytes of the stream before buf

    def fill(self, n: int) -> bool:
        """At least ``n`` bytes held from pos (at most max(n, 2 WINDOW) are); False when
        the stream ends first."""
        have = len(self.buf) - self.pos
        if have >= n:
            return True
        if self.chunks is None:
            return False
        parts = [self.buf[self.pos :]]
        for chunk in self.chunks:
            parts.append(chunk)
            have += len(chunk)
            if have >= n:
                break
        self.consumed += self.pos
        self.buf = b"".join(parts)
        self.pos = 0
        return have >= n

    def uvarint(self, max_bytes: int) -> int:
        self.fill(max_bytes)
        try:
            value, self.pos = _uvarint(self.buf, self.pos, max_bytes)
        except IndexError:
            raise _invalid("the records end inside a varint") from None
        return value

    def take(self, n: int) -> bytes:
        if not self.fill(n):
            raise _invalid("the records end inside a record")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def skip(self, n: int) -> None:
        """Drop ``n`` bytes, reading past them WINDOW at a time."""
        while n > 0:
            step = min(n, WINDOW)
            if not self.fill(step):
                raise _invalid("the records end inside a record")
            self.pos += step
            n -= step

    @property
    def offset(self) -> int:
        """Bytes of the stream read so far."""
        return self.consumed + self.pos

    def at_end(self) -> bool:
        return not self.fill(1)


def _open(
    batch: bytes | bytearray | memoryview, max_decompressed: int, copy: bool = True
) -> tuple[KafkaBatchHeader, _Stream]:
    """The batch's header and its records as a stream; ``copy=False`` reads a plain
    batch's records in place (the walk only indexes them; iter_records hands out slices,
    which must be bytes)."""
    header = unpack_header(batch)
    if len(batch) < header.size:
        raise CorruptKafkaBatch(f"batch of {header.size} bytes is cut off at {len(batch)}")
    check_compression(header.compression)
    body = memoryview(batch)[HEADER_SIZE : header.size]
    if header.compression == NONE:
        return header, _Stream(bytes(body) if copy else body, None)
    return header, _Stream(b"", _chunks(header.compression, body, max_decompressed))


def _read_record(s: _Stream, values: bool) -> StreamRecord:
    """One record, field by field: the streaming grammar (any record size)."""
    length = _zigzag(s.uvarint(5))
    if length < _MIN_RECORD:
        raise _invalid(f"record length {length} is below the {_MIN_RECORD}-byte minimum")
    start = s.offset
    if not s.fill(1):
        raise _invalid("the records end inside a record")
    attributes = s.buf[s.pos]
    s.pos += 1
    ts_delta = _zigzag(s.uvarint(10))
    offset_delta = _zigzag(s.uvarint(5))
    key_size = _zigzag(s.uvarint(5))
    _check_size(key_size, "key", start, length)
    key = s.take(key_size) if key_size >= 0 else None
    value_size = _zigzag(s.uvarint(5))
    _check_size(value_size, "value", start, length)
    value = None
    if value_size >= 0:
        if values:
            value = s.take(value_size)
        else:
            s.skip(value_size)
    count = _zigzag(s.uvarint(5))
    if count < 0 or count * 2 > length:
        raise _invalid(f"record has {count} headers in {length} bytes")
    headers = []
    for _ in range(count):
        name_size = _zigzag(s.uvarint(5))
        if name_size < 0:
            raise _invalid(f"header key length {name_size} is negative")
        _check_size(name_size, "header key", start, length)
        name = s.take(name_size)
        size = _zigzag(s.uvarint(5))
        _check_size(size, "header value", start, length)
        headers.append((name, s.take(size) if size >= 0 else None))
        if s.offset - start > length:
            break
    if s.offset - start != length:
        raise _invalid(f"record declares {length} bytes but its fields take {s.offset - start}")
    return StreamRecord(offset_delta, ts_delta, attributes, key, value, value_size, tuple(headers))


def _check_size(size: int, what: str, start: int, length: int) -> None:
    if size < -1:
        raise _invalid(f"{what} length {size} is negative")
    if size > length:
        raise _invalid(f"{what} length {size} is past the record's {length} bytes")


def iter_records(
    batch: bytes | bytearray | memoryview,
    *,
    values: bool = True,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
) -> Iterator[StreamRecord]:
    """Each record of one v2 batch (``batch`` starts at its base offset; its header and
    CRC already checked), one at a time, in bounded memory.

    ``values=False`` skips the values' bytes (``value`` is None, ``value_size`` says
    whether it was null: -1). Raises ``RecordDefect`` when a record does not parse, its
    offset delta is not its index, the batch holds more or fewer records than
    ``record_count`` (or ``last_offset_delta`` is not ``record_count - 1``), or a
    compressed block does not decompress or inflates past ``max_decompressed``. A
    control batch's records are read like any other (Kafka's markers are records too).
    """
    header, s = _open(batch, max_decompressed)
    count = _check_counts(header)
    for index in range(count):
        if s.at_end():
            raise _invalid(f"batch declares {count} records but holds {index}")
        record = _read_record(s, values)
        if record.offset_delta != index:
            raise _invalid(f"record {index} has offset delta {record.offset_delta}, not {index}")
        yield record
    if not s.at_end():
        raise _invalid(f"batch declares {count} records but holds more bytes after them")


def _check_counts(header: KafkaBatchHeader) -> int:
    count = header.record_count
    if count <= 0:
        raise _invalid(f"invalid record_count {count}")
    if header.last_offset_delta != count - 1:
        raise _invalid(
            f"last_offset_delta {header.last_offset_delta} does not match record_count {count}"
        )
    return count


# --- the validator's walk --------------------------------------------------------------------


def walk_records(
    batch: bytes | bytearray | memoryview,
    *,
    now_ms: int = 0,
    before_max_ms: int = NO_LIMIT,
    after_max_ms: int = NO_LIMIT,
    require_keys: bool = False,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
) -> BatchSummary:
    """Check every record of one v2 batch (as ``iter_records`` reads them) and the
    topic's per-record rules, without building records: LogValidator's walk.

    Rules: a record's timestamp within ``[now_ms - before_max_ms, now_ms +
    after_max_ms]`` (``message.timestamp.before.max.ms`` / ``after.max.ms``, CreateTime)
    else INVALID_TIMESTAMP; a key on every record when ``require_keys`` (a compacted
    topic) else INVALID_RECORD; a client's batch is CreateTime (INVALID_TIMESTAMP) and its
    max_timestamp is its records' largest (INVALID_RECORD). Per-record errors are
    collected (at most MAX_RECORD_ERRORS kept) and raised together, as Kafka does.
    """
    header, s = _open(batch, max_decompressed, copy=False)
    count = _check_counts(header)
    if header.attributes & TIMESTAMP_TYPE_FLAG:
        raise RecordDefect(
            ErrorCode.INVALID_TIMESTAMP,
            "Invalid timestamp type LogAppendTime: producers must not set it",
        )
    lo = max(now_ms - before_max_ms, -NO_LIMIT) if before_max_ms < NO_LIMIT else -NO_LIMIT
    hi = min(now_ms + after_max_ms, NO_LIMIT) if after_max_ms < NO_LIMIT else NO_LIMIT
    walk = _Walk(header.base_timestamp, lo, hi, require_keys)
    final = s.chunks is None
    index = 0
    while index < count:
        before = index
        index = walk.run(s, index, count, final)
        if index >= count:
            break
        held = len(s.buf) - s.pos
        if held == 0 and s.at_end():
            raise _invalid(f"batch declares {count} records but holds {index}")
        if index == before and held >= WINDOW:
            # A record bigger than the window: field by field, its value skipped.
            walk.one(index, _read_record(s, values=False))
            index += 1
        elif not s.fill(len(s.buf) - s.pos + 1):
            final = True  # the stream ended: what is held is all there is
    if not s.at_end():
        raise _invalid(f"batch declares {count} records but holds more bytes after them")
    if walk.errors:
        walk.raise_errors()
    if walk.max_ts != header.max_timestamp:
        raise _invalid(
            f"max_timestamp {header.max_timestamp} is not the records' largest "
            f"timestamp {walk.max_ts}"
        )
    return BatchSummary(count, walk.max_ts, s.offset)


class _Walk:
    """The fast walk's state across windows; ``run`` is the hot loop."""

    __slots__ = ("base_ts", "error_count", "errors", "hi", "lo", "max_ts", "need_key")

    def __init__(self, base_ts: int, lo: int, hi: int, need_key: bool) -> None:
        self.base_ts = base_ts
        self.lo = lo
        self.hi = hi
        self.need_key = need_key
        self.max_ts = -1
        self.errors: list[tuple[ErrorCode, RecordError]] = []
        self.error_count = 0

    def run(self, s: _Stream, index: int, count: int, final: bool) -> int:
        """Walk the records wholly held in ``s`` from ``s.pos``; return the index of the
        first record not walked (``s.pos`` at its start). ``final``: nothing follows
        what is held, so a record cut off is a defect, not a reason to stop.

        In C when the extension is built (``_record_walk.scan``: the same checks and
        messages, no per-record Python), else the Python loop below."""
        if _scan is None:
            return self.run_python(s, index, count, final)
        try:
            s.pos, index, self.max_ts, flagged = _scan(
                s.buf, s.pos, index, count, self.base_ts, self.max_ts,
                self.lo, self.hi, self.need_key, final,
            )  # fmt: skip
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        for at, ts, keyless in flagged:
            if keyless:
                self.add_key_error(at)
            else:
                self.add_timestamp_error(at, ts)
        return index

    def run_python(self, s: _Stream, index: int, count: int, final: bool) -> int:
        """``run`` without the C extension: the reference the C loop is tested against."""
        buf = s.buf
        end = len(buf)
        p = start = s.pos
        base_ts = self.base_ts
        max_ts = self.max_ts
        lo = self.lo
        hi = self.hi
        need_key = self.need_key
        e = -1
        try:
            while index < count and p < end:
                start = p
                e = -1
                b = buf[p]  # record length
                if b < 0x80:
                    n = b
                    p += 1
                elif buf[p + 1] < 0x80:  # two bytes: lengths of 64 to 8191, say
                    n = (b & 0x7F) | (buf[p + 1] << 7)
                    p += 2
                else:
                    n, p = _uvarint(buf, p, 5)
                n = (n >> 1) ^ -(n & 1)
                e = p + n
                if n < _MIN_RECORD:
                    raise _invalid(f"record {index} has length {n}, below the minimum")
                if e > end:
                    if final:
                        raise _invalid(f"record {index} of {n} bytes runs past the batch's end")
                    p = start
                    break
                p += 1  # attributes: unused in v2
                b = buf[p]  # timestamp delta
                if b < 0x80:
                    t = b
                    p += 1
                elif buf[p + 1] < 0x80:  # two bytes: lengths of 64 to 8191, say
                    t = (b & 0x7F) | (buf[p + 1] << 7)
                    p += 2
                else:
                    t, p = _uvarint(buf, p, 10)
                ts = base_ts + ((t >> 1) ^ -(t & 1))
                if ts > max_ts:
                    max_ts = ts
                b = buf[p]  # offset delta
                if b < 0x80:
                    o = b
                    p += 1
                elif buf[p + 1] < 0x80:  # two bytes: lengths of 64 to 8191, say
                    o = (b & 0x7F) | (buf[p + 1] << 7)
                    p += 2
                else:
                    o, p = _uvarint(buf, p, 5)
                if o != index << 1:  # zigzag(index)
                    raise _invalid(f"record {index} has offset delta {_zigzag(o)}, not {index}")
                keyless = False
                for what in _KEY_VALUE:  # one grammar for both (the C loop's too)
                    b = buf[p]  # its length: -1 (zigzag 1) for null
                    if b < 0x80:
                        m = b
                        p += 1
                    elif buf[p + 1] < 0x80:  # two bytes: lengths of 64 to 8191, say
                        m = (b & 0x7F) | (buf[p + 1] << 7)
                        p += 2
                    else:
                        m, p = _uvarint(buf, p, 5)
                    if m & 1:
                        if m != 1:
                            raise _invalid(f"record {index} has {what} length {_zigzag(m)}")
                        if what == "key":
                            keyless = True
                    else:
                        p += m >> 1
                        if p > e:
                            raise _invalid(f"record {index}'s {what} runs past its length")
                if buf[p]:  # header count
                    p = _headers(buf, p, e, index)
                else:
                    p += 1
                if p != e:
                    raise _invalid(f"record {index} declares {n} bytes but holds other fields")
                if keyless and need_key:  # one error per record, the key's first (Kafka's)
                    self.add_key_error(index)
                elif (ts < lo or ts > hi) and ts != -1:
                    self.add_timestamp_error(index, ts)
                index += 1
        except IndexError:
            if e >= 0 or final:
                raise _invalid(f"record {index}'s fields run past the batch's end") from None
            p = start
        s.pos = p
        self.max_ts = max_ts
        return index

    def one(self, index: int, record: StreamRecord) -> None:
        """A record read field by field (bigger than the window): the same checks."""
        if record.offset_delta != index:
            raise _invalid(f"record {index} has offset delta {record.offset_delta}, not {index}")
        ts = self.base_ts + record.timestamp_delta
        if ts > self.max_ts:
            self.max_ts = ts
        if record.key is None and self.need_key:
            self.add_key_error(index)
        elif (ts < self.lo or ts > self.hi) and ts != -1:
            self.add_timestamp_error(index, ts)

    def add_key_error(self, index: int) -> None:
        self._add(rule_error(index, 0, True, self.lo, self.hi))

    def add_timestamp_error(self, index: int, ts: int) -> None:
        self._add(rule_error(index, ts, False, self.lo, self.hi))

    def _add(self, error: tuple[ErrorCode, RecordError]) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_RECORD_ERRORS:
            self.errors.append(error)

    def raise_errors(self) -> None:
        raise records_refused(self.errors, self.error_count)


def rule_error(
    index: int, ts: int, keyless: bool, lo: int, hi: int
) -> tuple[ErrorCode, RecordError]:
    """A record that breaks the topic's rules, as Kafka's validateRecord words it: no key
    in a compacted topic (INVALID_RECORD), else a timestamp outside [lo, hi]."""
    if keyless:
        return ErrorCode.INVALID_RECORD, RecordError(
            index, "Compacted topic cannot accept message without key"
        )
    return ErrorCode.INVALID_TIMESTAMP, RecordError(
        index,
        f"Timestamp {ts} of message with offset {index} is out of range. "
        f"The timestamp should be within [{lo}, {hi}]",
    )


def records_refused(errors: list[tuple[ErrorCode, RecordError]], total: int) -> RecordDefect:
    """Kafka's processRecordErrors: INVALID_TIMESTAMP if any record's timestamp was out of
    range, else INVALID_RECORD summing up the first three; ``errors`` as listed."""
    listed = [e for _, e in errors[:MAX_RECORD_ERRORS]]
    if any(code == ErrorCode.INVALID_TIMESTAMP for code, _ in errors):
        return RecordDefect(
            ErrorCode.INVALID_TIMESTAMP,
            "One or more records have been rejected due to invalid timestamp",
            listed,
        )
    shown = "; ".join(f"record {e.batch_index}: {e.message}" for e in listed[:3])
    return RecordDefect(
        ErrorCode.INVALID_RECORD,
        f"One or more records have been rejected due to {total} record errors in total, "
        f"and only showing the first three errors at most: {shown}",
        listed,
    )


def _headers(buf: bytes, p: int, e: int, index: int) -> int:
    """Skip a record's headers (rare: off the hot loop); the position after them."""
    h, p = _uvarint(buf, p, 5)
    h = _zigzag(h)
    if h < 0 or h * 2 > e - p:
        raise _invalid(f"record {index} has {h} headers")
    for _ in range(h):
        for what, least in _HEADER_FIELDS:
            n, p = _uvarint(buf, p, 5)
            n = _zigzag(n)
            if n < least:
                raise _invalid(f"record {index} has header {what} length {n}")
            if n > 0:
                p += n
            if p > e:
                raise _invalid(f"record {index}'s header runs past its length")
    return p
