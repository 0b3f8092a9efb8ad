"""A streaming query rides through the loss of any broker (issue 17 item 6): with the
controller on the quorum, the partition gets a new leader and the source's fetches follow it."""

from __future__ import annotations

import pytest
import trio

from minibroker.client import NewTopic, SyncAdmin, SyncProducer
from minibroker.deploy.cluster import ClusterState
from minibroker.deploy.cluster_ops import acks_all_write
from minibroker.deploy.launcher import free_port_range

from .streaming_wait import wait_until_collected

pytestmark = pytest.mark.spark

FAST = {
    "broker.session.timeout.ms": "1500",
    "broker.heartbeat.interval.ms": "200",
    "replica.fetch.backoff.ms": "50",
    "min.insync.replicas": "2",
}


@pytest.fixture
def cluster(tmp_path):
    state = ClusterState(tmp_path / "cluster", free_port_range(3), 3, dict(FAST))
    state.start_all()
    try:
        trio.run(acks_all_write, state.bootstrap, 3)  # every broker registered and serving
        yield state
    finally:
        state.stop_all()


def _produce(bootstrap: str, values: list[bytes]) -> None:
    settings = {"delivery.timeout.ms": 60000, "request.timeout.ms": 3000, "retry.backoff.ms": 50}
    with SyncProducer(bootstrap, acks="all", **settings) as producer:
        handles = producer.send_many("ride", [{"value": v, "partition": 0} for v in values])
        producer.flush()
        for handle in handles:
            handle.result(60)


def test_a_streaming_query_rides_through_its_leader_being_killed(spark, cluster, tmp_path):
    bootstrap = cluster.bootstrap
    with SyncAdmin(bootstrap) as admin:
        admin.create_topics([NewTopic("ride", 1, 3)])
    _produce(bootstrap, [f"a{i}".encode() for i in range(20)])
    seen: list[bytes] = []

    def collect(df, batch_id: int) -> None:
        seen.extend(r.value for r in df.orderBy("offset").select("value").collect())

    query = (
        spark.readStream.format("minibroker")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", "ride")
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until_collected(query, seen, 20, timeout_s=120)
        with SyncAdmin(bootstrap) as admin:
            leader = admin.describe_topics(["ride"])["ride"].partitions[0].leader
        cluster.kill(leader)  # whoever it is, the active controller included
        survivors = ",".join(f"127.0.0.1:{cluster.port(b)}" for b in range(3) if b != leader)
        _produce(survivors, [f"b{i}".encode() for i in range(20)])
        wait_until_collected(query, seen, 40, timeout_s=120)
        assert query.exception() is None, query.exception()
        assert seen == [f"a{i}".encode() for i in range(20)] + [f"b{i}".encode() for i in range(20)]
    finally:
        query.stop()
