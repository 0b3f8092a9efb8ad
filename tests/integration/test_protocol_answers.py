"""The protocol answers a Kafka client relies on (issue 34), through both listeners of one
broker with auto.create.topics.enable on: internal topics refuse clients' produces, a
consumer's Metadata creates nothing, OffsetCommit refuses topics that do not exist and keeps
the committed leader epoch (across a restart), illegal topic names are INVALID_TOPIC at
once, authorized operations are answered when asked, and JoinGroup's session timeout
bounds hold for every value.

A stock client (confluent-kafka) where they expose the answer, raw Kafka
requests where they hide it, the bundled client and raw native requests for our own
listener.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest
import trio
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic

from minibroker.client import Admin, Consumer, Producer
from minibroker.client.connection import BrokerConnection
from minibroker.deploy.cluster_ops import acks_all_write
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol import GROUP_METADATA_TOPIC, HEALTH_TOPIC, ApiKey
from minibroker.protocol.errors import ErrorCode, InvalidTopic, UnknownTopicOrPartition
from minibroker.protocol.kafka import (
    KafkaApi,
    KafkaRequestHeader,
    decode_response,
    encode_request,
)
from minibroker.protocol.kafka import records as kafka_records
from minibroker.protocol.kafka.acl_operations import (
    CLUSTER_OPERATIONS,
    GROUP_OPERATIONS,
    NOT_REQUESTED,
    TOPIC_OPERATIONS,
)

pytestmark = pytest.mark.integration

CONFIG = {
    **DEFAULT_CONFIG,
    "auto.create.topics.enable": True,
    "group.min.session.timeout.ms": 500,
    "group.max.session.timeout.ms": 60_000,
    "group.initial.rebalance.delay.ms": 0,
    "offsets.topic.num.partitions": 1,
}
ILLEGAL = ["bad$#!", "x" * 250, ".", ".."]
BOUND_S = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # One broker: it leads every partition and coordinates every group.
    cluster = start_cluster(tmp_path_factory.mktemp("answers"), 1, CONFIG)
    yield cluster
    cluster.close()


def ask(cluster, api_key: int, version: int, body: dict, client_id: str = "t") -> dict:
    """One request to the broker's Kafka listener, its decoded answer."""
    header = KafkaRequestHeader(api_key, version, 1, client_id)
    with socket.create_connection((cluster.state.host, cluster.state.kafka_base_port), 60) as s:
        s.sendall(encode_request(header, body))
        stream = s.makefile("rb")
        (size,) = struct.unpack(">i", stream.read(4))
        return decode_response(header, stream.read(size))


async def ask_native(cluster, api_key: int, version: int, body: dict) -> dict:
    """One request to the broker's native listener in ``version``, its validated answer."""
    async with trio.open_nursery() as nursery:
        conn = await BrokerConnection.open(
            nursery, cluster.state.host, cluster.state.port(0), api_version_timeout=10
        )
        try:
            return await conn.request(api_key, body, version=version, timeout=BOUND_S)
        finally:
            await conn.aclose()


def kafka_metadata(cluster, names: list[str] | None, **flags) -> dict:
    body = {
        "topics": None if names is None else [{"name": n} for n in names],
        "allow_auto_topic_creation": True,
        "include_cluster_authorized_operations": False,
        "include_topic_authorized_operations": False,
        **flags,
    }
    return ask(cluster, KafkaApi.METADATA, 8, body)


def topic_codes(answer: dict) -> dict[str, int]:
    return {t["name"]: t["error_code"] for t in answer["topics"]}


def exists(cluster, topic: str) -> bool:
    return topic_codes(kafka_metadata(cluster, None)).get(topic) is not None


def raw_produce(cluster, topic: str, client_id: str = "t") -> dict:
    batch = kafka_records.encode_batch([(0, None, b"forged", ())])
    body = {
        "transactional_id": None,
        "acks": -1,
        "timeout_ms": 30_000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
    }
    answer = ask(cluster, KafkaApi.PRODUCE, 8, body, client_id)
    return answer["responses"][0]["partition_responses"][0]


