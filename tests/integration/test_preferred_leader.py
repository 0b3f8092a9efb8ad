"""Preferred-leader election on real broker processes: a restarted broker leads its
preferred partitions again within the imbalance check interval; ElectLeaders (Admin, a
forwarding broker, the CLI) moves leadership at once with auto rebalance off, and
answers with Kafka's error codes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import trio

from minibroker.client import Admin, NewTopic
from minibroker.deploy.cluster import ClusterState
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import (
    ElectionNotNeeded,
    PreferredLeaderNotAvailable,
    UnknownTopicOrPartition,
)
from tests.integration.cluster_helpers import wait_for

TOPIC = "pref"
PARTITIONS = 6


async def partitions(state: ClusterState) -> list:
    async with Admin(state.bootstrap) as admin:
        return (await admin.describe_topics([TOPIC]))[TOPIC].partitions


async def setup(state: ClusterState) -> tuple[int, list[int]]:
    """Create the topic; a broker that is not the active controller, and the partitions it
    is the preferred replica of (placement gives each of 3 brokers two of six)."""
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)])
        _, controller = await admin.describe_cluster()
    broker = next(b for b in range(state.brokers) if b != controller)
    mine = [p.partition for p in await partitions(state) if p.replicas[0] == broker]
    assert mine, "placement gives every broker preferred partitions"
    return broker, mine


def restart_and_wait_in_sync(state: ClusterState, broker: int, mine: list[int]) -> float:
    """Restart ``broker`` (a clean stop: its leaderships move at once); the monotonic time at
    which it is back in the ISR of all its preferred partitions."""
    state.restart(broker)

    async def in_sync() -> float | None:
        ps = await partitions(state)
        return time.monotonic() if all(broker in ps[i].isr for i in mine) else None

    return trio.run(wait_for, in_sync, 60, f"broker {broker} back in the ISRs")


async def test_a_restarted_broker_leads_its_preferred_partitions_again_within_the_interval(
    cluster_factory,
):
    interval = 3
    state = await cluster_factory(3, {"leader.imbalance.check.interval.seconds": interval})
    broker, mine = await setup(state)
    before = {i: (await partitions(state))[i].leader_epoch for i in mine}

    t0 = time.monotonic()
    in_sync_at = await trio.to_thread.run_sync(restart_and_wait_in_sync, state, broker, mine)

    async def leads_again() -> float | None:
        ps = await partitions(state)
        return time.monotonic() if all(ps[i].leader == broker for i in mine) else None

    back_at = await wait_for(leads_again, 60, f"broker {broker} leading {mine} again")
    ps = await partitions(state)
    for i in mine:
        # Away at the stop, back at the rebalance: each move a new leader epoch.
        assert ps[i].leader_epoch >= before[i] + 2
    # The target: once it can lead (in the ISR), its leaderships are back within one check
    # interval (plus the moment brokers take to apply the change, generous under load).
    print(
        f"restart -> in ISR {in_sync_at - t0:.2f} s, -> leading again {back_at - t0:.2f} s "
        f"(check interval {interval} s)"
    )
    assert back_at - in_sync_at <= interval + 2


async def test_elect_leaders_moves_leadership_at_once_and_names_why_not(cluster_factory):
    state = await cluster_factory(
        3,
        {"auto.leader.rebalance.enable": False, "leader.imbalance.check.interval.seconds": 1},
    )
    broker, mine = await setup(state)
    await trio.to_thread.run_sync(restart_and_wait_in_sync, state, broker, mine)
    ps = await partitions(state)
    assert not any(ps[i].leader == broker for i in mine)

    async with Admin(state.bootstrap) as admin:
        # Ask a broker that is not the active controller: it forwards to the controller.
        cluster = admin._cluster
        body = await cluster.request(
            broker,
            ApiKey.ELECT_LEADERS,
            {
                "election_type": 0,
                "topic_partitions": [{"topic": TOPIC, "partitions": [mine[0]]}],
                "timeout_ms": 30000,
            },
        )
        assert body["replica_election_results"] == [
            {
                "topic": TOPIC,
                "partition_result": [
                    {"partition_id": mine[0], "error_code": 0, "error_message": None}
                ],
            }
        ]
        outcome = await admin.elect_leaders(
            "preferred", [(TOPIC, i) for i in mine] + [(TOPIC, 99), ("missing", 0)]
        )
    assert isinstance(outcome.pop((TOPIC, mine[0])), ElectionNotNeeded)
    assert isinstance(outcome.pop((TOPIC, 99)), UnknownTopicOrPartition)
    assert isinstance(outcome.pop(("missing", 0)), UnknownTopicOrPartition)
    assert outcome == {(TOPIC, i): None for i in mine[1:]}

    async def leads() -> bool:
        ps = await partitions(state)
        return all(ps[i].leader == broker for i in mine)

    await wait_for(leads, 10, f"broker {broker} leading {mine} after the election")

    # The preferred broker down: its partitions cannot go back to it.
    await trio.to_thread.run_sync(state.stop, broker)
    async with Admin(state.bootstrap) as admin:
        outcome = await admin.elect_leaders("preferred", [(TOPIC, mine[0])])
    assert isinstance(outcome[(TOPIC, mine[0])], PreferredLeaderNotAvailable)
    assert "fenced" in str(outcome[(TOPIC, mine[0])])


def cli(state: ClusterState, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MINIBROKER_BOOTSTRAP": state.bootstrap}
    return subprocess.run(
        [sys.executable, "-m", "minibroker.deploy.cli", "leaders", "elect", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


async def test_the_leaders_elect_command(cluster_factory):
    state = await cluster_factory(3, {"auto.leader.rebalance.enable": False})
    broker, mine = await setup(state)
    run = await trio.to_thread.run_sync(cli, state, "--election-type", "preferred")
    assert run.returncode == 0, run.stderr
    assert "No partition needed a preferred leader election" in run.stdout

    await trio.to_thread.run_sync(restart_and_wait_in_sync, state, broker, mine)
    run = await trio.to_thread.run_sync(cli, state, "--topic", TOPIC, "--partition", str(mine[0]))
    assert run.returncode == 0, run.stderr
    assert (
        f"Successfully completed leader election (PREFERRED) for partitions {TOPIC}-{mine[0]}"
        in (run.stdout)
    )
    run = await trio.to_thread.run_sync(cli, state, "--topic", TOPIC)
    assert run.returncode == 0, run.stderr
    [already] = [
        line for line in run.stdout.splitlines() if line.startswith("Valid replica already elected")
    ]
    assert f"{TOPIC}-{mine[0]}" in already.removeprefix("Valid replica already elected for ")

    run = await trio.to_thread.run_sync(cli, state, "--topic", TOPIC, "--partition", "99")
    assert run.returncode == 1
    assert f"{TOPIC}-99: UNKNOWN_TOPIC_OR_PARTITION" in run.stderr
    assert "Traceback" not in run.stderr
    run = await trio.to_thread.run_sync(cli, state, "--partition", "0")
    assert run.returncode == 1 and run.stderr.strip() == "error: --partition needs --topic"
