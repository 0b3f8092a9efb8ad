"""Static membership (KIP-345, ``group.instance.id``) against real broker processes.

A static member that restarts within session.timeout.ms gets its partitions back and the
group does not rebalance: the other member's rebalance callbacks do not run again, its
assignment and generation stay. Checked with a stock client (confluent-kafka: librdkafka
sends JoinGroup v5 with the instance id and no LeaveGroup on close) and with our bundled
consumer; a second process with the same instance id fences the first (FENCED_INSTANCE_ID).

No sleeping on hope: a rebalance would revoke the other member before the restarted one
could be assigned (a join completes only when every member has rejoined), so once the
restarted member holds its partitions, a rebalance would already show.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
import trio
from confluent_kafka import Consumer as RdConsumer

from minibroker.client import Consumer
from minibroker.deploy.testing import start_cluster
from minibroker.protocol.errors import FencedInstanceId
from tests.integration.test_consumer_groups import setup_topic, wait_for
from tests.integration.test_kafka_groups import (
    BOUND_S,
    GROUP_CONFIG,
    HEARTBEAT_MS,
    Poller,
    Rd,
    create_and_fill,
    describe,
    until,
)

pytestmark = pytest.mark.integration

# Long enough that a restart (a new librdkafka instance, a new bootstrap) fits in it with
# room under load; the test checks that it did.
SESSION_MS = 15_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("static-members"), 3, GROUP_CONFIG)
    yield cluster
    cluster.close()


class RdMember(Rd):
    """A confluent-kafka group consumer that records its rebalance callbacks (polling,
    assignment and close as the groups tests' adapter)."""

    def __init__(self, cluster, group: str, topic: str, instance: str | None = None) -> None:
        config = {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": group,
            "client.id": f"rd-{instance or 'dynamic'}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
        }
        if instance is not None:
            config["group.instance.id"] = instance
        self.c = RdConsumer(config)
        self.assigns: list[set[int]] = []
        self.revokes = 0
        self.c.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, consumer, partitions) -> None:
        self.assigns.append({tp.partition for tp in partitions})

    def _on_revoke(self, consumer, partitions) -> None:
        self.revokes += 1


class Listener:
    """kafka-python's and aiokafka's rebalance listener (the same two methods)."""

    def __init__(self, member) -> None:
        self.member = member

    def on_partitions_revoked(self, revoked) -> None:
        self.member.revokes += 1

    def on_partitions_assigned(self, assigned) -> None:
        self.member.assigns.append({tp.partition for tp in assigned})


PY_SETTINGS = {
    "auto_offset_reset": "earliest",
    "enable_auto_commit": False,
    "session_timeout_ms": SESSION_MS,
    "heartbeat_interval_ms": HEARTBEAT_MS,
}


class KpMember:
    """kafka-python 3 (static members from its group_instance_id)."""

    def __init__(self, cluster, group: str, topic: str, instance: str) -> None:
        from kafka import ConsumerRebalanceListener, KafkaConsumer

        self.assigns: list[set[int]] = []
        self.revokes = 0
        self.c = KafkaConsumer(
            bootstrap_servers=cluster.kafka_bootstrap.split(","),
            group_id=group,
            group_instance_id=instance,
            client_id=f"kp-{instance}",
            **PY_SETTINGS,
        )
        listener = type("L", (Listener, ConsumerRebalanceListener), {})(self)
        self.c.subscribe([topic], listener=listener)

    def poll(self) -> list[tuple[int, int]]:
        batches = self.c.poll(timeout_ms=200)
        return [(m.partition, m.offset) for records in batches.values() for m in records]

    def assigned(self) -> set[int]:
        return {tp.partition for tp in self.c.assignment()}

    def close(self) -> None:
        self.c.close()


class AioMember:
    """aiokafka (JoinGroup v5 and SyncGroup v3 when group_instance_id is set)."""

    def __init__(self, cluster, group: str, topic: str, instance: str) -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.abc import ConsumerRebalanceListener

        self.assigns: list[set[int]] = []
        self.revokes = 0
        self.loop = asyncio.new_event_loop()
        listener = type("L", (Listener, ConsumerRebalanceListener), {})(self)

        async def start() -> AIOKafkaConsumer:
            c = AIOKafkaConsumer(
                bootstrap_servers=cluster.kafka_bootstrap.split(","),
                group_id=group,
                group_instance_id=instance,
                client_id=f"aio-{instance}",
                **PY_SETTINGS,
            )
            await c.start()
            c.subscribe([topic], listener=listener)
            return c

        self.c = self.loop.run_until_complete(start())

    def poll(self) -> list[tuple[int, int]]:
        batches = self.loop.run_until_complete(self.c.getmany(timeout_ms=200))
        return [(m.partition, m.offset) for records in batches.values() for m in records]

    def assigned(self) -> set[int]:
        return {tp.partition for tp in self.c.assignment()}

    def close(self) -> None:
        self.loop.run_until_complete(self.c.stop())
        self.loop.close()