def log_end(cluster, topic: str) -> int:
    partitions = cluster.stats(0)["partitions"]
    return next(
        q["log_end_offset"] for q in partitions if (q["topic"], q["partition"]) == (topic, 0)
    )


# --- internal topics ---------------------------------------------------------------------------


@pytest.mark.parametrize("topic", [HEALTH_TOPIC, GROUP_METADATA_TOPIC])
def test_stock_clients_cannot_write_an_internal_topic(cluster, topic):
    """Kafka's appendToLocalLog: INVALID_TOPIC_EXCEPTION (17), nothing appended."""
    if topic == GROUP_METADATA_TOPIC:
        find_coordinator(cluster, "creates-the-offsets-topic")
    before = log_end(cluster, topic)
    refused = raw_produce(cluster, topic)
    assert refused["error_code"] == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert refused["error_message"] == f"Cannot append to internal topic {topic}"
    reports = []
    producer = RdProducer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"})
    producer.produce(topic, b"forged", partition=0, on_delivery=lambda e, m: reports.append(e))
    producer.flush(BOUND_S)
    assert [e.code() for e in reports] == [RdKafkaError.TOPIC_EXCEPTION]
    assert log_end(cluster, topic) == before
    # Metadata flags them as internal (kafka-python will not even send to one then, and
    # librdkafka leaves them out of regex subscriptions).
    flags = {t["name"]: t["is_internal"] for t in kafka_metadata(cluster, None)["topics"]}
    assert flags[topic] is True


async def test_the_bundled_producer_cannot_write_the_health_topic_but_the_check_can(cluster):
    before = log_end(cluster, HEALTH_TOPIC)
    async with Producer(cluster.bootstrap) as producer:
        with pytest.raises(InvalidTopic, match="Cannot append to internal topic"):
            await producer.send(HEALTH_TOPIC, b"forged", partition=0)
    assert log_end(cluster, HEALTH_TOPIC) == before
    # The broker's own writer: `cluster up`'s acks=all check, as the admin client id.
    await acks_all_write(cluster.bootstrap, 1)
    assert log_end(cluster, HEALTH_TOPIC) == before + 1


# --- Metadata and auto-creation ------------------------------------------------------------------


def test_a_metadata_request_that_disallows_auto_creation_creates_nothing(cluster):
    answer = kafka_metadata(cluster, ["not-asked-for"], allow_auto_topic_creation=False)
    assert topic_codes(answer) == {"not-asked-for": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    # A request that allows it still creates its topic (the broker setting is on); the
    # controller creates in order, so once this one exists the first would too.
    kafka_metadata(cluster, ["asked-for"], allow_auto_topic_creation=True)
    cluster.wait_for_leader("asked-for")
    assert not exists(cluster, "not-asked-for")


def test_a_stock_consumer_neither_creates_nor_recreates_a_topic(cluster):
    """librdkafka's consumer asks with allow.auto.create.topics=false (its default)."""
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    admin.create_topics([NewTopic("deleted-once", 1, 1)])["deleted-once"].result(BOUND_S)
    admin.delete_topics(["deleted-once"])["deleted-once"].result(BOUND_S)
    consumer = RdConsumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": "g-no-create",
            "topic.metadata.refresh.interval.ms": 200,
        }
    )
    try:
        consumer.subscribe(["deleted-once", "never-created"])
        unknown: set[str] = set()
        deadline = time.monotonic() + BOUND_S
        while len(unknown) < 2 and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            error = message.error() if message is not None else None
            if error is not None and error.code() == RdKafkaError.UNKNOWN_TOPIC_OR_PART:
                unknown.add(message.topic())
        assert unknown == {"deleted-once", "never-created"}  # its metadata said so
    finally:
        consumer.close()
    kafka_metadata(cluster, ["created-after"])  # the controller creates in order
    cluster.wait_for_leader("created-after")
    assert not exists(cluster, "deleted-once") and not exists(cluster, "never-created")


