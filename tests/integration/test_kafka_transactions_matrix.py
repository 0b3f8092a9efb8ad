"""The rest of issue 37's per-client matrix: every stock client's transactional producer
commits visibly, aborts invisibly (visible to read_uncommitted), sends a consumer's
offsets in its transaction (consume-transform-produce), is fenced by a successor with its
transactional id, and has an abandoned transaction aborted by transaction.timeout.ms.

confluent-kafka runs all five in test_kafka_transactions.py; kafka-python and aiokafka
run the ones that file does not. Readers are confluent-kafka consumers (one reader for
every writer, so a difference is the writer's).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition

from minibroker.deploy.testing import start_cluster
from tests.integration.test_kafka_transactions import (
    TXN_CONFIG,
    create,
    describe,
    read_committed,
    wait_for_state,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("txn-matrix"), 3, TXN_CONFIG)
    yield cluster
    cluster.close()


def seed(cluster, topic: str, count: int) -> None:
    producer = RdProducer({"bootstrap.servers": cluster.kafka_bootstrap})
    for i in range(count):
        producer.produce(topic, b"in-%d" % i)
    assert producer.flush(30) == 0


def committed_offset(cluster, group: str, topic: str) -> int:
    checker = RdConsumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group})
    try:
        return checker.committed([RdTopicPartition(topic, 0)], 10)[0].offset
    finally:
        checker.close()


def wait_aborted_by_timeout(cluster, transactional_id: str) -> None:
    """The coordinator's timer aborts it: nothing the client does ends it."""
    deadline = time.monotonic() + 30
    while describe(cluster, transactional_id)["transaction_state"] != "CompleteAbort":
        assert time.monotonic() < deadline, f"{transactional_id} was not aborted by its timeout"
        time.sleep(0.1)


# --- kafka-python ---------------------------------------------------------------------------


def test_kafka_python_consume_transform_produce(cluster):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    create(cluster.kafka_bootstrap, "kp-in")
    create(cluster.kafka_bootstrap, "kp-out")
    seed(cluster, "kp-in", 5)
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap,
        group_id="kp-app",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, transactional_id="kp-app")
    try:
        tp = TopicPartition("kp-in", 0)
        consumer.assign([tp])
        records = []
        deadline = time.monotonic() + 30
        while len(records) < 5 and time.monotonic() < deadline:
            records += consumer.poll(timeout_ms=500).get(tp, [])
        assert len(records) == 5
        producer.init_transactions()
        # An aborted round first: neither its output nor its offsets may show.
        producer.begin_transaction()
        for record in records:
            producer.send("kp-out", b"aborted " + record.value)
        offsets = {tp: OffsetAndMetadata(records[-1].offset + 1, "", -1)}
        producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
        producer.abort_transaction()
        assert committed_offset(cluster, "kp-app", "kp-in") < 0
        producer.begin_transaction()
        for record in records:
            producer.send("kp-out", record.value.upper())
        producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
        producer.commit_transaction()
    finally:
        producer.close(5)
        consumer.close()
    wait_for_state(cluster, "kp-app", "CompleteCommit")
    assert sorted(read_committed(cluster, "kp-out", 1, 5)) == [b"IN-%d" % i for i in range(5)]
    assert committed_offset(cluster, "kp-app", "kp-in") == 5


def test_kafka_python_transaction_timeout_aborts_an_abandoned_transaction(cluster):
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KpError

    create(cluster.kafka_bootstrap, "kp-abandoned")
    producer = KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap,
        transactional_id="kp-abandoner",
        transaction_timeout_ms=2000,
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("kp-abandoned", b"never committed").get(30)
        wait_aborted_by_timeout(cluster, "kp-abandoner")
        with pytest.raises(KpError):
            producer.commit_transaction()
    finally:
        producer.close(5)
    assert read_committed(cluster, "kp-abandoned", 1) == []
    assert read_committed(cluster, "kp-abandoned", 1, 1, "read_uncommitted") == [b"never committed"]


# --- aiokafka -------------------------------------------------------------------------------


def test_aiokafka_commit_is_visible_abort_is_not(cluster):
    from aiokafka import AIOKafkaProducer

    create(cluster.kafka_bootstrap, "aio-eos", 3)

    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap, transactional_id="aio-writer"
        )
        await asyncio.wait_for(producer.start(), 30)
        try:
            async with producer.transaction():
                for i in range(9):
                    await producer.send("aio-eos", b"kept-%d" % i, partition=i % 3)
            await producer.begin_transaction()
            for i in range(9):
                await producer.send_and_wait("aio-eos", b"dropped-%d" % i, partition=i % 3)
            await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(run())
    wait_for_state(cluster, "aio-writer", "CompleteAbort")
    kept = sorted(b"kept-%d" % i for i in range(9))
    assert sorted(read_committed(cluster, "aio-eos", 3, 9)) == kept
    everything = read_committed(cluster, "aio-eos", 3, 18, "read_uncommitted")
    assert sorted(everything) == sorted(kept + [b"dropped-%d" % i for i in range(9)])


def test_aiokafka_a_successor_fences_the_zombie(cluster):
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import ProducerFenced

    create(cluster.kafka_bootstrap, "aio-fenced")

    async def run() -> None:
        def producer() -> AIOKafkaProducer:
            return AIOKafkaProducer(
                bootstrap_servers=cluster.kafka_bootstrap, transactional_id="aio-zombie"
            )

        zombie = producer()
        await asyncio.wait_for(zombie.start(), 30)
        successor = producer()
        try:
            async with zombie.transaction():
                await zombie.send("aio-fenced", b"before")
            await asyncio.wait_for(successor.start(), 30)  # InitProducerId: epoch bumped
            with pytest.raises(ProducerFenced):
                async with zombie.transaction():
                    await zombie.send_and_wait("aio-fenced", b"zombie")
            async with successor.transaction():
                await successor.send("aio-fenced", b"after")
        finally:
            await successor.stop()
            await zombie.stop()

    asyncio.run(run())
    wait_for_state(cluster, "aio-zombie", "CompleteCommit")
    assert read_committed(cluster, "aio-fenced", 1) == [b"before", b"after"]


def test_aiokafka_transaction_timeout_aborts_an_abandoned_transaction(cluster):
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError as AioError

    create(cluster.kafka_bootstrap, "aio-abandoned")

    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap,
            transactional_id="aio-abandoner",
            transaction_timeout_ms=2000,
        )
        await asyncio.wait_for(producer.start(), 30)
        try:
            await producer.begin_transaction()
            await producer.send_and_wait("aio-abandoned", b"never committed")
            await asyncio.to_thread(wait_aborted_by_timeout, cluster, "aio-abandoner")
            with pytest.raises(AioError):
                await asyncio.wait_for(producer.commit_transaction(), 30)
        finally:
            await producer.stop()

    asyncio.run(run())
    assert read_committed(cluster, "aio-abandoned", 1) == []
