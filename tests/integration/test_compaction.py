"""Log compaction on real brokers: a compacted topic whose keys are overwritten many times
shrinks on every replica once cleaned, and a consumer from the beginning still reads the
latest value of every key; committed offsets survive a restart after __consumer_offsets
itself was compacted."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from minibroker.client import Admin, Consumer, NewTopic, Producer
from minibroker.protocol.batch import HEADER_SIZE
from tests.integration.cluster_helpers import read_segments

pytestmark = pytest.mark.integration

KEYS = 20
ROUNDS = 60
CLEANER = {"log.cleaner.backoff.ms": 100}


def partition_bytes(directory: Path) -> int:
    return sum(read_segments(directory, lambda path: path.stat().st_size))


async def wait_for(predicate, what: str, timeout: float = 60) -> None:
    """Wait on the thing itself (the cleaner runs on its own schedule), generously bounded."""
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.1)
        return
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


async def test_a_compacted_topic_shrinks_and_keeps_the_latest_value_per_key(cluster_factory):
    state = await cluster_factory(3, CLEANER)
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics(
            [
                NewTopic(
                    "compacted",
                    1,
                    3,
                    {
                        "cleanup.policy": "compact",
                        "internal.segment.bytes": "4096",
                        "min.cleanable.dirty.ratio": "0.1",
                    },
                )
            ]
        )
    latest: dict[bytes, bytes] = {}
    async with Producer(state.bootstrap, acks=-1, **{"linger.ms": 0}) as producer:
        for r in range(ROUNDS):
            for k in range(KEYS):
                key, value = f"key-{k}".encode(), f"value-{r}-{k}".encode()
                await producer.send("compacted", value, key=key)
                latest[key] = value
    written = KEYS * ROUNDS
    dirs = sorted(Path(state.data_dir).rglob("compacted-0"))
    assert len(dirs) == 3, dirs
    # One batch per send (linger.ms 0, each awaited), each at least a batch header: what
    # was written is at least this, and the cleaner has been at it meanwhile already.
    full = written * HEADER_SIZE
    # Every replica cleans its own log: all three shrink to a fraction of what was written.
    await wait_for(
        lambda: all(partition_bytes(d) < full / 8 for d in dirs), "every replica to be cleaned"
    )
    got: dict[bytes, bytes] = {}
    offsets = []
    async with Consumer(state.bootstrap) as consumer:
        consumer.assign([("compacted", 0)])
        consumer.seek_to_beginning()
        end = (await consumer.end_offsets([("compacted", 0)]))[next(iter(consumer.assignment()))]
        assert end == written  # offsets never change: the log end is where it was
        position = 0
        while position < end:
            records = await consumer.poll(timeout_ms=5000)
            assert records, f"stuck at {position} of {end}"
            for record in records:
                got[record.key] = record.value  # later records win, as for any reader
                offsets.append(record.offset)
            position = records[-1].offset + 1
    assert got == latest
    assert offsets == sorted(offsets) and len(offsets) < written / 4  # gaps where records went


async def test_committed_offsets_survive_restart_after_offsets_topic_compaction(
    broker_factory, tmp_path
):
    data = tmp_path / "offsets"
    config = {
        **CLEANER,
        "offsets.topic.num.partitions": 1,
        "offsets.topic.replication.factor": 1,
        "offsets.topic.segment.bytes": 2048,
        "log.cleaner.min.cleanable.ratio": 0.1,
    }
    proc = broker_factory(config, data_dir=data)
    async with Admin(proc.address) as admin:
        await admin.create_topics([NewTopic("t", 2, 1)])
    async with (
        Consumer(proc.address, group_id="kept") as kept,
        Consumer(proc.address, group_id="other") as other,
    ):
        for i in range(150):
            await kept.commit({("t", 0): i, ("t", 1): 1000 + i})
            await other.commit({("t", 0): 7 * i})
    offsets_dir = data / "__consumer_offsets-0"
    written = 300 * HEADER_SIZE  # 300 commits, a batch each
    await wait_for(lambda: partition_bytes(offsets_dir) < written / 4, "__consumer_offsets cleaned")
    proc.stop()
    proc = broker_factory(config, data_dir=data)
    async with (
        Consumer(proc.address, group_id="kept") as kept,
        Consumer(proc.address, group_id="other") as other,
    ):
        committed = await kept.committed([("t", 0), ("t", 1)])
        assert {(tp.topic, tp.partition): o for tp, o in committed.items()} == {
            ("t", 0): 149,
            ("t", 1): 1149,
        }
        assert list((await other.committed([("t", 0)])).values()) == [7 * 149]


def test_a_stock_client_reads_a_compacted_topic_it_wrote(tmp_path):
    """confluent-kafka (librdkafka) writes idempotent, multi-record v2 batches; once cleaned
    (some copied whole, some re-encoded) it reads every key's latest value across the gaps."""
    from confluent_kafka import Consumer as RdConsumer
    from confluent_kafka import Producer as RdProducer
    from confluent_kafka import TopicPartition as RdTopicPartition
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin import NewTopic as RdNewTopic

    from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster

    cluster = start_cluster(tmp_path / "rd", 3, {**DEFAULT_CONFIG, **CLEANER})
    try:
        bootstrap = cluster.kafka_bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        configs = {"cleanup.policy": "compact", "internal.segment.bytes": "4096"}
        configs["min.cleanable.dirty.ratio"] = "0.1"
        for future in admin.create_topics([RdNewTopic("rdc", 1, 3, config=configs)]).values():
            future.result(30)
        producer = RdProducer(
            {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True}
        )
        latest = {}
        for r in range(ROUNDS):
            for k in range(KEYS):  # a round's records share batches
                key, value = f"key-{k}".encode(), f"value-{r}-{k}".encode()
                producer.produce("rdc", value, key)
                latest[key] = value
            assert producer.flush(30) == 0
        dirs = sorted(Path(tmp_path / "rd").rglob("rdc-0"))
        assert len(dirs) == 3
        written = KEYS * ROUNDS * 10  # at least ~10 bytes a record (key and value alone)
        deadline = time.monotonic() + 60
        while not all(partition_bytes(d) < written / 4 for d in dirs):
            assert time.monotonic() < deadline, "every replica to be cleaned"
            time.sleep(0.1)
        consumer = RdConsumer(
            {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
        )
        try:
            _, high = consumer.get_watermark_offsets(RdTopicPartition("rdc", 0), timeout=30)
            assert high == KEYS * ROUNDS
            consumer.assign([RdTopicPartition("rdc", 0, 0)])
            got, offsets = {}, []
            deadline = time.monotonic() + 30
            while not offsets or offsets[-1] < high - 1:
                assert time.monotonic() < deadline, f"stuck after {offsets[-1:]}"
                message = consumer.poll(1)
                if message is not None:
                    assert message.error() is None, message.error()
                    got[message.key()] = message.value()
                    offsets.append(message.offset())
        finally:
            consumer.close()
        assert got == latest
        assert offsets == sorted(offsets) and len(offsets) < KEYS * ROUNDS / 4
    finally:
        cluster.close()