async def test_native_metadata_v1_honours_allow_auto_topic_creation(cluster):
    refused = await ask_native(
        cluster, ApiKey.METADATA, 1, {"topics": ["native-no"], "allow_auto_topic_creation": False}
    )
    assert refused["topics"][0]["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    await ask_native(cluster, ApiKey.METADATA, 0, {"topics": ["native-v0-yes"]})  # as before
    cluster.wait_for_leader("native-v0-yes")  # created after the first would have been
    assert not exists(cluster, "native-no")


async def test_a_bundled_consumer_with_allow_auto_create_topics_false_creates_nothing(cluster):
    settings = {"allow.auto.create.topics": False, "metadata.max.age.ms": 100}
    async with Consumer(cluster.bootstrap, group_id="g-bundled-never", **settings) as consumer:
        consumer.subscribe(["bundled-never"])
        for _ in range(3):  # polls that refresh the subscribed topic's metadata
            await consumer.poll(timeout_ms=200)
    async with Consumer(cluster.bootstrap, group_id="g-bundled-default") as consumer:
        consumer.subscribe(["bundled-default"])  # the default allows it, as Kafka's consumer
        await consumer.poll(timeout_ms=200)
    cluster.wait_for_leader("bundled-default")  # created in order: the first would be too
    assert not exists(cluster, "bundled-never")


# --- illegal topic names ---------------------------------------------------------------------------


def test_illegal_topic_names_are_invalid_topic_at_once(cluster):
    start = time.monotonic()
    for name in ILLEGAL:
        assert raw_produce(cluster, name)["error_code"] == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert topic_codes(kafka_metadata(cluster, ILLEGAL)) == {
        name: ErrorCode.INVALID_TOPIC_EXCEPTION for name in ILLEGAL
    }
    # ... and nothing was auto-created under them, nor did a legal name beside them suffer
    mixed = topic_codes(kafka_metadata(cluster, ["bad$#!", HEALTH_TOPIC]))
    assert mixed == {"bad$#!": ErrorCode.INVALID_TOPIC_EXCEPTION, HEALTH_TOPIC: 0}
    assert time.monotonic() - start < BOUND_S


async def test_the_bundled_client_gets_invalid_topic_at_once(cluster):
    async with Producer(cluster.bootstrap, **{"delivery.timeout.ms": 120_000}) as producer:
        with trio.fail_after(BOUND_S), pytest.raises(InvalidTopic, match="topic name"):
            await producer.send("bad$#!", b"v")
    for version in (0, 1):
        answer = await ask_native(cluster, ApiKey.METADATA, version, {"topics": [".."]})
        assert answer["topics"][0]["error_code"] == ErrorCode.INVALID_TOPIC_EXCEPTION


# --- authorized operations ---------------------------------------------------------------------


def test_metadata_answers_every_operation_when_asked(cluster):
    asked = kafka_metadata(
        cluster,
        [HEALTH_TOPIC],
        include_cluster_authorized_operations=True,
        include_topic_authorized_operations=True,
    )
    assert asked["cluster_authorized_operations"] == CLUSTER_OPERATIONS == 8096
    assert asked["topics"][0]["topic_authorized_operations"] == TOPIC_OPERATIONS == 3576
    plain = kafka_metadata(cluster, [HEALTH_TOPIC])
    assert plain["cluster_authorized_operations"] == NOT_REQUESTED
    assert plain["topics"][0]["topic_authorized_operations"] == NOT_REQUESTED
    described = ask(
        cluster,
        KafkaApi.DESCRIBE_CLUSTER,
        0,
        {"include_cluster_authorized_operations": True},
    )
    assert described["cluster_authorized_operations"] == CLUSTER_OPERATIONS


def test_describe_groups_answers_every_group_operation_when_asked(cluster):
    find_coordinator(cluster, "g-described")
    for asked, expected in ((True, GROUP_OPERATIONS), (False, NOT_REQUESTED)):
        body = {"groups": ["g-described"], "include_authorized_operations": asked}
        (group,) = ask(cluster, ApiKey.DESCRIBE_GROUPS, 4, body)["groups"]
        assert (group["error_code"], group["authorized_operations"]) == (0, expected)
    assert GROUP_OPERATIONS == 328  # READ, DESCRIBE, DELETE


def test_confluent_admin_sees_every_operation_allowed(cluster):
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    described = admin.describe_cluster(include_authorized_operations=True).result(BOUND_S)
    assert set(described.authorized_operations) == {
        AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
        AclOperation.DESCRIBE,
    }  # fmt: skip
    futures = admin.describe_topics(
        TopicCollection([HEALTH_TOPIC]), include_authorized_operations=True
    )
    topic = futures[HEALTH_TOPIC].result(BOUND_S)
    assert set(topic.authorized_operations) == {
        AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE,
        AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    }  # fmt: skip


# --- groups: JoinGroup's session timeout, OffsetCommit ---------------------------------------


def find_coordinator(cluster, group: str) -> None:
    """Wait until the broker coordinates ``group`` (the offsets topic exists and is loaded)."""
    deadline = time.monotonic() + BOUND_S
    while True:
        try:  # right after a restart the listener may not be open yet
            answer = ask(cluster, KafkaApi.FIND_COORDINATOR, 2, {"key": group, "key_type": 0})
        except OSError as exc:
            answer = {"error": str(exc)}
        if answer.get("error_code") == 0:
            return
        assert time.monotonic() < deadline, answer
        time.sleep(0.05)


def join(cluster, group: str, session_ms: int) -> int:
    body = {
        "group_id": group,
        "session_timeout_ms": session_ms,
        "rebalance_timeout_ms": 10_000,
        "member_id": "",
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
    }
    return ask(cluster, ApiKey.JOIN_GROUP, 5, body)["error_code"]


@pytest.mark.parametrize("session_ms", [-1, 0, 499, 60_001, 2**31 - 1])
def test_join_group_outside_the_session_bounds_is_invalid_session_timeout(cluster, session_ms):
    find_coordinator(cluster, "g-session")
    assert join(cluster, "g-session", session_ms) == ErrorCode.INVALID_SESSION_TIMEOUT


async def test_native_join_group_outside_the_session_bounds_too(cluster):
    find_coordinator(cluster, "g-native-session")
    for session_ms in (-1, 60_001):
        body = {
            "group_id": "g-native-session",
            "session_timeout_ms": session_ms,
            "member_id": "",
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}],
        }
        answer = await ask_native(cluster, ApiKey.JOIN_GROUP, 1, body)
        assert answer["error_code"] == ErrorCode.INVALID_SESSION_TIMEOUT


