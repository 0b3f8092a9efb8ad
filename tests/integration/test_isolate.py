"""The isolate fault on real brokers: a network partition between brokers, both ways,
controller and replication traffic alike, while clients still reach every broker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minibroker.client import Admin, Consumer, NewTopic, Producer, SyncProducer
from minibroker.deploy.testing import LocalCluster
from tests.waiting import wait_until

from .cluster_helpers import broker_stats, partition_view, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FAST = {
    "faults.enable": True,
    "replica.lag.time.max.ms": 1000,
    "broker.session.timeout.ms": 2000,
    "broker.heartbeat.interval.ms": 200,
    "replica.fetch.backoff.ms": 50,
}
ACKS_ALL = {"request.timeout.ms": 3000, "delivery.timeout.ms": 20000, "retry.backoff.ms": 50}


def faults_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "minibroker.deploy.cli", "faults", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )


def view(cluster: LocalCluster, broker: int, topic: str) -> dict:
    return next(p for p in cluster.stats(broker)["partitions"] if p["topic"] == topic)


@pytest.mark.minibroker(brokers=3, config=FAST)
def test_an_isolated_follower_leaves_the_isr_writes_go_on_and_it_rejoins(minibroker_cluster):
    cluster = minibroker_cluster
    cluster.create_topic("iso", config={"min.insync.replicas": 2})
    leader, controller = cluster.leader("iso"), cluster.controller
    follower = next(b for b in range(3) if b not in (leader, controller))
    rest = sorted({0, 1, 2} - {follower})
    with SyncProducer(cluster.bootstrap, acks="all", **ACKS_ALL) as producer:
        for i in range(5):
            producer.send("iso", f"before{i}".encode())
        epoch_at_cut = cluster.stats(follower)["metadata_epoch"]
        cluster.isolate(follower)
        cluster.wait_for_isr("iso", isr=rest, timeout=20)
        # min.insync.replicas=2 of 3: acks=all writes go on without the isolated follower.
        during = [producer.send("iso", f"during{i}".encode()).offset for i in range(20)]
        assert during == list(range(5, 25))
        # Nothing crossed the cut: no records reached the follower, and no metadata
        # either (the controller has changed the ISR since; the follower never heard).
        assert view(cluster, follower, "iso")["log_end_offset"] == 5
        assert cluster.stats(follower)["metadata_epoch"] == epoch_at_cut
        assert cluster.stats(controller)["metadata_epoch"] > epoch_at_cut
        cluster.clear_faults(follower)  # both sides of the cut
        cluster.wait_for_isr("iso", timeout=20)
        producer.send("iso", b"after")
    wait_until(
        lambda: view(cluster, follower, "iso")["log_end_offset"] == 26,
        20,
        "the follower to copy everything",
    )


async def test_an_isolated_controller_loses_the_role_and_the_majority_goes_on(cluster_factory):
    """The active controller, cut off from both others, cannot commit anything: the two
    others elect a new controller from the quorum within its timeouts, which fences the
    isolated broker, moves its leaderships and shrinks ISRs, so acks=all writes go on
    (min.insync 2 of 3). After ``faults clear`` everything heals and no acknowledged record
    is lost."""
    state = await cluster_factory(3, FAST)
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic("ctl", 3, 3, {"min.insync.replicas": "2"})])
        old = (await admin.describe_cluster())[1]
    acked = {}
    async with Producer(state.bootstrap, acks="all", **ACKS_ALL) as producer:
        for i in range(30):
            meta = await producer.send("ctl", f"v{i}".encode(), partition=i % 3)
            acked[(meta.partition, meta.offset)] = f"v{i}".encode()

    # Refused with one line each: nonsense ids.
    for args, why in [(["--from", str(old)], "from itself"), (["--from", "7"], "unknown broker")]:
        refused = faults_cli("isolate", "--bootstrap", state.bootstrap, "--broker", str(old), *args)
        assert refused.returncode == 1 and why in refused.stderr, refused.stderr
    cut = faults_cli("isolate", "--bootstrap", state.bootstrap, "--broker", str(old))
    assert cut.returncode == 0, cut.stderr
    assert f"broker {old}: 1 active fault(s)" in cut.stdout
    majority = [b for b in range(3) if b != old]
    across = ",".join(f"{state.host}:{state.port(b)}" for b in majority)

    async def moved_away():
        async with Admin(across) as admin:
            _, controller = await admin.describe_cluster()
            parts = (await admin.describe_topics(["ctl"]))["ctl"].partitions
        return controller in majority and all(
            p.leader in majority and old not in p.isr for p in parts
        )

    await wait_for(moved_away, 20, "a new controller to fence the isolated one")
    assert (await broker_stats(state, old))["quorum"]["active"] is False
    async with Producer(across, acks="all", **ACKS_ALL) as producer:
        for p in range(3):
            meta = await producer.send("ctl", f"during{p}".encode(), partition=p)
            acked[(meta.partition, meta.offset)] = f"during{p}".encode()

    healed = faults_cli("clear", "--bootstrap", state.bootstrap)
    assert healed.returncode == 0, healed.stderr
    assert healed.stdout.count("0 active fault(s)") == 3

    async def all_isrs_full():
        async with Admin(state.bootstrap) as admin:
            parts = (await admin.describe_topics(["ctl"]))["ctl"].partitions
        return all(sorted(p.isr) == [0, 1, 2] for p in parts)

    await wait_for(all_isrs_full, 30, "every ISR to be full again after faults clear")
    async with Producer(state.bootstrap, acks="all", **ACKS_ALL) as producer:
        for p in range(3):
            meta = await producer.send("ctl", f"after{p}".encode(), partition=p)
            acked[(meta.partition, meta.offset)] = f"after{p}".encode()

    async def replicas_agree():
        for p in range(3):
            views = [await partition_view(state, b, "ctl", p) for b in range(3)]
            if len({(v["high_watermark"], v["log_end_offset"]) for v in views}) != 1:
                return False
        return True

    await wait_for(replicas_agree, 30, "every replica to agree")
    async with Consumer(state.bootstrap) as consumer:
        consumer.assign([("ctl", p) for p in range(3)])
        consumer.seek_to_beginning()
        ends = await consumer.end_offsets([("ctl", p) for p in range(3)])
        final = {}
        while len(final) < sum(ends.values()):
            records = await consumer.poll(timeout_ms=3000)
            assert records, f"only {len(final)} of {sum(ends.values())} records readable"
            final.update({(r.partition, r.offset): r.value for r in records})
    assert all(final.get(key) == value for key, value in acked.items())
