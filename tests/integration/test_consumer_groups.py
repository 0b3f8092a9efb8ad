"""Consumer groups against real broker processes: partitions shared without overlap or
gap, a stopped member's partitions taken over from its last commit, max.poll.interval.ms,
coordinator failover with committed offsets intact, and `groups describe` lag.

Every wait is on the thing itself (a group's state, records seen), with a generous bound.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
import trio

from minibroker.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from minibroker.protocol import ADMIN_CLIENT_ID, GROUP_METADATA_TOPIC, ApiKey
from minibroker.protocol.errors import InvalidTopic

pytestmark = pytest.mark.integration

GROUP_CONFIG = {
    "group.min.session.timeout.ms": 500,
    "group.initial.rebalance.delay.ms": 0,
    "offsets.topic.num.partitions": 3,
    "replica.lag.time.max.ms": 2000,
}
FAST = {
    "session.timeout.ms": 2000,
    "heartbeat.interval.ms": 200,
    "auto.offset.reset": "earliest",
    "retry.backoff.ms": 50,
}


async def setup_topic(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    async with Admin(bootstrap) as admin:
        await admin.create_topics([NewTopic(topic, partitions, 3)])
    await produce(bootstrap, topic, partitions, per_partition)


async def produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    async with Producer(bootstrap) as producer:
        for p in range(partitions):
            for i in range(per_partition):
                await producer.enqueue(topic, f"{p}-{i}".encode(), partition=p)
        await producer.flush()


async def wait_for(check, timeout: float = 60, what: str = "condition"):
    with trio.fail_after(timeout):
        while True:
            result = await check()
            if result:
                return result
            await trio.sleep(0.1)


async def test_three_consumers_share_six_partitions_without_overlap_or_gap(
    minibroker_cluster_factory,
):
    cluster = minibroker_cluster_factory(3, GROUP_CONFIG)
    bootstrap = cluster.bootstrap
    await setup_topic(bootstrap, "t6", 6, 20)
    seen: list[tuple[int, int]] = []
    consumers: list[Consumer] = []
    stop = trio.Event()

    async def member(i: int) -> None:
        async with Consumer(bootstrap, group_id="g3", **FAST, **{"client.id": f"c{i}"}) as c:
            c.subscribe(["t6"])
            consumers.append(c)
            while not stop.is_set():
                seen.extend((r.partition, r.offset) for r in await c.poll(timeout_ms=200))

    async def settled() -> bool:
        async with Admin(bootstrap) as admin:
            desc = await admin.describe_consumer_group("g3")
        owned = [tp for m in desc.members for tp in m.assignment]
        return desc.state == "Stable" and len(desc.members) == 3 and len(owned) == 6

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(member, i)
        await wait_for(settled)
        await produce(bootstrap, "t6", 6, 20)  # more after the group settled
        await wait_for(lambda: _async(len(set(seen)) == 240))
        assignments = [c.assignment() for c in consumers]
        stop.set()
    everything = set().union(*assignments)
    assert everything == {TopicPartition("t6", p) for p in range(6)}  # no gap
    assert sum(len(a) for a in assignments) == 6  # no overlap
    assert all(len(a) == 2 for a in assignments)  # range: two each
    assert set(seen) == {(p, o) for p in range(6) for o in range(40)}


async def _async(value):
    return value


async def test_polls_of_several_consumers_from_one_task_get_through_rebalances(
    minibroker_cluster_factory,
):
    """Kafka's poll(timeout): a join the timeout cuts short goes on in the background and
    the next poll picks it up, so one task polling its consumers in turn is never stuck
    in one consumer's join while that join waits for the others to poll."""
    cluster = minibroker_cluster_factory(3, GROUP_CONFIG)
    bootstrap = cluster.bootstrap
    await setup_topic(bootstrap, "tq", 6, 10)
    seen: set[tuple[int, int]] = set()
    slowest = 0.0
    async with (
        Consumer(bootstrap, group_id="gq", **FAST) as a,
        Consumer(bootstrap, group_id="gq", **FAST) as b,
        Consumer(bootstrap, group_id="gq", **FAST) as c,
    ):
        consumers = (a, b, c)
        for consumer in consumers:
            consumer.subscribe(["tq"])

        def settled() -> bool:
            owned = [consumer.assignment() for consumer in consumers]
            return all(len(o) == 2 for o in owned) and len(set().union(*owned)) == 6

        # max.poll.interval.ms (the rebalance timeout) is Kafka's 300 s: a poll that waited
        # for its join to end would hold this loop for minutes, not for one timeout.
        with trio.fail_after(60):
            while not (settled() and len(seen) == 60):
                for consumer in consumers:
                    started = trio.current_time()
                    records = await consumer.poll(timeout_ms=200)
                    slowest = max(slowest, trio.current_time() - started)
                    seen.update((r.partition, r.offset) for r in records)
    assert seen == {(p, o) for p in range(6) for o in range(10)}
    assert slowest < 5.0  # the timeout, plus a revoke's commit and slack for a busy machine


