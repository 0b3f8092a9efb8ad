"""The shipped pytest plugin (deploy.testing), used exactly as a user would: its fixtures
come from the package's pytest11 entry point, not from a conftest of ours."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

from minibroker.client import Consumer, SyncConsumer, SyncProducer, errors

ROOT = Path(__file__).resolve().parents[2]
ACKS_ALL_FAST = {
    "acks": "all",
    "request.timeout.ms": 500,
    "delivery.timeout.ms": 1000,
    "retries": 0,
    "linger.ms": 0,
}


def test_the_entry_point_provides_the_fixtures(pytestconfig):
    plugin = pytestconfig.pluginmanager.get_plugin("minibroker")
    assert plugin is not None and plugin.__name__ == "minibroker.deploy.testing"


def test_the_readme_example_passes_in_a_project_of_its_own(tmp_path):
    """The README's plugin example, run as written by a separate pytest with no conftest."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### In your own tests") :]
    example = section[section.index("```python\n") + 10 : section.index("```\n", 10)]
    (tmp_path / "test_example.py").write_text(example)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr


@pytest.mark.minibroker(brokers=3)
def test_kill_fails_over_and_restart_rejoins(minibroker_cluster):
    cluster = minibroker_cluster
    cluster.create_topic("t", partitions=3)
    # Leaders are spread; kill one that is not the controller (it has no failover).
    p = next(p for p in range(3) if cluster.leader("t", p) != cluster.controller)
    old = cluster.leader("t", p)
    with SyncProducer(cluster.bootstrap, acks="all") as producer:
        first = producer.send("t", b"before", partition=p).offset
        cluster.kill(old)
        assert cluster.status(old) == "dead"
        new = cluster.wait_for_leader("t", p, not_on=[old])
        assert new != old
        producer.send("t", b"after", partition=p)
    cluster.restart(old)
    assert cluster.wait_for_isr("t", p) == [0, 1, 2]
    with SyncConsumer(cluster.bootstrap) as consumer:
        consumer.assign([("t", p)])
        consumer.seek(("t", p), first)
        values = []
        while len(values) < 2:
            values += [r.value for r in consumer.poll(timeout_ms=5000)]
    assert values == [b"before", b"after"]


@pytest.mark.minibroker(brokers=1)
def test_fail_api_answers_with_the_error_then_clears(minibroker_cluster):
    cluster = minibroker_cluster
    cluster.create_topic("f")
    active = cluster.fail_api(0, "produce", "NOT_LEADER_OR_FOLLOWER", count=-1)
    assert active and active[0]["error_code"] == errors.ErrorCode.NOT_LEADER_OR_FOLLOWER
    with SyncProducer(cluster.bootstrap, **ACKS_ALL_FAST) as producer:
        with pytest.raises(errors.KafkaError):
            producer.send("f", b"refused")
        cluster.clear_faults(0)
        assert producer.send("f", b"served").offset == 0


@pytest.mark.minibroker(brokers=2)
def test_delay_replication_holds_acks_all_past_its_timeout(minibroker_cluster):
    cluster = minibroker_cluster
    cluster.create_topic("d", replication_factor=2)
    follower = 1 - cluster.leader("d")
    cluster.delay_replication(follower, 2000, topic="d")
    with (
        SyncProducer(cluster.bootstrap, **ACKS_ALL_FAST) as producer,
        pytest.raises(errors.RequestTimedOut),
    ):
        producer.send("d", b"late")
    cluster.clear_faults(follower)
    with SyncProducer(cluster.bootstrap, acks="all", **{"request.timeout.ms": 5000}) as producer:
        assert producer.send("d", b"on time").offset >= 1


async def test_the_factory_works_inside_a_trio_test(minibroker_cluster_factory):
    cluster = minibroker_cluster_factory(brokers=1)
    cluster.create_topic("a")
    assert cluster.partition("a").leader == 0
    async with Consumer(cluster.bootstrap) as consumer:
        consumer.assign([("a", 0)])
        with trio.fail_after(10):
            assert await consumer.poll(timeout_ms=100) == []
    assert cluster.stats(0)["partitions"]


def test_reset_puts_a_shared_cluster_back(minibroker_shared_cluster):
    """Everything a test may leave behind, undone by reset(): the next test starts clean."""
    cluster = minibroker_shared_cluster
    cluster.create_topic("shared-t", partitions=2)
    with SyncProducer(cluster.bootstrap, acks="all") as producer:
        producer.send("shared-t", b"x", partition=0)
    killed = next(b for b in range(3) if b != cluster.controller)
    paused = next(b for b in range(3) if b not in (killed, cluster.controller))
    isolated = cluster.controller
    cluster.isolate(isolated, from_=[paused])
    cluster.delay_api(isolated, "produce", 60000)
    cluster.kill(killed)
    cluster.pause(paused)

    cluster.reset()

    assert [cluster.status(b) for b in range(3)] == ["alive"] * 3
    assert cluster.bootstrap.count(",") == 2  # nobody is impaired any more
    assert cluster.isr("__minibroker_health") == [0, 1, 2]
    assert not list(cluster.data_dir.glob("broker-*/shared-t-*"))
    # No produce delay left: it would outlast the 20 s delivery timeout.
    within_20s = {"request.timeout.ms": 19000, "delivery.timeout.ms": 20000, "retries": 0}
    with SyncProducer(cluster.bootstrap, acks="all", **within_20s) as producer:
        cluster.create_topic("shared-t", partitions=1)
        assert producer.send("shared-t", b"again").offset == 0


def test_a_shared_cluster_is_shared_and_clean(
    minibroker_shared_cluster, minibroker_session_cluster
):
    """The session's one cluster, with none of the test before's topics."""
    cluster = minibroker_shared_cluster
    assert cluster is minibroker_session_cluster
    assert [cluster.status(b) for b in range(3)] == ["alive"] * 3
    cluster.create_topic("shared-t")  # TopicAlreadyExists if a test's topic were left
    assert cluster.isr("shared-t") == sorted(cluster.partition("shared-t").replicas)
