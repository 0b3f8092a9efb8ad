"""A topic's ``compression.type`` on the leader's append (Kafka's LogValidator): a stock
client's batch whose codec is not the topic's is re-encoded with it.

``producer`` (the default) keeps every batch as its producer sent it. Any codec name
(``uncompressed``, ``gzip``, ``snappy``, ``lz4``, ``zstd``) re-encodes each Kafka-format batch
of another codec: its records are decompressed and written into a new v2 batch of that codec,
keeping their timestamps, keys, values and headers and the idempotent producer's fields, so
the sequence checks that follow see the same batch. Our own batches carry no compression
(msgpack records) and are stored as they are. This is per-record work, as in Kafka: a topic
that sets compression.type pays it on every mismatched produce; the default pays nothing.
"""

from __future__ import annotations

from typing import Any

from minibroker.protocol.batch import KAFKA_FLAG, unwrap_kafka_batch, wrap_kafka_batch
from minibroker.protocol.kafka import records as kafka_records

PRODUCER = "producer"
# Kafka's compression.type values (the topic config's choices) -> codec numbers.
CODECS = {
    "uncompressed": kafka_records.NONE,
    "gzip": kafka_records.GZIP,
    "snappy": kafka_records.SNAPPY,
    "lz4": kafka_records.LZ4,
    "zstd": kafka_records.ZSTD,
}
COMPRESSION_TYPES = (*CODECS, PRODUCER)


def recompressed(
    buf: bytes | bytearray, batches: list[tuple[int, Any]], compression_type: str
) -> bytearray | None:
    """``buf`` with every Kafka-format batch of another codec re-encoded with the topic's,
    or None when nothing changes (``producer``, or every batch already of that codec)."""
    codec = CODECS.get(compression_type)
    if codec is None:
        return None
    todo = []
    for position, header in batches:
        if header.attributes & KAFKA_FLAG:
            kafka = unwrap_kafka_batch(buf, position, header)
            if kafka_records.unpack_header(kafka).compression != codec:
                todo.append((position, kafka))
    if not todo:
        return None
    out = bytearray()
    changed = dict(todo)
    for position, header in batches:
        kafka = changed.get(position)
        if kafka is None:
            out += buf[position : position + header.size]
            continue
        kh, records = kafka_records.decode_records(kafka)
        fresh = kafka_records.encode_batch(
            [(r.timestamp, r.key, r.value, r.headers) for r in records],
            compression=codec,
            producer_id=kh.producer_id,
            producer_epoch=kh.producer_epoch,
            base_sequence=kh.base_sequence,
        )
        wrap_kafka_batch(fresh, 0, kafka_records.check_batch(fresh, 0, len(fresh)), out)
    return out
