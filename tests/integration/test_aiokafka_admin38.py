"""aiokafka's admin client on issue 38's APIs: create_partitions, alter/describe_configs and
delete_records, against a real 3-broker cluster."""

from __future__ import annotations

import asyncio

import pytest

from minibroker.client import NewTopic
from minibroker.client.sync import SyncAdmin, SyncProducer
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol.errors import ErrorCode
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("aiokafka-admin"), 3, DEFAULT_CONFIG)
    with SyncAdmin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("aio-t", 2, 3)])
    with SyncProducer(cluster.bootstrap, acks="all") as producer:
        for i in range(8):
            producer.send("aio-t", b"v%d" % i, partition=0)
    yield cluster
    cluster.close()


def run(cluster, job):
    from aiokafka.admin import AIOKafkaAdminClient

    async def main():
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
        await admin.start()
        try:
            return await job(admin)
        finally:
            await admin.close()

    return asyncio.run(main())


def partition_count(cluster) -> int:
    with SyncAdmin(cluster.bootstrap) as admin:
        return len(admin.describe_topics(["aio-t"])["aio-t"].partitions)


def test_aiokafka_creates_partitions_and_is_refused_fewer(cluster):
    from aiokafka.admin.new_partitions import NewPartitions

    grown = run(cluster, lambda a: a.create_partitions({"aio-t": NewPartitions(4)}))
    assert [tuple(r[:2]) for r in grown.topic_errors] == [("aio-t", 0)]
    wait_until(lambda: partition_count(cluster) == 4, 30, "4 partitions")

    async def fewer(admin):
        try:
            return await admin.create_partitions({"aio-t": NewPartitions(3)})
        except Exception as exc:  # aiokafka raises the named error for a refused topic
            return exc

    refused = run(cluster, fewer)
    codes = (
        [r.error_code for r in refused.results] if hasattr(refused, "results") else [refused.errno]
    )
    assert codes == [ErrorCode.INVALID_PARTITIONS]
    assert partition_count(cluster) == 4


def test_aiokafka_alters_and_describes_topic_configs(cluster):
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    resource = ConfigResource(ConfigResourceType.TOPIC, "aio-t", {"retention.ms": "123456"})
    [altered] = run(cluster, lambda a: a.alter_configs([resource]))
    assert [r[0] for r in altered.resources] == [0]

    def described() -> dict:
        plain = ConfigResource(ConfigResourceType.TOPIC, "aio-t")
        [answer] = run(cluster, lambda a: a.describe_configs([plain]))
        [res] = answer.resources
        return {entry[0]: entry[1] for entry in res[4]}

    wait_until(lambda: described().get("retention.ms") == "123456", 30, "retention.ms")


def test_aiokafka_deletes_records(cluster):
    from aiokafka.admin.records_to_delete import RecordsToDelete
    from aiokafka.structs import TopicPartition

    tp = TopicPartition("aio-t", 0)
    low = run(cluster, lambda a: a.delete_records({tp: RecordsToDelete(before_offset=5)}))
    assert low == {tp: 5}
    with SyncAdmin(cluster.bootstrap) as admin:
        assert next(iter(admin.list_offsets({("aio-t", 0): -2}).values())).offset == 5
