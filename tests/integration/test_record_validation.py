"""The leader walks every record a producer sends (Kafka's LogValidator): CRC-valid
batches that lie about their records are refused through the Kafka listener with
Kafka's error codes and per-record errors, nothing of them is stored, and the
partition, its neighbours in the request and other clients go on as before."""

from __future__ import annotations

import socket
import struct
import time

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition

from minibroker.client import SyncProducer
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol.errors import ErrorCode, KafkaError
from minibroker.protocol.kafka import KafkaApi, KafkaRequestHeader, decode_response, encode_request
from minibroker.protocol.kafka import records as kr

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("validate"), 1, DEFAULT_CONFIG)
    cluster.create_topic("plain", 2)
    cluster.create_topic("compacted", config={"cleanup.policy": "compact"})
    cluster.create_topic("recent", config={"message.timestamp.before.max.ms": 60000})
    yield cluster
    cluster.close()


def now_ms() -> int:
    return int(time.time() * 1000)


def lie(batch: bytes, **fields: int) -> bytes:
    """``batch`` with header fields replaced and a CRC-32C that matches again."""
    out = bytearray(batch)
    at = {"last_offset_delta": (23, ">i"), "max_timestamp": (35, ">q"), "record_count": (57, ">i")}
    for name, value in fields.items():
        pos, fmt = at[name]
        struct.pack_into(fmt, out, pos, value)
    struct.pack_into(">I", out, kr.CRC_AT, kr.crc32c(bytes(out[kr.CRC_START :])))
    return bytes(out)


def rows(n: int, *, key: bytes | None = b"k", ts: int | None = None) -> list:
    ts = now_ms() if ts is None else ts
    return [(ts, key, b"v" * 100, []) for _ in range(n)]


def produce(cluster, topic: str, partitions: dict[int, bytes], version: int = 8) -> dict:
    """One raw Produce (acks=1) to the partitions' leader; {partition: answer}."""
    header = KafkaRequestHeader(KafkaApi.PRODUCE, version, 7, "raw")
    body = {
        "transactional_id": None,
        "acks": 1,
        "timeout_ms": 30_000,
        "topic_data": [
            {
                "name": topic,
                "partition_data": [{"index": i, "records": r} for i, r in partitions.items()],
            }
        ],
    }
    host, port = cluster.kafka_bootstrap.split(",")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(encode_request(header, body))
        stream = sock.makefile("rb")
        (size,) = struct.unpack(">i", stream.read(4))
        answer = decode_response(header, stream.read(size))
    return {p["index"]: p for p in answer["responses"][0]["partition_responses"]}


def log_end(cluster, topic: str, partition: int = 0) -> int:
    stats = cluster.stats(cluster.leader(topic, partition))["partitions"]
    return next(
        p["log_end_offset"] for p in stats if p["topic"] == topic and p["partition"] == partition
    )


LIES = {
    # A batch that claims 1 record and holds 3 (confluent-kafka re-read offsets 0-2 forever).
    "claims 1 holds 3": lambda codec: lie(
        kr.encode_batch(rows(3), compression=codec), record_count=1, last_offset_delta=0
    ),
    # One 100-byte produce that moved the log end by 2^31-1.
    "claims 2^31-1": lambda codec: lie(
        kr.encode_batch(rows(1), compression=codec),
        record_count=2**31 - 1,
        last_offset_delta=2**31 - 2,
    ),
    "max_timestamp lie": lambda codec: lie(
        kr.encode_batch(rows(2), compression=codec), max_timestamp=now_ms() + 99
    ),
}


@pytest.mark.parametrize("codec", [kr.NONE, kr.GZIP, kr.ZSTD], ids=["none", "gzip", "zstd"])
@pytest.mark.parametrize("name", list(LIES))
def test_a_lying_batch_is_refused_and_nothing_is_stored(cluster, name, codec):
    before = log_end(cluster, "plain")
    answer = produce(cluster, "plain", {0: LIES[name](codec)})[0]
    assert answer["error_code"] == ErrorCode.INVALID_RECORD, answer
    assert answer["error_message"]
    assert log_end(cluster, "plain") == before