class CliConsumer:
    """`minibroker consume --group` as its own process; lines read by a thread."""

    def __init__(self, bootstrap: str, group: str, topic: str, client_id: str) -> None:
        props = {**FAST, "auto.commit.interval.ms": 100, "client.id": client_id}
        cmd = [sys.executable, "-m", "minibroker.deploy.cli", "consume", topic, "--group", group]
        cmd += ["--print-offset", "--bootstrap", bootstrap]
        for k, v in props.items():
            cmd += ["--property", f"{k}={v}"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.records: list[tuple[int, int]] = []
        self.client_id = client_id
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            part, offset, _ = line.decode().split("\t", 2)
            self.records.append((int(part.split(":")[1]), int(offset.split(":")[1])))

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


async def test_a_stopped_member_s_partitions_move_on_from_its_last_commit(
    minibroker_cluster_factory,
):
    cluster = minibroker_cluster_factory(3, GROUP_CONFIG)
    bootstrap = cluster.bootstrap
    await setup_topic(bootstrap, "ts", 6, 10)
    members = [CliConsumer(bootstrap, "gs", "ts", f"c{i}") for i in range(3)]
    try:
        async with Admin(bootstrap) as admin:

            async def all_committed() -> bool:
                desc = await admin.describe_consumer_group("gs")
                offsets = await admin.list_consumer_group_offsets("gs")
                return (
                    desc.state == "Stable"
                    and len(desc.members) == 3
                    and len(offsets) == 6
                    and all(o == 10 for o in offsets.values())
                )

            await wait_for(all_committed)
            desc = await admin.describe_consumer_group("gs")
            victim = members[0]
            owned = next(m for m in desc.members if m.client_id == victim.client_id).assignment
            victim_partitions = {tp.partition for tp in owned}
            last_commit = await admin.list_consumer_group_offsets("gs")
            os.kill(victim.proc.pid, signal.SIGSTOP)
            marks = [len(m.records) for m in members]
            await produce(bootstrap, "ts", 6, 10)
            survivors = members[1:]

            async def taken_over() -> bool:
                later = [
                    r
                    for m, mark in zip(survivors, marks[1:], strict=True)
                    for r in m.records[mark:]
                ]
                return {(p, o) for p, o in later} >= {
                    (p, o) for p in range(6) for o in range(10, 20)
                }

            await wait_for(taken_over)
            desc = await admin.describe_consumer_group("gs")
        assert victim_partitions  # it owned something when it stopped
        assert len(desc.members) == 2 and victim.client_id not in {
            m.client_id for m in desc.members
        }
        later = [r for m, mark in zip(survivors, marks[1:], strict=True) for r in m.records[mark:]]
        for p in victim_partitions:
            offsets = sorted(o for q, o in later if q == p)
            # exactly from the victim's last commit on: nothing before it read again, no gap
            assert offsets == list(range(last_commit[TopicPartition("ts", p)], 20))
    finally:
        for m in members:
            m.close()


async def test_a_consumer_that_stops_polling_leaves_its_group(minibroker_cluster_factory):
    cluster = minibroker_cluster_factory(3, GROUP_CONFIG)
    bootstrap = cluster.bootstrap
    await setup_topic(bootstrap, "tp", 2, 1)
    async with (
        Consumer(bootstrap, group_id="gp", **FAST, **{"max.poll.interval.ms": 1500}) as slow,
        Consumer(bootstrap, group_id="gp", **FAST) as busy,
        Admin(bootstrap) as admin,
    ):
        slow.subscribe(["tp"])
        busy.subscribe(["tp"])
        # A join inside poll() waits for the whole group, as Kafka's does: poll both at once.
        slow_polls = trio.Event()  # set: slow stops polling

        async def keep_polling(c: Consumer, until: trio.Event | None) -> None:
            while until is None or not until.is_set():
                await c.poll(timeout_ms=100)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_polling, slow, slow_polls)
            nursery.start_soon(keep_polling, busy, None)
            await wait_for(
                lambda: _async(len(slow.assignment()) == 1 and len(busy.assignment()) == 1)
            )
            slow_polls.set()  # from now on slow never polls: its heartbeats must give it up
            await wait_for(lambda: _async(len(busy.assignment()) == 2))
            nursery.cancel_scope.cancel()
        desc = await admin.describe_consumer_group("gp")
        assert [e for e, _ in slow.group_events].count("poll_interval_exceeded") >= 1
        assert len(desc.members) == 1