def offset_commit(cluster, group: str, topic: str, offset: int, epoch: int, version=7) -> int:
    body = {
        "group_id": group,
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "group_instance_id": None,
        "retention_time_ms": -1,
        "topics": [
            {
                "name": topic,
                "partitions": [
                    {
                        "partition_index": 0,
                        "committed_offset": offset,
                        "committed_leader_epoch": epoch,
                        "committed_metadata": None,
                    }
                ],
            }
        ],
    }
    answer = ask(cluster, ApiKey.OFFSET_COMMIT, version, body)
    return answer["topics"][0]["partitions"][0]["error_code"]


def offset_fetch(cluster, group: str, topic: str, version: int = 5) -> tuple[int, int]:
    body = {"group_id": group, "topics": [{"name": topic, "partition_indexes": [0]}]}
    deadline = time.monotonic() + BOUND_S
    while True:
        answer = ask(cluster, ApiKey.OFFSET_FETCH, version, body)
        # A coordinator that just took its partition over reads it back first.
        if answer.get("error_code") != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            break
        assert time.monotonic() < deadline, answer
        time.sleep(0.05)
    partition = answer["topics"][0]["partitions"][0]
    return partition["committed_offset"], partition.get("committed_leader_epoch", -1)


@pytest.mark.parametrize("version", [2, 7])
def test_offset_commit_for_a_topic_that_does_not_exist_stores_nothing(cluster, version):
    group = f"g-missing-{version}"
    find_coordinator(cluster, group)
    code = offset_commit(cluster, group, "no-such-topic", 5, -1, version)
    assert code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert offset_fetch(cluster, group, "no-such-topic") == (-1, -1)
    assert not exists(cluster, "no-such-topic")  # nor did the commit create it


