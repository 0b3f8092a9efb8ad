"""The record batch: unit of storage *and* transfer, identical bytes on the wire and on disk.

Layout (big-endian), after Kafka's v2 batch:

    base_offset      int64   patched in place by the leader when it assigns offsets
    batch_length     int32   bytes that follow this field
    leader_epoch     int32   patched in place by the leader (outside the CRC, as in Kafka)
    crc              uint32  zlib.crc32 of everything after this field; with KAFKA_FLAG,
                             the carried v2 batch's CRC-32C (see wrap_kafka_batch)
    attributes       int16
    last_offset_delta int32  record_count - 1
    first_timestamp  int64   ms
    max_timestamp    int64   ms
    record_count     int32
    [producer_id     int64   only when attributes has PRODUCER_FLAG (KIP-98's fields,
     producer_epoch  int16   which Kafka's v2 header always carries; ours are optional so
     base_sequence   int32]  logs written before the idempotent producer read unchanged)
    records          msgpack array of [timestamp_delta, key, value(, headers)]
                     or, with KAFKA_FLAG, a stock Kafka client's v2 batch from its magic
                     byte on (protocol/kafka/records.py): see wrap_kafka_batch

Because the CRC starts after the crc field, offsets and epochs can be set without
re-encoding, followers copy batches verbatim and fetch serves file bytes as they are.
The broker never looks inside ``records`` beyond the msgpack array header.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import count
from operator import itemgetter
from typing import Any, NamedTuple

import msgpack
from crc32c import crc32c

from minibroker.protocol.errors import ProtocolError
from minibroker.protocol.kafka import records as kafka_records

try:  # the leader's record walk in C (setup.py builds it where a compiler is present)
    from minibroker.protocol.kafka._record_walk import scan_rows as _scan_rows
except ImportError:  # pragma: no cover - a build without a C compiler
    _scan_rows = None

HEADER = struct.Struct(">qiiIhiqqi")
HEADER_SIZE = HEADER.size  # 46
LOG_OVERHEAD = 12  # base_offset + batch_length: what precedes batch_length's count
CRC_START = 20  # first byte the CRC covers (attributes)
# Field positions for readers that skip from batch to batch without a full header unpack
# (storage's offset walks); the layout lives here only, storage imports it.
LENGTH_AT = 8  # batch_length
EPOCH_AT = 12  # leader_epoch
LAST_DELTA_AT = 22  # last_offset_delta
BASE_AND_LENGTH = struct.Struct(">qi")  # base_offset @0, batch_length @LENGTH_AT
LAST_DELTA = struct.Struct(">i")  # last_offset_delta @LAST_DELTA_AT
_BASE_OFFSET = struct.Struct(">q")
_EPOCH = struct.Struct(">i")
_LENGTH = struct.Struct(">i")
_CRC = struct.Struct(">I")
CRC_AT = 16
NO_TIMESTAMP = -1
# attributes bit: producer fields follow the fixed header (inside the CRC).
PRODUCER_FLAG = 0x0100
PRODUCER_FIELDS = struct.Struct(">qhi")  # producer_id, producer_epoch, base_sequence
# attributes bit: the records are a Kafka v2 batch's tail (magic, CRC-32C, its own header,
# records), kept byte for byte as a stock client sent it. Kafka's own attribute bits
# (compression, timestamp type) stay inside that tail; ours never carry them.
KAFKA_FLAG = 0x0200
_KAFKA_TAIL_MIN = kafka_records.HEADER_SIZE - kafka_records.MAGIC_AT  # magic .. record_count
# The carried v2 header from its magic byte on: magic, crc, attributes, last_offset_delta,
# base/max timestamp, producer id/epoch, base sequence, record count.
_KAFKA_TAIL = struct.Struct(">bIhiqqqhii")
_KAFKA_CRC_START = kafka_records.CRC_START - kafka_records.MAGIC_AT  # in the tail: 5
# attributes bits of a transaction (KIP-98), at Kafka's own positions: the batch belongs
# to a transaction (its records count only once a commit marker follows), and a control
# batch (a transaction marker, never a record for applications). A wrapped v2 batch
# carries them in its own attributes too; ours repeat them so the broker never looks in.
TRANSACTIONAL_FLAG = 0x0010
CONTROL_FLAG = 0x0020
NO_PRODUCER_ID = -1
MAX_SEQUENCE = 2**31 - 1  # sequences wrap to 0 after this, as Kafka's
# Producer ids at or above this are derived by a writer from a stable name (the Spark
# sink's exactly-once identity), never handed out by InitProducerId, whose blocks count up
# from 0. The leader holds such a producer to sequence 0 when it does not know it, since
# "may start anywhere" (KIP-360) would let a lost first batch be skipped on a replay.
DERIVED_PRODUCER_ID_BASE = 1 << 62


def increment_sequence(sequence: int, increment: int) -> int:
    """``sequence + increment`` on Kafka's int32 sequence ring (wraps to 0, never negative)."""
    if sequence > MAX_SEQUENCE - increment:
        return increment - (MAX_SEQUENCE - sequence) - 1
    return sequence + increment