async def test_a_member_waiting_in_poll_commits_and_stays(minibroker_cluster_factory):
    """Kafka's poll waits for records only until the group's own work is due (its
    timeToNextPoll): a member that has read everything and waits in a long poll for more
    commits its positions at the next auto-commit, and the wait counts as polling, so it
    outlasts max.poll.interval.ms without leaving the group."""
    cluster = minibroker_cluster_factory(3, GROUP_CONFIG)
    bootstrap = cluster.bootstrap
    await setup_topic(bootstrap, "tw", 2, 5)
    settings = {**FAST, "auto.commit.interval.ms": 1000, "max.poll.interval.ms": 1000}
    async with (
        Consumer(bootstrap, group_id="gw", **settings) as consumer,
        Admin(bootstrap) as admin,
    ):
        consumer.subscribe(["tw"])
        seen = 0
        with trio.fail_after(60):
            while seen < 10:
                seen += len(await consumer.poll(timeout_ms=100))
        long_poll_returned = trio.Event()

        async def long_poll() -> None:
            assert await consumer.poll(timeout_ms=600_000) == []  # nothing more is produced
            long_poll_returned.set()

        async def committed_all() -> bool:
            offsets = await admin.list_consumer_group_offsets("gw")
            return offsets == {TopicPartition("tw", 0): 5, TopicPartition("tw", 1): 5}

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_poll)
            await wait_for(committed_all)
            # The span under test, not a wait for an event: 2.5x max.poll.interval.ms more
            # inside that one poll, after which the member must still be in the group.
            await trio.sleep(2.5)
            desc = await admin.describe_consumer_group("gw")
            assert not long_poll_returned.is_set()
            nursery.cancel_scope.cancel()
    assert "poll_interval_exceeded" not in [e for e, _ in consumer.group_events]
    assert desc.state == "Stable" and len(desc.members) == 1