def test_confluent_commit_for_a_missing_topic_fails_per_partition(cluster):
    find_coordinator(cluster, "g-rd-missing")
    consumer = RdConsumer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "g-rd-missing"}
    )
    try:
        with pytest.raises(KafkaException) as caught:
            consumer.commit(offsets=[RdTopicPartition("rd-missing", 0, 5)], asynchronous=False)
        assert caught.value.args[0].code() == RdKafkaError.UNKNOWN_TOPIC_OR_PART
    finally:
        consumer.close()


async def test_the_bundled_admin_cannot_commit_for_a_missing_topic(cluster):
    find_coordinator(cluster, "g-native-missing")
    async with Admin(cluster.bootstrap) as admin:
        with pytest.raises(UnknownTopicOrPartition):
            await admin.alter_consumer_group_offsets("g-native-missing", {("nowhere", 0): 3})
        assert await admin.list_consumer_group_offsets("g-native-missing") == {}


def test_the_committed_leader_epoch_survives_a_restart(cluster):
    """Kafka's listener (OffsetCommit v6+, OffsetFetch v5+) and the native one (v2 / v1)
    keep and return it; it is in the records, so a restarted coordinator has it too."""
    cluster.create_topic("epochs", 1, 1)
    find_coordinator(cluster, "g-epoch")
    consumer = RdConsumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "g-epoch"})
    try:
        consumer.commit(
            offsets=[RdTopicPartition("epochs", 0, 7, leader_epoch=3)], asynchronous=False
        )
        (committed,) = consumer.committed([RdTopicPartition("epochs", 0)], timeout=BOUND_S)
        assert (committed.offset, committed.leader_epoch) == (7, 3)
    finally:
        consumer.close()
    assert offset_fetch(cluster, "g-epoch", "epochs") == (7, 3)
    assert offset_fetch(cluster, "g-epoch", "epochs", version=4) == (7, -1)  # before v5: none
    assert offset_commit(cluster, "g-old", "epochs", 4, 9, version=5) == 0  # v5 has no epoch
    assert offset_fetch(cluster, "g-old", "epochs") == (4, -1)
    native = trio.run(native_commit_and_fetch, cluster)
    assert native == (11, 6)
    cluster.restart(0)
    find_coordinator(cluster, "g-epoch")
    assert offset_fetch(cluster, "g-epoch", "epochs") == (7, 3)
    assert offset_fetch(cluster, "g-native-epoch", "epochs") == (11, 6)
    assert offset_fetch(cluster, "g-old", "epochs") == (4, -1)


async def native_commit_and_fetch(cluster) -> tuple[int, int]:
    partition = {"partition": 0, "committed_offset": 11, "committed_leader_epoch": 6}
    commit = {"group_id": "g-native-epoch", "generation_id": -1, "member_id": "",
              "topics": [{"name": "epochs", "partitions": [partition]}]}  # fmt: skip
    answer = await ask_native(cluster, ApiKey.OFFSET_COMMIT, 2, commit)
    assert answer["topics"][0]["partitions"][0]["error_code"] == 0
    fetch = {"group_id": "g-native-epoch", "topics": [{"name": "epochs", "partition_indexes": [0]}]}
    fetched = (await ask_native(cluster, ApiKey.OFFSET_FETCH, 1, fetch))["topics"][0]
    v0 = (await ask_native(cluster, ApiKey.OFFSET_FETCH, 0, fetch))["topics"][0]
    assert "committed_leader_epoch" not in v0["partitions"][0]  # an older client's shape
    (found,) = fetched["partitions"]
    return found["committed_offset"], found["committed_leader_epoch"]