def test_a_fake_gzip_block_is_a_corrupt_message(cluster):
    honest = kr.encode_batch(rows(3), compression=kr.GZIP)
    fake = bytearray(honest)
    fake[kr.HEADER_SIZE + 20 :] = b"\x00" * (len(fake) - kr.HEADER_SIZE - 20)
    before = log_end(cluster, "plain")
    answer = produce(cluster, "plain", {0: lie(bytes(fake))})[0]
    assert answer["error_code"] == ErrorCode.CORRUPT_MESSAGE
    assert "gzip" in answer["error_message"]
    assert log_end(cluster, "plain") == before


def test_only_the_lying_partition_of_a_request_is_refused(cluster):
    good = kr.encode_batch(rows(2))
    bad = LIES["claims 1 holds 3"](kr.NONE)
    before = log_end(cluster, "plain", 0), log_end(cluster, "plain", 1)
    answers = produce(cluster, "plain", {0: bad, 1: good})
    assert answers[0]["error_code"] == ErrorCode.INVALID_RECORD
    assert answers[1]["error_code"] == 0 and answers[1]["base_offset"] == before[1]
    assert (log_end(cluster, "plain", 0), log_end(cluster, "plain", 1)) == (
        before[0],
        before[1] + 2,
    )


def test_keyless_records_in_a_compacted_topic_carry_record_errors(cluster):
    batch = kr.encode_batch(rows(1) + rows(1, key=None) + rows(1) + rows(1, key=None))
    answer = produce(cluster, "compacted", {0: batch})[0]
    assert answer["error_code"] == ErrorCode.INVALID_RECORD
    assert [
        (e["batch_index"], e["batch_index_error_message"]) for e in answer["record_errors"]
    ] == [
        (1, "Compacted topic cannot accept message without key"),
        (3, "Compacted topic cannot accept message without key"),
    ]
    assert "2 record errors" in answer["error_message"]
    # Produce v7 has no record_errors: the same code, the summary only.
    older = produce(cluster, "compacted", {0: batch}, version=7)[0]
    assert older["error_code"] == ErrorCode.INVALID_RECORD and not older.get("record_errors")
    assert log_end(cluster, "compacted") == 0
    assert produce(cluster, "compacted", {0: kr.encode_batch(rows(2))})[0]["error_code"] == 0


def test_timestamps_out_of_range_are_invalid_timestamps(cluster):
    now = now_ms()
    late = kr.encode_batch(rows(1, ts=now) + rows(1, ts=now - 3_600_000))  # 1 h old
    answer = produce(cluster, "recent", {0: late})[0]
    assert answer["error_code"] == ErrorCode.INVALID_TIMESTAMP
    assert [e["batch_index"] for e in answer["record_errors"]] == [1]
    # The broker's default message.timestamp.after.max.ms: one hour ahead, as Kafka 4.0.
    future = kr.encode_batch(rows(1, ts=now + 2 * 3_600_000))
    assert produce(cluster, "plain", {0: future})[0]["error_code"] == ErrorCode.INVALID_TIMESTAMP
    assert log_end(cluster, "recent") == 0


def test_the_native_listener_is_held_to_the_same_rules(cluster):
    with SyncProducer(cluster.bootstrap, acks="all") as producer:
        with pytest.raises(KafkaError) as refused:
            producer.send("compacted", b"no key")
        assert refused.value.code == ErrorCode.INVALID_RECORD


def test_stock_clients_are_served_after_the_refusals(cluster):
    producer = RdProducer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"})
    before = log_end(cluster, "plain", 1)
    for i in range(50):
        producer.produce("plain", b"after-%d" % i, b"k", partition=1)
    assert producer.flush(30) == 0
    consumer = RdConsumer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "v", "enable.auto.commit": False}
    )
    try:
        consumer.assign([RdTopicPartition("plain", 1, before)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 50 and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message.value())
    finally:
        consumer.close()
    assert got == [b"after-%d" % i for i in range(50)]
