"""The source's schema, and fetched record batches turned into Arrow columns.

Spark moves Python data-source rows to the JVM as Arrow anyway, so ``read()`` yields
``pyarrow.RecordBatch``es built column by column from each fetch response: one
msgpack decode per broker batch and a few C-level list operations per column, no
Python object per row. A batch a stock Kafka client produced (stored as its v2 bytes,
KAFKA_FLAG) comes out of the same decoder our consumer uses (``protocol.decode_rows``)
in the same row shape. The Arrow schema must equal Spark's exactly (``int32`` for
INT, ``timestamp[us, UTC]`` for TIMESTAMP), which is why it is spelled out here.
"""

from __future__ import annotations

import pyarrow as pa

from minibroker.client.spark.fetch import Chunk
from minibroker.protocol import decode_rows

SOURCE_DDL = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
    "timestamp TIMESTAMP, timestampType INT"
)
HEADERS_DDL = "headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
CREATE_TIME = 0  # Kafka's timestampType for producer-set timestamps (all we store)

HEADER_TYPE = pa.list_(
    pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
)
_TIMESTAMP_MS = pa.timestamp("ms", tz="UTC")
_TIMESTAMP_US = pa.timestamp("us", tz="UTC")


def source_ddl(include_headers: bool) -> str:
    return f"{SOURCE_DDL}, {HEADERS_DDL}" if include_headers else SOURCE_DDL


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", _TIMESTAMP_US),
        ("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(("headers", HEADER_TYPE))
    return pa.schema(fields)


def to_record_batch(
    topic: str, partition: int, chunk: Chunk, include_headers: bool
) -> pa.RecordBatch | None:
    """The chunk's records with offsets in ``[chunk.low, chunk.high)`` as one RecordBatch."""
    keys: list = []
    values: list = []
    stamps: list = []
    offsets: list = []
    headers: list = []
    for pos, header in chunk.batches:
        base = header.base_offset
        rows = decode_rows(chunk.buf, pos, header)
        lo = max(chunk.low - base, 0)
        hi = min(chunk.high - base, len(rows))
        if lo or hi < len(rows):
            rows = rows[lo:hi]
        if not rows:
            continue
        fields = list(zip(*rows, strict=False))  # columns: ts delta, key, value(, headers)
        keys += fields[1]
        values += fields[2]
        stamps += map(header.first_timestamp.__add__, fields[0])
        offsets += range(base + lo, base + lo + len(rows))
        if include_headers:
            # No headers is null, as spark-sql-kafka reads it (not an empty array).
            headers += [r[3] if len(r) > 3 else None for r in rows]
    n = len(offsets)
    if not n:
        return None
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array(offsets, pa.int64()),
        pa.array(stamps, _TIMESTAMP_MS).cast(_TIMESTAMP_US),
        pa.array([CREATE_TIME] * n, pa.int32()),
    ]
    if include_headers:
        columns.append(
            pa.array(
                [None if hs is None else [tuple(h) for h in hs] for hs in headers], HEADER_TYPE
            )
        )
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))
