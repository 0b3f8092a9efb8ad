"""Kafka's record batch, magic v2 (KIP-98): the bytes stock clients produce and fetch.

Layout (big-endian), 61 bytes of header then the records:

    base_offset int64, batch_length int32, partition_leader_epoch int32, magic int8 (2),
    crc uint32 (CRC-32C of everything after it), attributes int16, last_offset_delta int32,
    base_timestamp int64, max_timestamp int64, producer_id int64, producer_epoch int16,
    base_sequence int32, record_count int32

    record: length varint, attributes int8, timestamp_delta varlong, offset_delta varint,
            key (varint length, -1 null), value (likewise), header count varint,
            headers (key: varint length + utf-8, value: varint length, -1 null)

Attributes: bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), bit 3
timestamp type, bit 4 transactional, bit 5 control. The records after the header are
compressed as one block when a codec is set. ``cramjam`` does every codec and ``crc32c``
the checksum (C code, both); nothing here re-implements them.

The broker never calls the per-record functions on its hot path: it keeps a stock
client's batch as it came (protocol/batch.py wraps it) and serves it back as it was.
They serve the clients (decoding what they fetch) and the rare read through the Kafka
listener of a batch our own client wrote.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from crc32c import crc32c

from minibroker.protocol.errors import ProtocolError
from minibroker.protocol.kafka.messages import read_varint, write_varint

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
MAGIC_AT = 16
CRC_AT = 17
CRC_START = 21  # attributes: the first byte the CRC covers
LOG_OVERHEAD = 12  # base_offset + batch_length
MAGIC = 2
PREFIX = struct.Struct(">qii")  # base_offset, batch_length, partition_leader_epoch

COMPRESSION_MASK = 0x07
NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
TIMESTAMP_TYPE_FLAG = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
# KIP-534: the batch's base timestamp is its delete horizon (the log cleaner set it when
# the batch's tombstones or marker became removable; it goes once the horizon passed).
DELETE_HORIZON_FLAG = 0x40

_XERIAL = b"\x82SNAPPY\x00"  # snappy-java's framing, which the Java client writes


class CorruptKafkaBatch(ProtocolError):
    """A v2 batch whose length, magic, CRC or records do not hold together."""


class UnsupportedCompression(ProtocolError):
    """A compression codec this installation cannot read (UNSUPPORTED_COMPRESSION_TYPE)."""


class KafkaBatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK


def _cramjam() -> Any:
    try:
        import cramjam
    except ImportError:  # only the codecs need it; plain batches read without it
        return None
    return cramjam


def check_compression(codec: int) -> None:
    """Raise UnsupportedCompression unless batches of ``codec`` can be read here."""
    if codec not in CODEC_NAMES:
        raise UnsupportedCompression(f"compression codec {codec} does not exist")
    if codec != NONE and _cramjam() is None:
        raise UnsupportedCompression(
            f"{CODEC_NAMES[codec]} batches need the cramjam package, which is not installed"
        )


def decompress(codec: int, data: bytes | memoryview) -> bytes:
    check_compression(codec)
    if codec == NONE:
        return bytes(data)
    cj = _cramjam()
    try:
        if codec == GZIP:
            return bytes(cj.gzip.decompress(data))
        if codec == SNAPPY:
            return _snappy(cj, bytes(data))
        if codec == LZ4:
            return bytes(cj.lz4.decompress(data))
        return bytes(cj.zstd.decompress(data))
    except Exception as exc:  # cramjam raises its own errors on bad input
        raise CorruptKafkaBatch(f"{CODEC_NAMES[codec]} block does not decompress: {exc}") from None


def _snappy(cj: Any, data: bytes) -> bytes:
    """Raw snappy (librdkafka) or snappy-java's xerial blocks (the Java client)."""
    if not data.startswith(_XERIAL):
        return bytes(cj.snappy.decompress_raw(data))
    pos, out = 16, bytearray()  # magic, then two int32 versions
    while pos < len(data):
        (n,) = struct.unpack_from(">i", data, pos)
        out += cj.snappy.decompress_raw(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return bytes(out)


def compress(codec: int, data: bytes) -> bytes:
    check_compression(codec)
    if codec == NONE:
        return data
    cj = _cramjam()
    if codec == GZIP:
        return bytes(cj.gzip.compress(data))
    if codec == SNAPPY:
        return bytes(cj.snappy.compress_raw(data))
    if codec == LZ4:
        return bytes(cj.lz4.compress(data))
    return bytes(cj.zstd.compress(data))


def unpack_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> KafkaBatchHeader:
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptKafkaBatch(f"batch at byte {pos} is shorter than the v2 header")
    header = KafkaBatchHeader._make(HEADER.unpack_from(buf, pos))
    if header.magic != MAGIC:
        raise CorruptKafkaBatch(
            f"batch at byte {pos} has magic {header.magic}; only v2 batches (magic 2) are served"
        )
    return header


def check_batch(buf: bytes | bytearray | memoryview, pos: int, size: int) -> KafkaBatchHeader:
    """Header sanity and the CRC-32C: per-batch work, no record is decoded."""
    header = unpack_header(buf, pos)
    if size < HEADER_SIZE or header.size != size:
        raise CorruptKafkaBatch(f"batch at byte {pos}: length {header.batch_length} is wrong")
    if header.record_count <= 0 or header.last_offset_delta != header.record_count - 1:
        raise CorruptKafkaBatch(
            f"batch at byte {pos}: record_count {header.record_count} with last_offset_delta "
            f"{header.last_offset_delta}"
        )
    crc = crc32c(memoryview(buf)[pos + CRC_START : pos + size])
    if crc != header.crc:
        raise CorruptKafkaBatch(f"batch at byte {pos}: CRC-32C {crc:#010x} != {header.crc:#010x}")
    return header


def iter_batches(
    buf: bytes | bytearray | memoryview, *, allow_partial: bool = False
) -> Iterator[tuple[int, int]]:
    """``(position, size)`` of each batch of a concatenation (a produce's records field)."""
    pos, end = 0, len(buf)
    while pos < end:
        if end - pos < LOG_OVERHEAD:
            if allow_partial:
                return
            raise CorruptKafkaBatch(f"truncated batch at byte {pos}")
        size = int.from_bytes(buf[pos + 8 : pos + 12], "big", signed=True) + LOG_OVERHEAD
        if size < HEADER_SIZE or pos + size > end:
            if allow_partial and size >= HEADER_SIZE:
                return
            raise CorruptKafkaBatch(f"truncated batch at byte {pos}")
        yield pos, size
        pos += size


# --- records (clients, tests, and the cross-format read) ----------------------------------


class KafkaRecord(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def _read_blob(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    n, pos = read_varint(buf, pos)
    if n < 0:
        return None, pos
    end = pos + n
    if end > len(buf):
        raise CorruptKafkaBatch("record field cut off")
    return buf[pos:end], end


def decode_records(
    buf: bytes | bytearray | memoryview, pos: int = 0
) -> tuple[KafkaBatchHeader, list[KafkaRecord]]:
    """One batch's records (decompressed). Control batches (transaction markers) have none."""
    header = unpack_header(buf, pos)
    body = decompress(header.compression, memoryview(buf)[pos + HEADER_SIZE : pos + header.size])
    if header.attributes & CONTROL_FLAG:
        return header, []
    out = []
    at = 0
    base, base_ts = header.base_offset, header.base_timestamp
    try:
        for _ in range(header.record_count):
            length, at = read_varint(body, at)
            end = at + length
            at += 1  # record attributes, unused
            ts_delta, at = read_varint(body, at)
            offset_delta, at = read_varint(body, at)
            key, at = _read_blob(body, at)
            value, at = _read_blob(body, at)
            count, at = read_varint(body, at)
            headers = []
            for _ in range(count):
                name, at = _read_blob(body, at)
                data, at = _read_blob(body, at)
                headers.append((bytes(name or b"").decode(), data))
            if at != end:
                raise CorruptKafkaBatch(f"record at offset {base + offset_delta} has a bad length")
            out.append(KafkaRecord(base + offset_delta, base_ts + ts_delta, key, value, headers))
    except (IndexError, UnicodeDecodeError) as exc:
        raise CorruptKafkaBatch(f"records of batch at offset {base}: {exc}") from None
    return header, out


def encode_batch(
    records: Sequence[tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
    *,
    base_offset: int = 0,
    leader_epoch: int = -1,
    compression: int = NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
    delete_horizon_ms: int | None = None,
) -> bytes:
    """``(timestamp_ms, key, value, headers)`` tuples as one v2 batch (CreateTime).

    ``attributes``: bits besides the codec (TRANSACTIONAL_FLAG, CONTROL_FLAG).
    ``delete_horizon_ms``: Kafka's delete horizon, carried as the base timestamp (the
    records' deltas are from it, so their timestamps are unchanged)."""
    if not records:
        raise ValueError("a batch needs at least one record")
    base_ts = records[0][0]
    if delete_horizon_ms is not None:
        base_ts = delete_horizon_ms
        attributes |= DELETE_HORIZON_FLAG
    max_ts = max(r[0] for r in records)
    body = bytearray()
    for delta, (ts, key, value, headers) in enumerate(records):
        rec = bytearray(b"\x00")
        write_varint(rec, ts - base_ts)
        write_varint(rec, delta)
        for blob in (key, value):
            if blob is None:
                write_varint(rec, -1)
            else:
                write_varint(rec, len(blob))
                rec += blob
        write_varint(rec, len(headers))
        for name, data in headers:
            raw = name.encode()
            write_varint(rec, len(raw))
            rec += raw
            if data is None:
                write_varint(rec, -1)
            else:
                write_varint(rec, len(data))
                rec += data
        write_varint(body, len(rec))
        body += rec
    payload = compress(compression, bytes(body))
    count = len(records)
    tail = (
        struct.pack(
            ">hiqqqhii",
            compression | attributes,
            count - 1,
            base_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
        + payload
    )
    head = PREFIX.pack(base_offset, len(tail) + 9, leader_epoch)
    return head + struct.pack(">bI", MAGIC, crc32c(tail)) + tail


# A transaction marker (Kafka's EndTransactionMarker): the one record of a control batch.
# Key: version int16 (0) + type int16 (0 abort, 1 commit); value: version int16 (0) +
# coordinator epoch int32.
CONTROL_ABORT = 0
CONTROL_COMMIT = 1
_CONTROL_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")


def encode_end_txn_marker(
    commit: bool,
    coordinator_epoch: int,
    *,
    producer_id: int,
    producer_epoch: int,
    timestamp: int,
    delete_horizon_ms: int | None = None,
) -> bytes:
    """The control batch a partition leader appends when a transaction ends (the log
    cleaner writes it again with a ``delete_horizon_ms``)."""
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _MARKER_VALUE.pack(0, coordinator_epoch)
    return encode_batch(
        [(timestamp, key, value, ())],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        attributes=TRANSACTIONAL_FLAG | CONTROL_FLAG,
        delete_horizon_ms=delete_horizon_ms,
    )


def delete_horizon(header: KafkaBatchHeader) -> int | None:
    """The batch's delete horizon (KIP-534), or None when it has none."""
    return header.base_timestamp if header.attributes & DELETE_HORIZON_FLAG else None


def read_end_txn_marker(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[bool, int]:
    """``(commit, coordinator_epoch)`` of a control batch's marker; CorruptKafkaBatch if
    its one record is not a version-0 marker (Kafka's EndTransactionMarker.deserialize)."""
    header = unpack_header(buf, pos)
    body = bytes(buf[pos + HEADER_SIZE : pos + header.size])
    try:
        _, at = read_varint(body, 0)  # record length
        at += 1  # record attributes
        _, at = read_varint(body, at)  # timestamp delta
        _, at = read_varint(body, at)  # offset delta
        key, at = _read_blob(body, at)
        value, at = _read_blob(body, at)
    except IndexError:
        raise CorruptKafkaBatch("control record cut off") from None
    if key is None or len(key) < _CONTROL_KEY.size or value is None:
        raise CorruptKafkaBatch("a control record without a marker key and value")
    version, kind = _CONTROL_KEY.unpack_from(key)
    if version != 0 or kind not in (CONTROL_ABORT, CONTROL_COMMIT):
        raise CorruptKafkaBatch(f"control record version {version} type {kind}: not a marker")
    if len(value) < _MARKER_VALUE.size:
        raise CorruptKafkaBatch("transaction marker value cut off")
    _, coordinator_epoch = _MARKER_VALUE.unpack_from(value)
    return kind == CONTROL_COMMIT, coordinator_epoch
