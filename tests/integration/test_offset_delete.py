"""OffsetDelete (issue 38 part 4) on a real cluster: the bundled Admin and kafka-python,
an Empty group and one whose live member consumes one of the topics."""

from __future__ import annotations

import pytest

from minibroker.client import NewTopic
from minibroker.client.records import TopicPartition
from minibroker.client.sync import SyncAdmin, SyncConsumer
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol.errors import GroupIdNotFound, GroupSubscribedToTopic
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("offset-delete"), 3, DEFAULT_CONFIG)
    with SyncAdmin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("od-a", 2, 3), NewTopic("od-b", 1, 3)])
    yield cluster
    cluster.close()


def test_an_empty_groups_offsets_are_deleted_per_partition(cluster):
    with SyncAdmin(cluster.bootstrap) as admin:
        admin.alter_consumer_group_offsets(
            "od-empty", {("od-a", 0): 5, ("od-a", 1): 6, ("od-b", 0): 7}
        )
        outcome = admin.delete_consumer_group_offsets("od-empty", [("od-a", 0), ("od-b", 0)])
        assert outcome == {TopicPartition("od-a", 0): None, TopicPartition("od-b", 0): None}
        assert admin.list_consumer_group_offsets("od-empty") == {TopicPartition("od-a", 1): 6}
        with pytest.raises(GroupIdNotFound):
            admin.delete_consumer_group_offsets("od-nobody", [("od-a", 0)])


def test_a_live_member_keeps_the_offsets_of_the_topics_it_consumes(cluster):
    with SyncAdmin(cluster.bootstrap) as admin:
        admin.alter_consumer_group_offsets("od-live", {("od-a", 0): 1, ("od-b", 0): 2})
    consumer = SyncConsumer(cluster.bootstrap, group_id="od-live")
    try:
        consumer.subscribe(["od-a"])
        wait_until(
            lambda: not consumer.poll(timeout_ms=200) and consumer.assignment(),
            60,
            "the member's assignment",
        )
        with SyncAdmin(cluster.bootstrap) as admin:
            outcome = admin.delete_consumer_group_offsets("od-live", [("od-a", 0), ("od-b", 0)])
            assert isinstance(outcome[TopicPartition("od-a", 0)], GroupSubscribedToTopic)
            assert outcome[TopicPartition("od-b", 0)] is None
            left = admin.list_consumer_group_offsets("od-live")
        assert TopicPartition("od-b", 0) not in left and left[TopicPartition("od-a", 0)] >= 1
    finally:
        consumer.close()


def test_kafka_python_deletes_group_offsets(cluster):
    from kafka import TopicPartition as KpTopicPartition
    from kafka.admin import KafkaAdminClient

    with SyncAdmin(cluster.bootstrap) as admin:
        admin.alter_consumer_group_offsets("od-kp", {("od-a", 1): 3, ("od-b", 0): 4})
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap.split(","))
    try:
        admin.delete_group_offsets("od-kp", [KpTopicPartition("od-a", 1)])  # raises on errors
    finally:
        admin.close()
    with SyncAdmin(cluster.bootstrap) as mb:
        assert mb.list_consumer_group_offsets("od-kp") == {TopicPartition("od-b", 0): 4}
