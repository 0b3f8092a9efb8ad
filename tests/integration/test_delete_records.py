"""DeleteRecords and ListOffsets by time at record granularity (issue 38 part 3) on a real
3-broker cluster: confluent-kafka, kafka-python and the bundled clients."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import KafkaException
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import NewTopic as RdNewTopic

from minibroker.client import NewTopic
from minibroker.client.sync import SyncAdmin, SyncConsumer, SyncProducer
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol.errors import ErrorCode, OffsetOutOfRange

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("delete-records"), 3, DEFAULT_CONFIG)
    yield cluster
    cluster.close()


def produce(cluster, topic: str, n: int, partitions: int = 1) -> None:
    with SyncAdmin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, partitions, 3)])
    with SyncProducer(cluster.bootstrap, acks="all") as producer:
        for i in range(n):
            producer.send(topic, f"v{i}".encode(), partition=0)


def earliest(cluster, topic: str) -> int:
    with SyncAdmin(cluster.bootstrap) as admin:
        return next(iter(admin.list_offsets({(topic, 0): -2}).values())).offset


def test_confluent_kafka_deletes_records_and_consumers_start_after_them(cluster):
    produce(cluster, "rd-del-rec", 10)
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    [future] = admin.delete_records([RdTopicPartition("rd-del-rec", 0, 4)]).values()
    assert future.result(30).low_watermark == 4
    assert earliest(cluster, "rd-del-rec") == 4
    # Beyond the high watermark: OFFSET_OUT_OF_RANGE, nothing moves.
    [future] = admin.delete_records([RdTopicPartition("rd-del-rec", 0, 11)]).values()
    with pytest.raises(KafkaException) as beyond:
        future.result(30)
    assert beyond.value.args[0].code() == ErrorCode.OFFSET_OUT_OF_RANGE
    consumer = RdConsumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": "rd-del-rec",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([RdTopicPartition("rd-del-rec", 0, -2)])  # OFFSET_BEGINNING
        first = None
        for _ in range(300):
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                first = message.offset()
                break
        assert first == 4
    finally:
        consumer.close()
    # -1: everything up to the high watermark.
    [future] = admin.delete_records([RdTopicPartition("rd-del-rec", 0, -1)]).values()
    assert future.result(30).low_watermark == 10


def test_a_fetch_below_the_start_is_out_of_range_on_every_replica(cluster):
    produce(cluster, "mb-del-rec", 20)
    with SyncAdmin(cluster.bootstrap) as admin:
        low = admin.delete_records({("mb-del-rec", 0): 12})
    assert list(low.values()) == [12]
    consumer = SyncConsumer(cluster.bootstrap, **{"auto.offset.reset": "none"})
    try:
        consumer.assign([("mb-del-rec", 0)])
        consumer.seek(("mb-del-rec", 0), 5)
        with pytest.raises(OffsetOutOfRange):
            for _ in range(50):
                consumer.poll(timeout_ms=200)
    finally:
        consumer.close()
    with SyncAdmin(cluster.bootstrap) as admin, pytest.raises(OffsetOutOfRange):
        admin.delete_records({("mb-del-rec", 0): 21})
    # The followers moved their start too: after the leader stops, the next one says 12.
    leader = cluster.leader("mb-del-rec")
    cluster.stop(leader)
    try:
        cluster.wait_for_leader("mb-del-rec", not_on=[leader])
        assert earliest(cluster, "mb-del-rec") == 12
    finally:
        cluster.restart(leader)
        cluster.wait_for_isr("mb-del-rec")


def test_kafka_python_deletes_records(cluster):
    from kafka import TopicPartition as KpTopicPartition
    from kafka.admin import KafkaAdminClient

    produce(cluster, "kp-del-rec", 6)
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap.split(","))
    try:
        result = admin.delete_records({KpTopicPartition("kp-del-rec", 0): 3})
        assert result[KpTopicPartition("kp-del-rec", 0)]["low_watermark"] == 3
    finally:
        admin.close()
    assert earliest(cluster, "kp-del-rec") == 3


# --- ListOffsets by time: record granularity -----------------------------------------------


def one_big_batch(cluster, topic: str, base_ts: int) -> None:
    """1,000 records in one batch, timestamps base_ts, base_ts + 1, ..."""
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    admin.create_topics([RdNewTopic(topic, 1, 3)])[topic].result(30)
    cluster.wait_for_leader(topic)
    producer = RdProducer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "linger.ms": 1000,
            "batch.num.messages": 10000,
            "compression.type": "lz4",
        }
    )
    for i in range(1000):
        producer.produce(topic, f"r{i}".encode(), partition=0, timestamp=base_ts + i)
    assert producer.flush(30) == 0


def test_offsets_for_times_finds_every_record_of_a_1000_record_batch(cluster):
    base = 1_700_000_000_000
    one_big_batch(cluster, "rd-times", base)
    consumer = RdConsumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "rd-times"})
    try:
        found = []
        for i in range(1000):  # one partition per call: librdkafka keeps one time per partition
            [tp] = consumer.offsets_for_times([RdTopicPartition("rd-times", 0, base + i)], 30)
            found.append(tp.offset)
        assert found == list(range(1000))
        [after] = consumer.offsets_for_times([RdTopicPartition("rd-times", 0, base + 1000)], 30)
        assert after.offset == -1  # no record that late
    finally:
        consumer.close()
    # The bundled Admin's lookups answer the same records (record granularity).
    with SyncAdmin(cluster.bootstrap) as admin:
        for i in (0, 1, 499, 998, 999):
            [hit] = admin.list_offsets({("rd-times", 0): base + i}).values()
            assert (hit.offset, hit.timestamp) == (i, base + i)


def test_kafka_python_offsets_for_times_is_record_exact(cluster):
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpTopicPartition

    base = 1_700_000_500_000
    one_big_batch(cluster, "kp-times", base)
    consumer = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap.split(","))
    try:
        tp = KpTopicPartition("kp-times", 0)
        for i in (0, 7, 500, 999):
            found = consumer.offsets_for_times({tp: base + i})[tp]
            assert (found.offset, found.timestamp) == (i, base + i)
    finally:
        consumer.close()


def test_max_timestamp_lists_the_record_with_the_largest_time(cluster):
    from confluent_kafka.admin import OffsetSpec

    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    admin.create_topics([RdNewTopic("rd-max-ts", 1, 3)])["rd-max-ts"].result(30)
    cluster.wait_for_leader("rd-max-ts")
    producer = RdProducer({"bootstrap.servers": cluster.kafka_bootstrap, "linger.ms": 0})
    for i, ts in enumerate((1000, 5000, 3000, 5000, 2000)):
        producer.produce("rd-max-ts", f"r{i}".encode(), partition=0, timestamp=ts)
        producer.flush(30)  # one batch each
    tp = RdTopicPartition("rd-max-ts", 0)
    [future] = admin.list_offsets({tp: OffsetSpec.max_timestamp()}).values()
    answer = future.result(30)
    assert (answer.offset, answer.timestamp) == (1, 5000)  # the first record carrying it


def test_the_time_index_answers_across_a_restart_and_is_rebuilt_when_damaged(cluster):
    """Each segment's .timeindex is on disk beside its log; a broker restarted on its data
    answers every record's time exactly, from the file it wrote or, when that file was
    damaged while it was down, from the one it rebuilt (Kafka's recovery)."""
    topic, base = "mb-timeindex", 1_700_002_000_000
    # Replication factor 1: the restarted broker itself must answer (no other leader).
    cluster.create_topic(topic, 1, 1, {"index.interval.bytes": 200})
    with SyncProducer(cluster.bootstrap, acks="all") as producer:
        for i in range(300):  # times out of order every 7th record: the index must cope
            ts = base + 10 * i - (500 if i % 7 == 3 else 0)
            producer.send(topic, f"r{i}".encode(), partition=0, timestamp=ts)
            if i % 5 == 4:
                producer.flush()  # batches of about 5 records
    times = [base + 10 * i - (500 if i % 7 == 3 else 0) for i in range(300)]

    def expected(ts: int) -> tuple[int, int]:
        return next((i, t) for i, t in enumerate(times) if t >= ts)

    def check_all() -> None:
        with SyncAdmin(cluster.bootstrap) as admin:
            for ts in sorted(set(times)):
                [hit] = admin.list_offsets({(topic, 0): ts}).values()
                assert (hit.offset, hit.timestamp) == expected(ts), ts
            [after] = admin.list_offsets({(topic, 0): max(times) + 1}).values()
            assert after.offset == -1

    check_all()
    leader = cluster.leader(topic)
    cluster.stop(leader)  # a clean shutdown writes every index entry
    [path] = cluster.data_dir.rglob(f"{topic}-0/*.timeindex")
    written = path.read_bytes()
    assert len(written) % 12 == 0 and len(written) > 5 * 12  # sparse entries, Kafka's size
    path.write_bytes(b"\xff" * 30)  # damaged while the broker was down
    cluster.restart(leader)
    cluster.wait_for_leader(topic)
    check_all()
    assert path.read_bytes() == written  # rebuilt as it was
    cluster.stop(leader)
    path.unlink()  # and lost
    cluster.restart(leader)
    cluster.wait_for_leader(topic)
    check_all()
    assert path.read_bytes() == written
