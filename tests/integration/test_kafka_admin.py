"""Stock admin clients on the Kafka listener: DeleteTopics, ElectLeaders and DescribeCluster
from confluent-kafka, kafka-python and aiokafka against a real 3-broker cluster, with
Kafka's per-topic errors and the deletion visible in every client's Metadata after."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
import uuid

import pytest
from confluent_kafka import ElectionType, KafkaException
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol.errors import ErrorCode
from minibroker.protocol.kafka import (
    KafkaApi,
    KafkaRequestHeader,
    decode_response,
    encode_request,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # No automatic rebalance: the election test moves leadership back by asking for it.
    config = {**DEFAULT_CONFIG, "auto.leader.rebalance.enable": False}
    cluster = start_cluster(tmp_path_factory.mktemp("kafka-admin"), 3, config)
    yield cluster
    cluster.close()


def rd_admin(cluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})


def rd_create(cluster, *names: str, partitions: int = 1) -> None:
    admin = rd_admin(cluster)  # kept: a destroyed handle fails its futures
    futures = admin.create_topics([NewTopic(n, partitions, 3) for n in names])
    for future in futures.values():
        future.result(30)
    for name in names:  # the answering broker knows them; the others a moment later
        cluster.wait_for_leader(name)


def rd_topics(cluster) -> set[str]:
    return set(rd_admin(cluster).list_topics(timeout=30).topics)


def ask(cluster, broker: int, header: KafkaRequestHeader, body: dict) -> dict:
    """One request to ``broker``'s Kafka listener, its decoded answer."""
    port = cluster.state.kafka_base_port + broker
    with socket.create_connection((cluster.state.host, port), timeout=60) as sock:
        sock.sendall(encode_request(header, body))
        stream = sock.makefile("rb")
        (size,) = struct.unpack(">i", stream.read(4))
        return decode_response(header, stream.read(size))


# --- DeleteTopics --------------------------------------------------------------------------


def test_confluent_kafka_deletes_topics_with_an_error_per_topic(cluster):
    rd_create(cluster, "rd-del-a", "rd-del-b")
    admin = rd_admin(cluster)
    futures = admin.delete_topics(["rd-del-a", "rd-del-missing"], operation_timeout=30)
    assert futures["rd-del-a"].result(60) is None
    with pytest.raises(KafkaException) as missing:
        futures["rd-del-missing"].result(60)
    assert missing.value.args[0].code() == RdKafkaError.UNKNOWN_TOPIC_OR_PART
    # Answered once the deletion committed: Metadata from any broker no longer has it.
    topics = rd_topics(cluster)
    assert "rd-del-a" not in topics and "rd-del-b" in topics


def test_kafka_python_deletes_topics_and_metadata_forgets_them(cluster):
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KpNewTopic
    from kafka.errors import UnknownTopicOrPartitionError

    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap.split(","))
    try:
        admin.create_topics([KpNewTopic("kp-del", 2, 3)])
        # kafka-python 3 negotiates our newest version (v6: topics named by name or id).
        result = admin.delete_topics(["kp-del"], timeout_ms=30000)
        assert [(t["name"], t["error_code"]) for t in result["topics"]] == [("kp-del", 0)]
        assert "kp-del" not in admin.list_topics()
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_topics(["kp-del"], timeout_ms=30000)
        unknown = admin.delete_topics([uuid.uuid4()], timeout_ms=30000, raise_errors=False)
        assert [t["error_code"] for t in unknown["topics"]] == [ErrorCode.UNKNOWN_TOPIC_ID]
    finally:
        admin.close()


