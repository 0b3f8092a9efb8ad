"""CreateTopics with manual replica assignments (issue 38 part 4), from confluent-kafka,
kafka-python and the bundled Admin, with Kafka's errors."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from minibroker.client import NewTopic as MbNewTopic
from minibroker.client.sync import SyncAdmin
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol.errors import ErrorCode, InvalidReplicaAssignment, InvalidRequest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("assigned"), 3, DEFAULT_CONFIG)
    yield cluster
    cluster.close()


def replicas(cluster, name: str) -> list[list[int]]:
    with SyncAdmin(cluster.bootstrap) as admin:
        return [p.replicas for p in admin.describe_topics([name])[name].partitions]


def test_confluent_kafka_creates_a_topic_where_it_is_told(cluster):
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    topic = NewTopic("rd-assigned", 3, replica_assignment=[[2, 0], [0, 1], [1, 2]])
    admin.create_topics([topic])["rd-assigned"].result(30)
    assert replicas(cluster, "rd-assigned") == [[2, 0], [0, 1], [1, 2]]
    leaders = [cluster.wait_for_leader("rd-assigned", p) for p in range(3)]
    assert leaders == [2, 0, 1]
    for bad in ([[0, 7]], [[0, 0]], [[0, 1], [2]]):
        future = admin.create_topics(
            [NewTopic("rd-assigned-bad", len(bad), replica_assignment=bad)]
        )
        with pytest.raises(KafkaException) as refused:
            future["rd-assigned-bad"].result(30)
        assert refused.value.args[0].code() == ErrorCode.INVALID_REPLICA_ASSIGNMENT


def test_kafka_python_creates_a_topic_with_assignments(cluster):
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KpNewTopic

    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap.split(","))
    try:
        admin.create_topics([KpNewTopic("kp-assigned", replica_assignments={0: [1], 1: [2]})])
    finally:
        admin.close()
    assert replicas(cluster, "kp-assigned") == [[1], [2]]


def test_bundled_admin_creates_with_assignments_and_refuses_counts_beside_them(cluster):
    with SyncAdmin(cluster.bootstrap) as admin:
        admin.create_topics([MbNewTopic("mb-assigned", replica_assignments=[[1, 2, 0]])])
        with pytest.raises(InvalidRequest, match="cannot be used at the same time"):
            admin.create_topics([MbNewTopic("mb-both", 1, 3, replica_assignments=[[0, 1, 2]])])
        with pytest.raises(InvalidReplicaAssignment, match="no such broker"):
            admin.create_topics([MbNewTopic("mb-bad", replica_assignments=[[5]])])
        assert "mb-bad" not in admin.list_topics()
    assert replicas(cluster, "mb-assigned") == [[1, 2, 0]]
