"""Replication quotas end to end: one follower throttled to 100 KB/s (a dynamic broker
config, set with `minibroker configs alter`) under a 1 MB/s load falls behind, leaves the
ISR by replica.lag.time.max.ms, and acks=all with min.insync.replicas=3 is then refused
with NOT_ENOUGH_REPLICAS, as in production; with the throttle deleted live (no restart) it
catches up and returns to the ISR."""

from __future__ import annotations

import time

import pytest

from minibroker.client import NewTopic, SyncAdmin, SyncProducer
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol.errors import NotEnoughReplicas
from tests.integration.cluster_helpers import cli

pytestmark = pytest.mark.integration

LAG_MS = 3000
RATE = "follower.replication.throttled.rate"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    config = {**DEFAULT_CONFIG, "replica.lag.time.max.ms": LAG_MS}
    cluster = start_cluster(tmp_path_factory.mktemp("replication-quotas"), 3, config)
    yield cluster
    cluster.close()


def throttled_topic(cluster) -> tuple[str, int, int]:
    """A topic whose partition 0 is led by broker 0 (a manual assignment: the first live
    replica leads) and has broker 2 named in follower.replication.throttled.replicas."""
    name, leader, throttled = "rq", 0, 2
    with SyncAdmin(cluster.bootstrap) as admin:
        configs = {
            "min.insync.replicas": "3",
            "follower.replication.throttled.replicas": f"0:{throttled}",
        }
        admin.create_topics([NewTopic(name, configs=configs, replica_assignments=[[0, 1, 2]])])
    assert cluster.wait_for_leader(name) == leader
    return name, leader, throttled


def broker_configs(cluster, broker: int, *change: str) -> str:
    """`minibroker configs alter` (``change`` given) or `describe` on one broker: stdout."""
    action = ("alter", *change) if change else ("describe",)
    done = cli(
        "configs",
        *action,
        "--entity-type",
        "brokers",
        "--entity-name",
        str(broker),
        "--bootstrap",
        cluster.bootstrap,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_throttled_follower_leaves_the_isr_and_acks_all_is_refused(cluster):
    topic, leader, throttled = throttled_topic(cluster)
    assert cluster.wait_for_isr(topic) == [0, 1, 2]
    broker_configs(cluster, throttled, "--add-config", f"{RATE}=100000")
    assert f"{RATE}=100000 (DYNAMIC_BROKER_CONFIG)" in broker_configs(cluster, throttled)
    value = b"x" * 1000
    with SyncProducer(cluster.bootstrap, {"acks": 1, "linger.ms": 5}) as producer:
        start = time.monotonic()
        sent = 0
        # 1 MB/s, paced, until the throttled follower has been out of step for longer
        # than replica.lag.time.max.ms (it fetches 100 KB/s of it).
        while time.monotonic() < start + 3 * LAG_MS / 1000:
            producer.enqueue(topic, value)
            sent += len(value)
            ahead = sent / 1_000_000 - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
        producer.flush()
    isr = cluster.wait_for_isr(topic, 0, sorted({0, 1, 2} - {throttled}), timeout=30)
    assert throttled not in isr and leader in isr
    with (
        SyncProducer(cluster.bootstrap, {"acks": "all", "retries": 0}) as producer,
        pytest.raises(NotEnoughReplicas),
    ):
        producer.send(topic, b"refused")
    # It was the quota: the throttled follower waited, the other one never did.
    with SyncAdmin(cluster.bootstrap) as admin:
        waited = {
            b: admin.broker_stats(b)["stats"]["quotas"]["replication"]["follower"]["throttled_ms"]
            for b in (0, 1, 2)
            if b != leader
        }
    assert waited[throttled] > 0
    assert all(ms == 0 for b, ms in waited.items() if b != throttled)

    # Lifting the throttle live: the same broker process (its uptime only grows) takes the
    # deletion at its next fetch. It is ~9 MB behind, 90 s at 100 KB/s: back in the ISR
    # within 20 s only because the throttle is gone.
    with SyncAdmin(cluster.address(throttled)) as admin:
        up_ms = admin.broker_stats(throttled)["stats"]["uptime_ms"]
    broker_configs(cluster, throttled, "--delete-config", RATE)
    assert RATE not in broker_configs(cluster, throttled)
    assert cluster.wait_for_isr(topic, 0, [0, 1, 2], timeout=20) == [0, 1, 2]
    with SyncAdmin(cluster.address(throttled)) as admin:
        assert admin.broker_stats(throttled)["stats"]["uptime_ms"] > up_ms