def test_aiokafka_deletes_topics(cluster):
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewTopic as AioNewTopic

    async def run() -> tuple[list, list]:
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([AioNewTopic("aio-del", 1, 3)])
            response = await admin.delete_topics(["aio-del", "aio-del-missing"], 30000)
            return response.topic_error_codes, await admin.list_topics()
        finally:
            await admin.close()

    codes, topics = asyncio.run(run())
    assert sorted(codes) == [
        ("aio-del", 0),
        ("aio-del-missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    assert "aio-del" not in topics


def test_delete_topics_refuses_duplicates_and_ambiguous_names_per_topic(cluster):
    rd_create(cluster, "dup-del")
    header = KafkaRequestHeader(KafkaApi.DELETE_TOPICS, 6, 7, "t")
    some_id = uuid.uuid4()
    answer = ask(
        cluster,
        0,
        header,
        {
            "topics": [
                {"name": "dup-del"},
                {"name": "dup-del"},
                {"name": "both", "topic_id": some_id},
                {"name": None},
            ],
            "timeout_ms": 30000,
        },
    )
    got = sorted(
        ((r["name"] or ""), r["error_code"], r["error_message"]) for r in answer["responses"]
    )
    invalid = ErrorCode.INVALID_REQUEST
    assert got == [
        ("", invalid, "Neither topic name nor id were specified."),
        ("both", invalid, "You may not specify both topic name and topic id."),
        ("dup-del", invalid, "Duplicate topic name."),
        ("dup-del", invalid, "Duplicate topic name."),
    ]
    assert "dup-del" in rd_topics(cluster)  # a refused request deletes nothing


def test_a_delete_past_its_timeout_answers_request_timed_out_and_still_completes(cluster):
    rd_create(cluster, "late-del")
    header = KafkaRequestHeader(KafkaApi.DELETE_TOPICS, 5, 9, "t")
    # timeout_ms 0: the deadline passes before the controller's commit can answer.
    answer = ask(cluster, 1, header, {"topic_names": ["late-del"], "timeout_ms": 0})
    [row] = answer["responses"]
    assert (row["name"], row["error_code"]) == ("late-del", ErrorCode.REQUEST_TIMED_OUT)
    deadline = time.monotonic() + 30
    while "late-del" in rd_topics(cluster):  # the deletion itself goes on, as in Kafka
        assert time.monotonic() < deadline, "late-del was never deleted"
        time.sleep(0.1)


# --- ElectLeaders --------------------------------------------------------------------------


def test_confluent_kafka_elects_the_preferred_leader_back(cluster):
    rd_create(cluster, "elect")
    preferred = cluster.partition("elect").replicas[0]
    assert cluster.leader("elect") == preferred
    cluster.kill(preferred)
    try:
        cluster.wait_for_leader("elect", not_on=[preferred])
    finally:
        cluster.restart(preferred)
    cluster.wait_for_isr("elect")
    assert cluster.leader("elect") != preferred  # no automatic rebalance in this cluster
    admin = rd_admin(cluster)
    wanted = [RdTopicPartition("elect", 0), RdTopicPartition("elect", 5)]
    result = admin.elect_leaders(ElectionType.PREFERRED, wanted).result(60)
    errors = {(tp.topic, tp.partition): e and e.code() for tp, e in result.items()}
    assert errors == {
        ("elect", 0): None,
        ("elect", 5): RdKafkaError.UNKNOWN_TOPIC_OR_PART,
    }
    cluster.wait_for_leader("elect", not_on=[b for b in range(3) if b != preferred])
    # Again: the preferred replica leads already.
    again = admin.elect_leaders(ElectionType.PREFERRED, wanted[:1]).result(60)
    assert again[wanted[0]].code() == RdKafkaError.ELECTION_NOT_NEEDED


def test_kafka_python_elect_leaders_names_each_partition(cluster):
    from kafka.admin import KafkaAdminClient

    rd_create(cluster, "kp-elect", partitions=2)
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap.split(","))
    try:
        response = admin.elect_leaders(0, {"kp-elect": [0, 1]}, raise_errors=False)
    finally:
        admin.close()
    assert response.error_code == 0
    rows = {
        (r.topic, p.partition_id): p.error_code
        for r in response.replica_election_results
        for p in r.partition_result
    }
    assert rows == {("kp-elect", 0): ErrorCode.ELECTION_NOT_NEEDED,
                    ("kp-elect", 1): ErrorCode.ELECTION_NOT_NEEDED}  # fmt: skip


def test_elect_leaders_v0_names_a_request_wide_failure_on_each_partition(cluster):
    rd_create(cluster, "elect-v0")
    header = KafkaRequestHeader(KafkaApi.ELECT_LEADERS, 0, 3, "t")
    body = {"topic_partitions": [{"topic": "elect-v0", "partitions": [0]}], "timeout_ms": 30000}
    cluster.fail_api(0, "elect_leaders", "NOT_CONTROLLER", count=1)
    try:
        answer = ask(cluster, 0, header, body)
    finally:
        cluster.clear_faults(0)
    [topic] = answer["replica_election_results"]
    assert [(p["partition_id"], p["error_code"]) for p in topic["partition_result"]] == [
        (0, ErrorCode.NOT_CONTROLLER)
    ]


def test_an_election_past_its_timeout_answers_request_timed_out_on_each_partition(cluster):
    rd_create(cluster, "elect-late")
    controller = cluster.controller
    asked = (controller + 1) % 3
    header = KafkaRequestHeader(KafkaApi.ELECT_LEADERS, 1, 4, "t")
    body = {
        "election_type": 0,
        "topic_partitions": [{"topic": "elect-late", "partitions": [0]}],
        "timeout_ms": 300,
    }
    # The controller answers the forwarded election 5 s late: past the request's deadline.
    cluster.delay_api(controller, "elect_leaders", 5000)
    try:
        answer = ask(cluster, asked, header, body)
    finally:
        cluster.clear_faults(controller)
    assert answer["error_code"] == ErrorCode.REQUEST_TIMED_OUT
    [topic] = answer["replica_election_results"]
    assert [(p["partition_id"], p["error_code"]) for p in topic["partition_result"]] == [
        (0, ErrorCode.REQUEST_TIMED_OUT)
    ]


# --- DescribeCluster -----------------------------------------------------------------------


def test_kafka_python_describe_cluster_names_the_kafka_listeners(cluster):
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap.split(","))
    try:
        described = admin.describe_cluster()
    finally:
        admin.close()
    base = cluster.state.kafka_base_port
    assert described["cluster_id"] == "minibroker"
    assert described["controller_id"] == cluster.controller
    assert sorted((b["broker_id"], b["port"]) for b in described["brokers"]) == [
        (b, base + b) for b in range(3)
    ]


def test_describe_cluster_refuses_the_controller_endpoint_type(cluster):
    header = KafkaRequestHeader(KafkaApi.DESCRIBE_CLUSTER, 1, 4, "t")
    answer = ask(cluster, 2, header, {"endpoint_type": 2})
    assert answer["error_code"] == ErrorCode.UNSUPPORTED_ENDPOINT_TYPE
    assert ask(cluster, 2, header, {"endpoint_type": 1})["error_code"] == 0
