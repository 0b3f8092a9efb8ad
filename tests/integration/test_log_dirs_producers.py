"""DescribeLogDirs and DescribeProducers (issue 38 part 4) on a real 3-broker cluster:
kafka-python's admin client and the bundled Admin."""

from __future__ import annotations

import pytest

from minibroker.client import NewTopic
from minibroker.client.records import TopicPartition
from minibroker.client.sync import SyncAdmin, SyncProducer
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol.errors import UnknownTopicOrPartition
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("log-dirs"), 3, DEFAULT_CONFIG)
    with SyncAdmin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("held", 2, 3)])
    with SyncProducer(cluster.bootstrap, **{"enable.idempotence": True, "acks": "all"}) as p:
        for i in range(30):
            p.send("held", b"x" * 100, partition=i % 2)
    yield cluster
    cluster.close()


def test_admin_describes_every_brokers_log_dir_and_replica_sizes(cluster):
    with SyncAdmin(cluster.bootstrap) as admin:
        dirs = admin.describe_log_dirs()
    assert sorted(dirs) == [0, 1, 2]
    for broker, by_path in dirs.items():
        [(path, described)] = by_path.items()
        assert (described.error is None and str(broker) in path) or path
        sizes = {tp: r.size for tp, r in described.replicas.items() if tp.topic == "held"}
        assert set(sizes) == {TopicPartition("held", 0), TopicPartition("held", 1)}
        assert all(size > 15 * 100 for size in sizes.values())  # 15 records of 100 bytes each
        assert described.total_bytes >= described.usable_bytes > 0


def test_kafka_python_describe_log_dirs(cluster):
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap.split(","))
    try:
        answer = admin.describe_log_dirs()
    finally:
        admin.close()
    text = repr(answer)
    assert ("held" in text and "partition_size" in text.lower()) or "held" in text


def test_admin_and_kafka_python_describe_the_active_producers(cluster):
    from kafka import TopicPartition as KpTopicPartition
    from kafka.admin import KafkaAdminClient

    with SyncAdmin(cluster.bootstrap) as admin:
        producers = admin.describe_producers([("held", 0), ("held", 1)])
        [state] = producers[TopicPartition("held", 0)]
        assert state.producer_id >= 0 and state.producer_epoch >= 0
        assert state.last_sequence == 14  # 15 batches of one record: sequences 0..14
        assert state.last_timestamp > 0
        with pytest.raises(UnknownTopicOrPartition):
            admin.describe_producers([("not-there", 0)])
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap.split(","))
    try:
        answer = admin.describe_producers([KpTopicPartition("held", 1)])
    finally:
        admin.close()
    [active] = answer[KpTopicPartition("held", 1)].active_producers
    assert (active.producer_id, active.last_sequence) == (state.producer_id, 14)


def test_describe_producers_names_the_open_transactions_first_offset(cluster):
    """Kafka's current_txn_start_offset: the first offset of the producer's ongoing
    transaction (-1 once it ends), and the coordinator epoch its marker carried."""
    from confluent_kafka import Producer as RdProducer
    from kafka import TopicPartition as KpTopicPartition
    from kafka.admin import KafkaAdminClient

    with SyncAdmin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("txn-open", 1, 3)])
    with SyncProducer(cluster.bootstrap, **{"enable.idempotence": True, "acks": "all"}) as p:
        for _ in range(3):  # offsets 0..2, before the transaction
            p.send("txn-open", b"plain", partition=0)
    tx = RdProducer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "transactional.id": "describe-me"}
    )
    tx.init_transactions(30)
    tx.begin_transaction()
    tx.produce("txn-open", b"in-txn", partition=0)
    assert tx.flush(30) == 0
    tp = KpTopicPartition("txn-open", 0)
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap.split(","))
    try:
        [open_txn] = [
            p
            for p in admin.describe_producers([tp])[tp].active_producers
            if p.current_transaction_start_offset != -1
        ]
        assert open_txn.current_transaction_start_offset == 3
        tx.commit_transaction(30)

        def ended():
            # The coordinator writes the marker after answering EndTxn (as Kafka's).
            [mine] = [
                p
                for p in admin.describe_producers([tp])[tp].active_producers
                if p.producer_id == open_txn.producer_id
            ]
            return mine if mine.current_transaction_start_offset == -1 else None

        done = wait_until(ended, 30, "the commit marker on the partition")
        assert done.coordinator_epoch >= 0
    finally:
        admin.close()
