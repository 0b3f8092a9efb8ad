"""The source reads what a stock Kafka client produced: confluent-kafka's batches are
stored as Kafka v2 bytes (KAFKA_FLAG) and read by the same decoder our consumer uses,
beside our own batches in the same partition, with offset ranges cutting into them."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer as RdProducer

from minibroker.client import NewTopic, SyncAdmin, SyncProducer
from minibroker.deploy.launcher import free_port

from .conftest import rows_by_offset, single_broker

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory):
    """A broker with a Kafka listener: (native address, Kafka bootstrap)."""
    kafka = f"127.0.0.1:{free_port()}"
    with single_broker(
        tmp_path_factory.mktemp("spark-kafka"), {"kafka.listener": kafka}
    ) as address:
        yield address, kafka


def test_records_a_stock_client_produced_read_back_exactly(spark, kafka_broker):
    native, kafka = kafka_broker
    topic = "stock-written"
    with SyncAdmin(native) as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])

    # confluent-kafka, lz4-compressed batches of several records (one Kafka batch each)
    producer = RdProducer(
        {"bootstrap.servers": kafka, "acks": "all", "linger.ms": 50, "compression.type": "lz4"}
    )
    sent = []
    for i in range(40):
        key = None if i % 7 == 0 else b"k%d" % i
        headers = [("n", b"%d" % i)] if i % 2 else None
        producer.produce(
            topic, b"v%d" % i, key, partition=i % 2, timestamp=T0 + i, headers=headers,
            on_delivery=lambda err, msg: sent.append((err, msg.partition(), msg.offset())),
        )  # fmt: skip
    assert producer.flush(60) == 0
    assert [err for err, _, _ in sent] == [None] * 40
    # ... then our own producer into the same partitions (msgpack batches after them)
    with SyncProducer(native, acks="all") as ours:
        for h in ours.send_many(
            topic, [{"value": b"ours", "partition": p, "timestamp": T0 + 100} for p in (0, 1)]
        ):
            h.result(10)

    expected = {
        (topic, i % 2, i // 2): (None if i % 7 == 0 else b"k%d" % i, b"v%d" % i, T0 + i)
        for i in range(40)
    }
    expected |= {(topic, p, 20): (None, b"ours", T0 + 100) for p in (0, 1)}
    df = spark.read.format("minibroker").option("kafka.bootstrap.servers", native)
    df = df.option("subscribe", topic).option("includeHeaders", "true").load()
    assert rows_by_offset(df) == expected
    headers = {
        (r.partition, r.offset): None
        if r.headers is None
        else [(h.key, h.value) for h in r.headers]
        for r in df.select("partition", "offset", "headers").collect()
    }
    assert headers[(1, 0)] == [("n", b"1")] and headers[(0, 0)] is None

    # A range that starts and ends inside the stock client's batches.
    start = json.dumps({topic: {"0": 3, "1": 5}})
    end = json.dumps({topic: {"0": 9, "1": 21}})
    part = (
        spark.read.format("minibroker")
        .option("kafka.bootstrap.servers", native)
        .option("subscribe", topic)
        .option("startingOffsets", start)
        .option("endingOffsets", end)
        .load()
    )
    assert sorted((r.partition, r.offset) for r in part.collect()) == sorted(
        [(0, o) for o in range(3, 9)] + [(1, o) for o in range(5, 21)]
    )