class CorruptBatch(ProtocolError):
    """A batch whose length, header or CRC does not hold together."""


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    leader_epoch: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    record_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def records_at(self) -> int:
        """Where the records array starts, relative to the batch."""
        if self.attributes & PRODUCER_FLAG:
            return HEADER_SIZE + PRODUCER_FIELDS.size
        return HEADER_SIZE


class Record:
    """One record as a client sees it after decoding a batch."""

    __slots__ = ("headers", "key", "offset", "timestamp", "value")

    def __init__(
        self,
        offset: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
    ) -> None:
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.headers = headers

    def __repr__(self) -> str:
        return f"Record(offset={self.offset}, key={self.key!r}, value={self.value!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return (self.offset, self.timestamp, self.key, self.value, self.headers) == (
            other.offset,
            other.timestamp,
            other.key,
            other.value,
            other.headers,
        )


def encode_batch(
    records: Sequence[tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
    **fields: int,
) -> bytes:
    """Encode ``(timestamp_ms, key, value, headers)`` tuples as one batch.

    ``fields`` are ``encode_rows``'s keywords (base_offset, leader_epoch, attributes,
    producer_id, producer_epoch, base_sequence).
    """
    if not records:
        raise ValueError("a batch needs at least one record")
    first_ts = records[0][0]
    max_ts = first_ts
    rows = []
    append = rows.append
    for ts, key, value, headers in records:
        if ts > max_ts:
            max_ts = ts
        if headers:
            append((ts - first_ts, key, value, headers))
        else:
            append((ts - first_ts, key, value))
    return encode_rows(rows, first_ts, max_ts, **fields)


def encode_rows(
    rows: Sequence[tuple[Any, ...]],
    first_ts: int,
    max_ts: int,
    *,
    base_offset: int = 0,
    leader_epoch: int = -1,
    attributes: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = 0,
    base_sequence: int = 0,
) -> bytes:
    """Encode records already in their wire shape, ``(timestamp_delta, key, value)`` or
    ``(timestamp_delta, key, value, headers)`` with headers ``(name, value)`` pairs
    (msgpack writes a tuple and a list alike), as one batch. A ``producer_id`` >= 0
    makes it an idempotent producer's batch (PRODUCER_FLAG).

    The producer keeps its records in this shape from the moment it batches them, so
    sealing a batch is one msgpack call, with no per-record Python work.
    """
    if not rows:
        raise ValueError("a batch needs at least one record")
    payload = msgpack.packb(rows, use_bin_type=True)
    count = len(rows)
    if producer_id >= 0:
        attributes |= PRODUCER_FLAG
        payload = PRODUCER_FIELDS.pack(producer_id, producer_epoch, base_sequence) + payload
    tail = struct.pack(">hiqqi", attributes, count - 1, first_ts, max_ts, count) + payload
    crc = zlib.crc32(tail)
    head = struct.pack(">qiiI", base_offset, len(tail) + 8, leader_epoch, crc)
    return head + tail


def unpack_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Read a header; the caller has checked that HEADER_SIZE bytes are there."""
    return BatchHeader._make(HEADER.unpack_from(buf, pos))


def batch_size_at(buf: bytes | bytearray | memoryview, pos: int) -> int | None:
    """Total size of the batch starting at ``pos``, or None if its length field is cut off."""
    if len(buf) - pos < LOG_OVERHEAD:
        return None
    return _LENGTH.unpack_from(buf, pos + LENGTH_AT)[0] + LOG_OVERHEAD


# The smallest record the encoder can produce: a 3-element fixarray header, then a
# one-byte timestamp delta, key and value (positive fixint / nil). A records array
# claiming more elements than its bytes could hold at this size is a lie, whatever
# its header says: checking it costs one division, not a walk over the records.
MIN_RECORD_SIZE = 4


def _array_header(payload: memoryview) -> tuple[int, int]:
    """``(element count, header bytes)`` of a msgpack array, without decoding the elements."""
    if not payload:
        raise CorruptBatch("records are empty")
    b = payload[0]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F, 1
    if b == 0xDC and len(payload) >= 3:
        return int.from_bytes(payload[1:3], "big"), 3
    if b == 0xDD and len(payload) >= 5:
        return int.from_bytes(payload[1:5], "big"), 5
    raise CorruptBatch("records are not a msgpack array")


class CheckedBatches(bytearray):
    """Batches the broker built from a stock client's produce (``wrap_kafka_batch``), their
    CRC-32C checked a moment ago.

    The log checks everything of these but their CRC (``check_batch(crc=False)``): Kafka
    checks a produce's CRC once on the way in, and a second pass over the same bytes was
    a third of the leader's CRC time. A bytearray, built in one pass: the leader patches
    offsets in place, so a bytes value would be copied into one at append.
    """

    __slots__ = ()


def check_batch(
    buf: bytes | bytearray | memoryview, pos: int, size: int, *, crc: bool = True
) -> BatchHeader:
    """Validate the batch at ``pos`` (``size`` bytes): header fields, CRC (unless ``crc``
    is False: see CheckedBatches), record count.

    This is per-batch work only: one C-level CRC and a glance at the msgpack array header.
    ``record_count`` must equal the array's element count, ``last_offset_delta`` must be
    ``record_count - 1`` (what ``encode_batch`` writes; offsets are assigned from it, so a
    lie here would move the log end), and the array's bytes must be able to hold that many
    records (a CRC-valid header claiming 2^31-1 records in a few bytes is refused).
    """
    if size < HEADER_SIZE:
        raise CorruptBatch(f"batch at byte {pos} is {size} bytes, shorter than its header")
    header = unpack_header(buf, pos)
    if header.record_count <= 0:
        raise CorruptBatch(
            f"batch at byte {pos}: record_count {header.record_count} is not positive"
        )
    if header.last_offset_delta != header.record_count - 1:
        raise CorruptBatch(
            f"batch at byte {pos}: last_offset_delta {header.last_offset_delta} "
            f"is not record_count - 1 (record_count {header.record_count})"
        )
    view = memoryview(buf)[pos + CRC_START : pos + size]
    records_at = header.records_at
    if size < records_at:
        raise CorruptBatch(f"batch at byte {pos}: cut off inside its producer fields")
    kafka = header.attributes & KAFKA_FLAG
    if kafka and (size - records_at < _KAFKA_TAIL_MIN or view[records_at - CRC_START] != 2):
        raise CorruptBatch(f"batch at byte {pos}: its Kafka v2 batch is cut off")
    if crc:
        carried = _carried_header(buf, pos, header) if kafka else None
        if carried is None:
            computed = zlib.crc32(view)
        else:  # the client's CRC-32C, over what it covers (crc_span)
            computed = crc32c(view[records_at + _KAFKA_CRC_START - CRC_START :])
        if computed != header.crc:
            raise CorruptBatch(
                f"batch at byte {pos}: CRC {computed:#010x} != stored {header.crc:#010x}"
            )
        if carried is not None:
            check_wrapped_header(buf, pos, header, carried)
    if kafka:
        return header
    count, header_bytes = _array_header(view[records_at - CRC_START :])
    if count != header.record_count:
        raise CorruptBatch(
            f"batch at byte {pos}: record_count {header.record_count} but the records "
            f"array holds {count}"
        )
    room = size - records_at - header_bytes
    if count * MIN_RECORD_SIZE > room:
        raise CorruptBatch(
            f"batch at byte {pos}: record_count {count} cannot fit in {room} bytes of records"
        )
    return header


def crc_span(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader
) -> tuple[int, Callable[..., int]]:
    """``(where the batch's CRC starts, relative to it; the CRC function)``.

    Ours: zlib.crc32 from the attributes on. A stock client's batch (KAFKA_FLAG) stores
    the CRC-32C its client computed over its v2 batch from its attributes on, checked on
    the way in; so it is checked with that, over those bytes (the ``crc32c`` package, in
    hardware where the CPU has it, as Kafka's Crc32C), rather than a second CRC of ours
    over the same bytes. Batches wrapped before that carry our zlib.crc32 instead: their
    stored CRC differs from the one inside, and they are checked as they were written.
    Both take a running value as a second argument, for a batch checked piece by piece.
    """
    if _carried_header(buf, pos, header) is not None:
        return header.records_at + _KAFKA_CRC_START, crc32c
    return CRC_START, zlib.crc32


def _carried_header(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader
) -> tuple | None:
    """The carried v2 header's fields from its magic byte on, when the batch is a stock
    client's whose stored CRC is that client's CRC-32C (crc_span); None otherwise."""
    if header.attributes & KAFKA_FLAG:
        tail = _KAFKA_TAIL.unpack_from(buf, pos + header.records_at)
        if tail[1] == header.crc:
            return tail
    return None


def check_wrapped_header(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader, tail: tuple | None = None
) -> None:
    """A wrapped stock batch's CRC-32C covers the carried v2 batch only: our header fields
    and producer fields before it must repeat its own, which it covers (per batch, one
    unpack and a few tuple compares), or a flipped bit there would go unnoticed.
    ``tail``: the carried header's fields if the caller has unpacked them already."""
    if tail is None:
        tail = _KAFKA_TAIL.unpack_from(buf, pos + header.records_at)
    # ours: last_offset_delta, first/max timestamp, record_count; theirs: the same.
    if header[5:8] != tail[3:6] or header[8] != tail[9]:
        raise CorruptBatch(f"batch at byte {pos}: its header does not match its v2 batch's")
    attributes = header.attributes
    if attributes & ~PRODUCER_FLAG != KAFKA_FLAG | (tail[2] & (TRANSACTIONAL_FLAG | CONTROL_FLAG)):
        raise CorruptBatch(f"batch at byte {pos}: its attributes do not match its v2 batch's")
    if (
        PRODUCER_FIELDS.unpack_from(buf, pos + HEADER_SIZE) != tail[6:9]
        if attributes & PRODUCER_FLAG
        else tail[6] >= 0
    ):
        raise CorruptBatch(f"batch at byte {pos}: its producer fields do not match its v2 batch's")


def iter_batches(
    buf: bytes | bytearray | memoryview, *, verify: bool = True, allow_partial: bool = False
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for each batch in a buffer of concatenated batches.

    A trailing fragment is an error unless ``allow_partial`` (a fetch response may end
    with a batch cut by max_bytes, as in Kafka; the consumer drops it).
    """
    pos = 0
    end = len(buf)
    while pos < end:
        size = batch_size_at(buf, pos)
        if size is None or pos + size > end:
            if allow_partial:
                return
            raise CorruptBatch(f"truncated batch at byte {pos} of {end}")
        if verify:
            header = check_batch(buf, pos, size)
        else:
            if size < HEADER_SIZE:
                raise CorruptBatch(f"batch at byte {pos} is shorter than its header")
            header = unpack_header(buf, pos)
        yield pos, header
        pos += size


def patch_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Set a batch's base offset in place; the CRC stays valid (it starts after)."""
    _BASE_OFFSET.pack_into(buf, pos, base_offset)


def patch_leader_epoch(buf: bytearray | memoryview, pos: int, epoch: int) -> None:
    _EPOCH.pack_into(buf, pos + EPOCH_AT, epoch)


def producer_fields(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader
) -> tuple[int, int, int] | None:
    """``(producer_id, producer_epoch, base_sequence)`` of an idempotent batch, else None."""
    if not header.attributes & PRODUCER_FLAG:
        return None
    return PRODUCER_FIELDS.unpack_from(buf, pos + HEADER_SIZE)


def restamp_producer(
    buf: bytearray, producer_id: int, producer_epoch: int, base_sequence: int
) -> None:
    """Give a one-batch buffer new producer fields and a CRC to match (a client re-sending
    a batch under a bumped epoch, KIP-360). Per batch work: one CRC, no re-encode."""
    header = unpack_header(buf, 0)
    if not header.attributes & PRODUCER_FLAG:
        raise ValueError("the batch carries no producer fields")
    PRODUCER_FIELDS.pack_into(buf, HEADER_SIZE, producer_id, producer_epoch, base_sequence)
    _CRC.pack_into(buf, CRC_AT, zlib.crc32(memoryview(buf)[CRC_START : header.size]))


def wrap_kafka_batch(
    buf: bytes | bytearray | memoryview,
    pos: int,
    kafka: kafka_records.KafkaBatchHeader,
    out: bytearray | None = None,
) -> bytearray:
    """Our batch carrying a stock client's v2 batch (checked with kafka_records.check_batch),
    appended to ``out`` (a new CheckedBatches if None), which is returned.

    Per batch, never per record: the header fields are copied from Kafka's, an idempotent
    producer's fields too (so the log's sequence checks apply to stock clients unchanged),
    and the tail from the magic byte on is kept as sent, so its CRC-32C (which starts
    after base offset, length and epoch, the fields the leader patches) stays valid and
    ``unwrap_kafka_batch`` serves the client's bytes back. That CRC-32C is also the one
    our header stores: no CRC is computed here (crc_span says how it is checked).
    """
    attributes = KAFKA_FLAG | (kafka.attributes & (TRANSACTIONAL_FLAG | CONTROL_FLAG))
    tail = memoryview(buf)[pos + kafka_records.MAGIC_AT : pos + kafka.size]
    if kafka.producer_id >= 0:
        attributes |= PRODUCER_FLAG
        tail = (
            PRODUCER_FIELDS.pack(kafka.producer_id, kafka.producer_epoch, kafka.base_sequence)
            + tail
        )
    fixed = struct.pack(
        ">hiqqi",
        attributes,
        kafka.last_offset_delta,
        kafka.base_timestamp,
        kafka.max_timestamp,
        kafka.record_count,
    )
    length = 8 + len(fixed) + len(tail)
    if out is None:
        out = CheckedBatches()
    out += struct.pack(">qiiI", 0, length, -1, kafka.crc)
    out += fixed
    out += tail
    return out


def encode_control_batch(
    commit: bool,
    coordinator_epoch: int,
    *,
    producer_id: int,
    producer_epoch: int,
    timestamp: int,
    delete_horizon_ms: int | None = None,
) -> bytearray:
    """A transaction marker as our batch: a Kafka v2 control batch (what a stock consumer
    is served as it is) wrapped like a stock client's batch."""
    v2 = kafka_records.encode_end_txn_marker(
        commit,
        coordinator_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        timestamp=timestamp,
        delete_horizon_ms=delete_horizon_ms,
    )
    return wrap_kafka_batch(v2, 0, kafka_records.unpack_header(v2))


def read_control_batch(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader
) -> tuple[bool, int]:
    """``(commit, coordinator_epoch)`` of our control batch at ``pos``; CorruptBatch if it
    does not hold a transaction marker."""
    if not header.attributes & KAFKA_FLAG:
        raise CorruptBatch(f"control batch at offset {header.base_offset} is not a v2 batch")
    try:
        return kafka_records.read_end_txn_marker(unwrap_kafka_batch(buf, pos, header))
    except ProtocolError as exc:
        raise CorruptBatch(f"control batch at offset {header.base_offset}: {exc}") from None


def unwrap_kafka_batch(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> bytes:
    """The v2 batch a KAFKA_FLAG batch carries, with the offset and epoch the leader gave."""
    tail = memoryview(buf)[pos + header.records_at : pos + header.size]
    return kafka_records.PREFIX.pack(header.base_offset, len(tail) + 4, header.leader_epoch) + tail


# A decoded record is a msgpack array [timestamp_delta, key, value(, headers)], read as
# a tuple: CPython's collector untracks a plain tuple of ints, bytes, str and None once it
# has seen it, so headers a consumer holds cost the collector nothing after that (lists
# stay tracked, and every full collection walked them again: with the Record decoded in
# between, the collector was half of bench consume's CPU).
_ROW_TYPES = {tuple}
_ROW_LENGTHS = frozenset({3, 4})


def decode_rows(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> tuple:
    """One batch's records as msgpack left them: ``(timestamp_delta, key, value[, headers])``
    tuples, headers a tuple of ``(name, value)`` pairs. Their shape is checked with a few
    C-level passes (set of types, set of lengths), no per-record Python code: this is the
    client's only per-record decode, and every reader of records builds on it."""
    if header.attributes & KAFKA_FLAG:
        return _kafka_rows(buf, pos, header)
    start = pos + header.records_at
    try:
        rows = msgpack.unpackb(
            memoryview(buf)[start : pos + header.size], raw=False, use_list=False
        )
    except Exception as exc:  # msgpack raises a zoo of types on hostile bytes
        raise CorruptBatch(f"records of batch at offset {header.base_offset}: {exc}") from None
    if type(rows) is not tuple or len(rows) != header.record_count:
        raise CorruptBatch(f"batch at offset {header.base_offset}: records do not match count")
    lengths = set(map(len, rows)) if set(map(type, rows)) == _ROW_TYPES else None
    if lengths is None or not lengths <= _ROW_LENGTHS:
        raise CorruptBatch(
            f"batch at offset {header.base_offset}: a record is not [ts_delta, key, value(, headers)]"
        )
    if 4 in lengths:  # only records with headers pay for their check
        for i, row in enumerate(rows):
            if len(row) == 4 and not (
                type(row[3]) is tuple and all(type(h) is tuple and len(h) == 2 for h in row[3])
            ):
                raise CorruptBatch(
                    f"record {header.base_offset + i}: headers are not [name, value] pairs"
                )
    return rows


_BLOBS = frozenset({bytes, type(None)})


def walk_rows(
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    *,
    lo: int,
    hi: int,
    require_keys: bool,
) -> tuple[int, list[tuple[int, int, bool]]]:
    """Check every record of our own (msgpack) batch as the leader's validation does:
    ``[int ts_delta, bytes/nil key, bytes/nil value(, [[str, bytes/nil], ...])]``, exactly
    ``record_count`` of them and nothing after; CorruptBatch naming the first that is not.

    Returns the records' largest timestamp and the records that break the topic's rules,
    ``(index, timestamp, keyless)``: keyless when ``require_keys`` and the key is nil,
    else a timestamp outside ``[lo, hi]`` (-1, no timestamp, is never out of range).
    In C when the extension is built (``_record_walk.scan_rows``), else decoded here.
    """
    if _scan_rows is not None:
        try:
            return _scan_rows(
                buf, pos + header.records_at, pos + header.size, header.record_count,
                header.first_timestamp, lo, hi, require_keys,
            )  # fmt: skip
        except ValueError as exc:
            raise CorruptBatch(f"batch at offset {header.base_offset}: {exc}") from None
    rows = decode_rows(buf, pos, header)
    deltas = list(map(_first_field, rows))
    if any(type(d) is not int or not -(2**63) <= d < 2**63 for d in deltas) or not (
        set(map(type, map(_key_field, rows))) <= _BLOBS
        and set(map(type, map(_value_field, rows))) <= _BLOBS
    ):
        raise CorruptBatch(
            f"batch at offset {header.base_offset}: a record's timestamp delta is not an "
            "int64 or its key or value not bytes/nil"
        )
    for i, row in enumerate(rows):
        if len(row) == 4 and any(type(n) is not str or type(d) not in _BLOBS for n, d in row[3]):
            raise CorruptBatch(f"record {i}: a header is not [str, bytes/nil]")
    first = header.first_timestamp
    newest = first + max(deltas)
    flagged = []
    if (require_keys and None in map(_key_field, rows)) or first + min(deltas) < lo or newest > hi:
        for i, row in enumerate(rows):  # only a batch that breaks a rule pays for this
            ts = first + row[0]
            keyless = require_keys and row[1] is None
            if keyless or (not lo <= ts <= hi and ts != -1):
                flagged.append((i, ts, keyless))
    return newest, flagged


_first_field = itemgetter(0)
_key_field = itemgetter(1)
_value_field = itemgetter(2)


def _kafka_rows(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> tuple:
    """A stock Kafka client's batch (KAFKA_FLAG) as the same rows. Per-record Python
    work, but in the client only and only for batches a stock client wrote."""
    try:
        _, records = kafka_records.decode_records(unwrap_kafka_batch(buf, pos, header))
    except ProtocolError as exc:
        raise CorruptBatch(str(exc)) from None
    first_ts = header.first_timestamp
    return tuple(
        (r.timestamp - first_ts, r.key, r.value, tuple(r.headers))
        if r.headers
        else (r.timestamp - first_ts, r.key, r.value)
        for r in records
    )


def batch_rows(
    buf: bytes | bytearray | memoryview, *, min_offset: int = 0
) -> Iterator[tuple[int, int, tuple]]:
    """``(offset of the first row, first_timestamp, rows)`` for each batch of a fetched
    buffer, only rows at or after ``min_offset``; a cut-off tail is dropped. A row's
    timestamp is ``first_timestamp + row[0]``."""
    for pos, header in iter_batches(buf, verify=True, allow_partial=True):
        if header.next_offset <= min_offset:
            continue
        rows = decode_rows(buf, pos, header)
        base = header.base_offset
        if base < min_offset:
            rows = rows[min_offset - base :]
            base = min_offset
        yield base, header.first_timestamp, rows


def _to_records(base: int, first_ts: int, rows: tuple) -> list[Record]:
    return [
        Record(offset, first_ts + row[0], row[1], row[2], list(row[3]) if len(row) == 4 else [])
        for offset, row in zip(count(base), rows)
    ]


def decode_records(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader
) -> list[Record]:
    """One batch's records as Records."""
    return _to_records(header.base_offset, header.first_timestamp, decode_rows(buf, pos, header))


def read_records(buf: bytes | bytearray | memoryview, *, min_offset: int = 0) -> list[Record]:
    """All records of a fetched buffer at or after ``min_offset``; a cut-off tail is dropped."""
    out: list[Record] = []
    for base, first_ts, rows in batch_rows(buf, min_offset=min_offset):
        out += _to_records(base, first_ts, rows)
    return out


def concat(batches: Iterable[bytes]) -> bytes:
    return b"".join(batches)
