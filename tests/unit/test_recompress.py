"""compression.type on the leader's append: a stock client's batch of another codec is
re-encoded with the topic's; the default (producer) and our own batches stay as sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from minibroker.broker.storage.log import Log, LogConfig
from minibroker.protocol.batch import iter_batches, unwrap_kafka_batch, wrap_kafka_batch
from minibroker.protocol.kafka import records as kr
from tests.unit.test_storage import batch, vals

ROWS = [(1000 + i, b"k%d" % i, b"v%d" % i * 20, [("h", b"x")]) for i in range(50)]


def kafka_batch(codec: int, **producer: int) -> bytearray:
    raw = kr.encode_batch(ROWS, compression=codec, **producer)
    return wrap_kafka_batch(raw, 0, kr.check_batch(raw, 0, len(raw)))


def stored(log: Log) -> list[tuple[int, list]]:
    """(codec, records) of each stored Kafka-format batch."""
    data = log.read(0, 1 << 20).data
    out = []
    for pos, header in iter_batches(data, verify=True):
        kafka = unwrap_kafka_batch(data, pos, header)
        kh, records = kr.decode_records(kafka)
        out.append((kh.compression, [(r.timestamp, r.key, r.value, r.headers) for r in records]))
    return out


@pytest.mark.parametrize("target", ["gzip", "lz4", "zstd", "snappy", "uncompressed"])
def test_a_batch_of_another_codec_is_stored_with_the_topics(tmp_path: Path, target) -> None:
    log = Log.open(tmp_path, LogConfig(compression_type=target))
    other = kr.GZIP if target == "uncompressed" else kr.NONE
    info = log.append_as_leader(kafka_batch(other), 0)
    assert (info.first_offset, info.last_offset) == (0, 49)
    [(codec, records)] = stored(log)
    assert (
        codec
        == {
            "uncompressed": kr.NONE,
            "gzip": kr.GZIP,
            "lz4": kr.LZ4,
            "zstd": kr.ZSTD,
            "snappy": kr.SNAPPY,
        }[target]
    )
    assert records == [(ts, k, v, [(n, d) for n, d in h]) for ts, k, v, h in ROWS]


def test_producer_keeps_the_codec_and_an_idempotent_batch_keeps_its_sequence(
    tmp_path: Path,
) -> None:
    log = Log.open(tmp_path / "a", LogConfig())
    log.append_as_leader(kafka_batch(kr.LZ4), 0)
    assert stored(log)[0][0] == kr.LZ4
    log = Log.open(tmp_path / "b", LogConfig(compression_type="gzip"))
    first = kafka_batch(kr.NONE, producer_id=7, producer_epoch=0, base_sequence=0)
    log.append_as_leader(first, 0)
    again = log.append_as_leader(
        kafka_batch(kr.NONE, producer_id=7, producer_epoch=0, base_sequence=0), 0
    )
    assert again.duplicate and again.first_offset == 0  # the re-encoded batch kept its fields
    # Our own batches have no codec to change: stored as they came.
    own = batch(vals(3))
    log.append_as_leader(own, 0)
    assert log.log_end_offset == 53