async def test_commits_and_joins_survive_the_coordinator_s_death(minibroker_cluster_factory):
    cluster = minibroker_cluster_factory(3, GROUP_CONFIG)
    bootstrap = cluster.bootstrap
    await setup_topic(bootstrap, "tf", 4, 5)
    async with Consumer(bootstrap, group_id="gf", **FAST) as consumer:
        consumer.subscribe(["tf"])
        await wait_for(lambda: _polled(consumer, 4))
        await consumer.commit({("tf", p): p + 1 for p in range(4)})
        body = await consumer._cluster.any_request(ApiKey.FIND_COORDINATOR, {"key": "gf"})
        coordinator = body["node_id"]
        cluster.kill(coordinator)
        # the next commit finds the new coordinator (a new leader of the group's partition)
        with trio.fail_after(60):
            await consumer.commit({("tf", 0): 5})
        committed = await consumer.committed([("tf", p) for p in range(4)])
        assert committed == {
            TopicPartition("tf", 0): 5,
            **{TopicPartition("tf", p): p + 1 for p in (1, 2, 3)},
        }
        body = await consumer._cluster.any_request(ApiKey.FIND_COORDINATOR, {"key": "gf"})
        assert body["node_id"] != coordinator
        # and the group keeps working: a second member joins, partitions are shared out
        async with Consumer(bootstrap, group_id="gf", **FAST) as second:
            second.subscribe(["tf"])

            async def keep_polling(c: Consumer) -> None:
                while True:
                    await c.poll(timeout_ms=100)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(keep_polling, consumer)
                nursery.start_soon(keep_polling, second)
                await wait_for(
                    lambda: _async(
                        len(consumer.assignment()) == 2 and len(second.assignment()) == 2
                    )
                )
                nursery.cancel_scope.cancel()
            # its positions start from what was committed before the failover
            positions = {tp: await second.position(tp) for tp in second.assignment()}
            expected = {
                TopicPartition("tf", 0): 5,
                **{TopicPartition("tf", p): p + 1 for p in (1, 2, 3)},
            }
            assert all(positions[tp] >= expected[tp] for tp in positions)


async def test_clients_may_not_produce_to_the_offsets_topic(minibroker_cluster_factory):
    """Kafka refuses a Produce to an internal topic (INVALID_TOPIC_EXCEPTION) unless its
    client.id is the admin client's; the group's offsets are untouched either way."""
    cluster = minibroker_cluster_factory(3, GROUP_CONFIG)
    bootstrap = cluster.bootstrap
    await setup_topic(bootstrap, "ti", 1, 1)
    async with Consumer(bootstrap, group_id="gi", **FAST) as consumer:
        consumer.subscribe(["ti"])
        await wait_for(lambda: _polled(consumer, 1))  # __consumer_offsets exists from here
        await consumer.commit({("ti", 0): 1})
    async with Producer(bootstrap) as producer:
        with pytest.raises(InvalidTopic, match="Cannot append to internal topic"):
            await producer.send(GROUP_METADATA_TOPIC, b"forged", partition=0)
    async with Producer(bootstrap, **{"client.id": ADMIN_CLIENT_ID}) as producer:
        # With a key: the topic is compacted, and a keyless record is INVALID_RECORD there.
        await producer.send(
            GROUP_METADATA_TOPIC, b"the admin client id may", key=b"forged", partition=0
        )
    async with Admin(bootstrap) as admin:
        assert await admin.list_consumer_group_offsets("gi") == {TopicPartition("ti", 0): 1}


async def _polled(consumer: Consumer, partitions: int) -> bool:
    await consumer.poll(timeout_ms=100)
    return len(consumer.assignment()) == partitions


async def test_groups_describe_shows_lag(minibroker_cluster_factory):
    cluster = minibroker_cluster_factory(3, GROUP_CONFIG)
    bootstrap = cluster.bootstrap
    await setup_topic(bootstrap, "tl", 2, 10)
    async with Admin(bootstrap) as admin:
        await admin.alter_consumer_group_offsets("gl", {("tl", 0): 3, ("tl", 1): 7})

    def cli(*args: str) -> str:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "minibroker.deploy.cli",
                "groups",
                *args,
                "--bootstrap",
                bootstrap,
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout

    rows = [line.split() for line in cli("describe", "gl").splitlines()[2:]]
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [
        ("tl", "0", "3", "10", "7"),
        ("tl", "1", "7", "10", "3"),
    ]
    assert "gl\tEmpty" in cli("list")
    cli("reset-offsets", "gl", "--topic", "tl", "--to-latest")
    rows = [line.split() for line in cli("describe", "gl").splitlines()[2:]]
    assert [r[4] for r in rows] == ["0", "0"]
    assert "Deleted group gl." in cli("delete", "gl")
    assert "gl" not in cli("list")