@pytest.mark.parametrize(
    "client", [RdMember, KpMember, AioMember], ids=["confluent", "kafka-python", "aiokafka"]
)
def test_a_restarted_stock_static_member_gets_its_partitions_back_without_a_rebalance(
    cluster, client
):
    """The other member is a dynamic confluent-kafka consumer, the observer throughout."""
    topic, group = f"static-{client.__name__}", f"g-static-{client.__name__}"
    create_and_fill(cluster.kafka_bootstrap, topic, 4, 0)
    static = Poller(client(cluster, group, topic, "instance-a"))
    other = Poller(RdMember(cluster, group, topic))
    restarted = None
    try:
        until(
            lambda: len(static.assigned) == 2 and len(other.assigned) == 2,
            "both members to hold two partitions each",
        )
        mine, theirs = set(static.assigned), set(other.assigned)
        assert mine.isdisjoint(theirs)
        rows = {int(r[1]): r for r in describe(cluster, group)}
        old_member = rows[min(mine)][5]
        assert old_member.startswith("instance-a-")  # Kafka's static member id
        assert rows[min(mine)][8] == "instance-a"  # GROUP-INSTANCE-ID
        other_assigns, other_revokes = len(other.member.assigns), other.member.revokes

        started = time.monotonic()
        static.close()  # a static member's close sends no LeaveGroup: no rebalance yet
        restarted = Poller(client(cluster, group, topic, "instance-a"))
        until(lambda: restarted.assigned == mine, "the restarted member's old partitions")
        assert time.monotonic() - started < SESSION_MS / 1000, "the restart outlasted the session"

        # The other member saw nothing: no revoke, no new assignment, the same partitions.
        assert other.member.revokes == other_revokes
        assert len(other.member.assigns) == other_assigns
        assert other.assigned == theirs
        assert restarted.member.assigns == [mine]  # one assignment: the old one, at once
        rows = {int(r[1]): r for r in describe(cluster, group)}
        new_member = rows[min(mine)][5]
        assert new_member != old_member and new_member.startswith("instance-a-")
        assert {p for p, r in rows.items() if r[5] == new_member} == mine
    finally:
        for member in (restarted, other):
            if member is not None:
                member.close()


FAST = {
    "session.timeout.ms": 10_000,
    "heartbeat.interval.ms": 200,
    "auto.offset.reset": "earliest",
    "retry.backoff.ms": 50,
    "enable.auto.commit": False,
}


async def test_our_static_consumer_restarts_without_a_rebalance_and_fences_a_duplicate(cluster):
    bootstrap = cluster.bootstrap
    await setup_topic(bootstrap, "static-native", 4, 0)

    async def poll_until(consumer: Consumer, check) -> None:
        async def step() -> bool:
            await consumer.poll(timeout_ms=100)
            return check()

        await wait_for(step, BOUND_S, "a consumer's assignment")

    def member(instance: str | None = None, name: str = "static") -> Consumer:
        return Consumer(
            bootstrap, group_id="gs", group_instance_id=instance, **FAST, **{"client.id": name}
        )

    async with member(name="other") as other, trio.open_nursery() as nursery:
        other.subscribe(["static-native"])
        stop_other = trio.Event()

        async def keep_polling() -> None:
            while not stop_other.is_set():
                await other.poll(timeout_ms=100)

        nursery.start_soon(keep_polling)
        async with member("inst-1") as static:
            static.subscribe(["static-native"])
            await poll_until(
                static, lambda: len(static.assignment()) == 2 and len(other.assignment()) == 2
            )
            mine = set(static.assignment())
            theirs = set(other.assignment())
            generation = other._group.generation
            old_id = static._group.member_id
            assert old_id.startswith("inst-1-")
        # Closed: a static member sends no LeaveGroup. Now the restart:
        async with member("inst-1") as restarted:
            restarted.subscribe(["static-native"])
            await poll_until(restarted, lambda: restarted.assignment() == mine)
            assert restarted._group.member_id not in ("", old_id)
            assert restarted._group.generation == generation  # the generation it left in
            assert other._group.generation == generation and not other._group.rejoin_needed
            assert other.assignment() == theirs

            # A second process with the same instance id takes it over; the first is fenced.
            async with member("inst-1", "duplicate") as duplicate:
                duplicate.subscribe(["static-native"])
                await poll_until(duplicate, lambda: duplicate.assignment() == mine)
                with pytest.raises(FencedInstanceId), trio.fail_after(BOUND_S):
                    while True:  # its next heartbeat learns it was fenced; poll raises it
                        await restarted.poll(timeout_ms=100)
                assert other._group.generation == generation  # still no rebalance
                assert other.assignment() == theirs
        stop_other.set()


def test_the_cli_consumes_as_a_static_member(cluster):
    topic, group = "static-cli", "g-static-cli"
    create_and_fill(cluster.kafka_bootstrap, topic, 1, 10)

    def consume() -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "minibroker.deploy.cli", "consume", topic,
             "--group", group, "--group-instance-id", "cli-1", "--from-beginning",
             "--max-messages", "5", "--bootstrap", cluster.bootstrap],
            capture_output=True, text=True, timeout=BOUND_S,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert consume() == [f"0-{i}" for i in range(5)]
    # It exited without leaving (a static member): the group still holds its instance.
    rows = describe(cluster, group)
    assert [(r[0], r[1], r[2], r[8]) for r in rows] == [(topic, "0", "5", "cli-1")]
    first_member = rows[0][5]
    # Run again: it takes its member over and resumes from its commit.
    assert consume() == [f"0-{i}" for i in range(5, 10)]
    rows = describe(cluster, group)
    assert [(r[0], r[1], r[2], r[8]) for r in rows] == [(topic, "0", "10", "cli-1")]
    assert rows[0][5] != first_member and rows[0][5].startswith("cli-1-")
