"""CreatePartitions (issue 38 part 1) on a real 3-broker cluster, from both listeners:
confluent-kafka's and kafka-python's admin clients, the bundled Admin and the CLI, with
Kafka's errors for bad input, and a group consumer that follows a topic grown 3 -> 6."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import KafkaException
from confluent_kafka import Producer as RdProducer
from confluent_kafka.admin import NewPartitions, NewTopic

from minibroker.client import NewPartitions as MbNewPartitions
from minibroker.client import NewTopic as MbNewTopic
from minibroker.client.sync import SyncAdmin, SyncProducer
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol.errors import (
    ErrorCode,
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidRequest,
    PolicyViolation,
    UnknownTopicOrPartition,
)
from tests.integration.cluster_helpers import cli, rd_admin
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

CAP = 40  # controller.max.partitions.per.request here: a request over it is refused


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    config = {**DEFAULT_CONFIG, "controller.max.partitions.per.request": CAP}
    cluster = start_cluster(tmp_path_factory.mktemp("create-partitions"), 3, config)
    yield cluster
    cluster.close()


def rd_create(cluster, name: str, partitions: int, rf: int = 2) -> None:
    admin = rd_admin(cluster)
    admin.create_topics([NewTopic(name, partitions, rf)])[name].result(30)
    cluster.wait_for_leader(name)


def partitions_of(cluster, name: str) -> list:
    with SyncAdmin(cluster.bootstrap) as admin:
        return admin.describe_topics([name])[name].partitions


def rd_code(future) -> int:
    with pytest.raises(KafkaException) as refused:
        future.result(30)
    return refused.value.args[0].code()


# --- confluent-kafka ----------------------------------------------------------------------


def test_confluent_kafka_grows_a_topic_with_kafkas_errors(cluster):
    rd_create(cluster, "rd-grow", 3)
    admin = rd_admin(cluster)
    # validate_only: answered, nothing changes
    futures = admin.create_partitions([NewPartitions("rd-grow", 5)], validate_only=True)
    assert futures["rd-grow"].result(30) is None
    assert len(partitions_of(cluster, "rd-grow")) == 3
    assert admin.create_partitions([NewPartitions("rd-grow", 5)])["rd-grow"].result(30) is None
    wait_until(lambda: len(partitions_of(cluster, "rd-grow")) == 5, 30, "5 partitions")
    grown = partitions_of(cluster, "rd-grow")
    assert all(len(p.replicas) == 2 and p.leader in p.replicas for p in grown)
    # Fewer or as many partitions: INVALID_PARTITIONS, the topic unchanged.
    assert rd_code(admin.create_partitions([NewPartitions("rd-grow", 4)])["rd-grow"]) == (
        ErrorCode.INVALID_PARTITIONS
    )
    assert rd_code(admin.create_partitions([NewPartitions("rd-grow", 5)])["rd-grow"]) == (
        ErrorCode.INVALID_PARTITIONS
    )
    missing = admin.create_partitions([NewPartitions("rd-grow-missing", 2)])
    assert rd_code(missing["rd-grow-missing"]) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    # Manual assignment of the new partition: its replicas as given, the first one leads.
    manual = admin.create_partitions([NewPartitions("rd-grow", 6, [[2, 0]])])
    assert manual["rd-grow"].result(30) is None
    wait_until(lambda: len(partitions_of(cluster, "rd-grow")) == 6, 30, "6 partitions")
    sixth = partitions_of(cluster, "rd-grow")[5]
    assert sixth.replicas == [2, 0] and sixth.leader == 2
    # A broker that does not exist, or a replica count unlike the topic's: refused.
    bad = admin.create_partitions([NewPartitions("rd-grow", 7, [[0, 9]])])
    assert rd_code(bad["rd-grow"]) == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    bad = admin.create_partitions([NewPartitions("rd-grow", 7, [[0, 1, 2]])])
    assert rd_code(bad["rd-grow"]) == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert len(partitions_of(cluster, "rd-grow")) == 6


def test_confluent_kafka_is_refused_over_the_per_request_cap(cluster):
    rd_create(cluster, "rd-cap", 1)
    admin = rd_admin(cluster)
    over = admin.create_partitions([NewPartitions("rd-cap", CAP + 2)])
    assert rd_code(over["rd-cap"]) == ErrorCode.POLICY_VIOLATION
    assert len(partitions_of(cluster, "rd-cap")) == 1


# --- kafka-python -------------------------------------------------------------------------


def test_kafka_python_grows_a_topic_and_is_refused_fewer(cluster):
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewPartitions as KpNewPartitions
    from kafka.errors import InvalidPartitionsError

    rd_create(cluster, "kp-grow", 2)
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap.split(","))
    try:
        result = admin.create_partitions({"kp-grow": KpNewPartitions(4)})
        assert [(r.name, r.error_code) for r in result.results] == [("kp-grow", 0)]
        wait_until(lambda: len(partitions_of(cluster, "kp-grow")) == 4, 30, "4 partitions")
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({"kp-grow": KpNewPartitions(3)})
        checked = admin.create_partitions({"kp-grow": KpNewPartitions(8)}, validate_only=True)
        assert [r.error_code for r in checked.results] == [0]
        assert len(partitions_of(cluster, "kp-grow")) == 4
    finally:
        admin.close()


# --- the bundled Admin --------------------------------------------------------------------


def test_admin_grows_a_topic_and_a_producer_writes_to_the_new_partitions(cluster):
    with SyncAdmin(cluster.bootstrap) as admin, SyncProducer(cluster.bootstrap) as producer:
        admin.create_topics([MbNewTopic("mb-grow", 2, 3)])
        assert producer.send("mb-grow", b"v", partition=1).partition == 1  # knows 2 partitions
        assert admin.create_partitions({"mb-grow": 4}) == {"mb-grow": None}
        assert len(admin.describe_topics(["mb-grow"])["mb-grow"].partitions) == 4
        # The producer refreshes its metadata for a partition it does not know yet.
        assert {producer.send("mb-grow", b"v", partition=p).partition for p in (2, 3)} == {2, 3}
        assert admin.create_partitions(
            {"mb-grow": MbNewPartitions(5, [[1, 2, 0]])}, validate_only=True
        ) == {"mb-grow": None}
        assert len(admin.describe_topics(["mb-grow"])["mb-grow"].partitions) == 4
        with pytest.raises(InvalidPartitions, match="would not be an increase"):
            admin.create_partitions({"mb-grow": 3})
        with pytest.raises(InvalidReplicaAssignment, match="only 1 assignment"):
            admin.create_partitions({"mb-grow": MbNewPartitions(6, [[0, 1, 2]])})
        with pytest.raises(UnknownTopicOrPartition):
            admin.create_partitions({"mb-grow-missing": 3})
        with pytest.raises(PolicyViolation, match=r"controller\.max\.partitions\.per\.request"):
            admin.create_partitions({"mb-grow": 4 + CAP + 1})
        outcome = admin.create_partitions({"mb-grow": 5, "mb-grow-missing": 2}, raise_errors=False)
        assert outcome["mb-grow"] is None
        assert isinstance(outcome["mb-grow-missing"], UnknownTopicOrPartition)
        assert len(admin.describe_topics(["mb-grow"])["mb-grow"].partitions) == 5


def test_internal_topics_keep_their_partition_count(cluster):
    with SyncAdmin(cluster.bootstrap) as admin, pytest.raises(InvalidRequest, match="internal"):
        admin.create_partitions({"__minibroker_health": 9})


# --- a group follows the growth -----------------------------------------------------------


def test_confluent_group_consumer_reads_the_new_partitions_after_growth(cluster):
    rd_create(cluster, "rd-follow", 3)
    consumer = RdConsumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": "rd-follow-group",
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 500,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    producer = RdProducer({"bootstrap.servers": cluster.kafka_bootstrap, "linger.ms": 0})
    try:
        consumer.subscribe(["rd-follow"])
        wait_until(
            lambda: consumer.poll(0.2) is None and len(consumer.assignment()) == 3,
            60,
            "the consumer's first assignment",
        )
        admin = rd_admin(cluster)  # kept: a destroyed handle fails its futures
        admin.create_partitions([NewPartitions("rd-follow", 6)])["rd-follow"].result(30)
        wait_until(lambda: len(partitions_of(cluster, "rd-follow")) == 6, 30, "6 partitions")

        # Records to the new partitions only; the producer learns of them on its refresh.
        def produce_to(partition: int) -> bool:
            try:  # refused (unknown partition) until the producer's metadata has it
                producer.produce("rd-follow", b"new", partition=partition)
            except KafkaException:
                producer.poll(0.1)
                return False
            return True

        for partition in (3, 4, 5):
            wait_until(lambda p=partition: produce_to(p), 30, f"a produce to partition {partition}")
        assert producer.flush(30) == 0
        seen: set[int] = set()

        def read_new() -> bool:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                seen.add(message.partition())
            return seen >= {3, 4, 5}

        # Its metadata max age is 0.5 s: a generous bound for the refresh and the rebalance.
        wait_until(read_new, 60, "records of partitions 3, 4 and 5", poll=0)
        assert {tp.partition for tp in consumer.assignment()} == set(range(6))
    finally:
        consumer.close()


# --- the CLI ------------------------------------------------------------------------------


def test_cli_topics_alter_adds_partitions(cluster):
    rd_create(cluster, "cli-grow", 1)
    grown = cli(
        "topics", "alter", "cli-grow", "--partitions", "3", "--bootstrap", cluster.bootstrap
    )
    assert grown.returncode == 0, grown.stderr
    assert "Grew topic cli-grow to 3 partition(s)." in grown.stdout
    wait_until(lambda: len(partitions_of(cluster, "cli-grow")) == 3, 30, "3 partitions")
    manual = cli(
        "topics", "alter", "cli-grow", "--partitions", "4", "--replica-assignment", "1:0",
        "--bootstrap", cluster.bootstrap,
    )  # fmt: skip
    assert manual.returncode == 0, manual.stderr
    wait_until(lambda: len(partitions_of(cluster, "cli-grow")) == 4, 30, "4 partitions")
    assert partitions_of(cluster, "cli-grow")[3].replicas == [1, 0]
    fewer = cli(
        "topics", "alter", "cli-grow", "--partitions", "2", "--bootstrap", cluster.bootstrap
    )
    assert fewer.returncode != 0
    assert "INVALID_PARTITIONS" in fewer.stderr and "Traceback" not in fewer.stderr


def test_bundled_group_consumer_reads_the_new_partitions_after_growth(cluster):
    from minibroker.client.sync import SyncConsumer

    with SyncAdmin(cluster.bootstrap) as admin:
        admin.create_topics([MbNewTopic("mb-follow", 3, 2)])
    consumer = SyncConsumer(
        cluster.bootstrap,
        group_id="mb-follow-group",
        **{"auto.offset.reset": "earliest", "metadata.max.age.ms": 500},
    )
    try:
        consumer.subscribe(["mb-follow"])
        wait_until(
            lambda: not consumer.poll(timeout_ms=200) and len(consumer.assignment()) == 3,
            60,
            "the consumer's first assignment",
        )
        with SyncAdmin(cluster.bootstrap) as admin:
            admin.create_partitions({"mb-follow": 6})
        with SyncProducer(cluster.bootstrap) as producer:
            for partition in (3, 4, 5):
                producer.send("mb-follow", b"new", partition=partition)
        seen: set[int] = set()

        def read_new() -> bool:
            seen.update(r.partition for r in consumer.poll(timeout_ms=200))
            return seen >= {3, 4, 5}

        # The leader sees 6 partitions on its next refresh (0.5 s) and rejoins.
        wait_until(read_new, 60, "records of partitions 3, 4 and 5", poll=0)
        assert {tp.partition for tp in consumer.assignment()} == set(range(6))
    finally:
        consumer.close()
