"""Cooperative-sticky groups (KIP-429) against real broker processes: a member joining a
group of three moves only the partitions balance needs, each revoked by its owner before
its new owner gets it, while the others keep consuming what they keep, with nothing read
twice; and confluent-kafka's cooperative-sticky consumers share a group with each other
and with ours, whichever of them leads.

Every wait is on the thing itself (an assignment, records seen, a group state), with a
generous bound.
"""

from __future__ import annotations

import itertools

import pytest
import trio
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import Producer as RdProducer

from minibroker.client import Admin, Consumer, SyncConsumer, TopicPartition
from tests.integration.test_consumer_groups import FAST, GROUP_CONFIG, setup_topic, wait_for
from tests.integration.test_kafka_groups import (
    HEARTBEAT_MS,
    SESSION_MS,
    Native,
    Poller,
    Rd,
    create_and_fill,
    until,
)
from tests.integration.test_kafka_groups import cluster as cluster

pytestmark = pytest.mark.integration

COOPERATIVE = {
    **FAST,
    "session.timeout.ms": 6000,  # a loaded machine must not drop a member mid-test
    "enable.auto.commit": False,  # the listener commits what it hands over
    "partition.assignment.strategy": "cooperative-sticky",
}


class Recorder:
    """A member's rebalance listener: every call in one shared, ordered log; a revoked
    partition's position committed before it is let go (as a Kafka application does), so
    its next owner starts exactly where this one stopped."""

    def __init__(
        self, name: str, log: list, clock: itertools.count, hold: trio.Event | None = None
    ) -> None:
        self.name = name
        self.log = log
        self.clock = clock
        self.hold = hold  # set: the first assignment waits for it (see the newcomer below)
        self.consumer: Consumer | None = None

    async def on_partitions_revoked(self, partitions: set[TopicPartition]) -> None:
        positions = {tp: await self.consumer.position(tp) for tp in partitions}
        await self.consumer.commit(positions)
        self.log.append((next(self.clock), self.name, "revoked", set(partitions)))

    async def on_partitions_assigned(self, partitions: set[TopicPartition]) -> None:
        self.log.append((next(self.clock), self.name, "assigned", set(partitions)))
        if self.hold is not None:
            hold, self.hold = self.hold, None
            await hold.wait()

    def on_partitions_lost(self, partitions: set[TopicPartition]) -> None:
        self.log.append((next(self.clock), self.name, "lost", set(partitions)))


async def test_a_fourth_member_moves_only_what_balance_needs_and_the_rest_keep_consuming(
    minibroker_cluster_factory,
):
    cluster = minibroker_cluster_factory(3, GROUP_CONFIG)
    bootstrap = cluster.bootstrap
    topic, group = "coop6", "g-coop"
    await setup_topic(bootstrap, topic, 6, 20)
    seen: list[tuple[str, int, int]] = []  # (member, partition, offset)
    log: list[tuple[int, str, str, set[TopicPartition]]] = []
    clock = itertools.count()
    consumers: dict[str, Consumer] = {}
    stop = trio.Event()
    # The newcomer's listener holds its first assignment (phase one: nothing) until this is
    # set: it does not poll, so does not rejoin, so the rebalance that hands over the
    # revoked partition waits for it, and the test can watch the others consume meanwhile.
    release_newcomer = trio.Event()

    # Members leave only once none polls: each leave is a rebalance of its own, which would
    # hand the leaver's partitions (uncommitted reads and all) to a member still in its last
    # poll, and the logs would judge that instead of the rebalance under test.
    polling: set[str] = set()
    none_polling = trio.Event()

    async def member(name: str, hold: trio.Event | None = None) -> None:
        listener = Recorder(name, log, clock, hold)
        polling.add(name)
        async with Consumer(bootstrap, group_id=group, **COOPERATIVE) as c:
            listener.consumer = c
            c.subscribe([topic], listener)
            consumers[name] = c
            while not stop.is_set():
                records = await c.poll(timeout_ms=200)
                seen.extend((name, r.partition, r.offset) for r in records)
            polling.discard(name)
            if not polling:
                none_polling.set()
            await none_polling.wait()

    async def producer_loop() -> None:
        """A record into every partition every 50 ms: there is always something new."""
        from minibroker.client import Producer

        async with Producer(bootstrap) as producer:
            for i in itertools.count(20):
                if stop.is_set():
                    return
                for p in range(6):
                    await producer.enqueue(topic, f"{p}-{i}".encode(), partition=p)
                await producer.flush()
                await trio.sleep(0.05)  # pacing, not a wait for anything

    def held(names: str) -> list[set[TopicPartition]]:
        return [consumers[n].assignment() for n in names if n in consumers]

    async def group_state() -> str:
        async with Admin(bootstrap) as admin:
            return (await admin.describe_consumer_group(group)).state

    async with trio.open_nursery() as nursery:
        for name in "abc":
            nursery.start_soon(member, name)
        nursery.start_soon(producer_loop)

        async def three_settled() -> bool:
            owned = held("abc")
            return (
                len(owned) == 3
                and sorted(map(len, owned)) == [2, 2, 2]
                and len(set().union(*owned)) == 6
                and await group_state() == "Stable"
            )

        await wait_for(three_settled, what="three members with two partitions each")
        before = {n: consumers[n].assignment() for n in "abc"}
        mark = len(log)
        nursery.start_soon(member, "d", release_newcomer)

        # Phase one: d is a member with nothing; one owner revokes one partition and
        # rejoins, so the group prepares the next generation, which waits for d.
        async def preparing() -> bool:
            revoked = [e for e in log[mark:] if e[2] == "revoked"]
            return bool(revoked) and await group_state() == "PreparingRebalance"

        await wait_for(preparing, what="a revoke and the next rebalance under way")
        kept = {n: consumers[n].assignment() for n in "abc"}
        assert sorted(map(len, kept.values())) == [1, 2, 2]
        ends = {}
        async with Consumer(bootstrap) as probe:
            ends = await probe.end_offsets([(topic, p) for p in range(6)])

        async def consumed_through_rebalance() -> bool:
            """Every kept partition read past where it ended when the rebalance began."""
            return all(
                any(w == n and p == tp.partition and o >= ends[tp] for w, p, o in seen)
                for n, tps in kept.items()
                for tp in tps
            )

        await wait_for(consumed_through_rebalance, what="the others consuming meanwhile")
        assert await group_state() == "PreparingRebalance"  # still: only d's rejoin ends it
        release_newcomer.set()

        async def four_settled() -> bool:
            owned = held("abcd")
            return (
                len(owned) == 4
                and sorted(map(len, owned)) == [1, 1, 2, 2]
                and len(set().union(*owned)) == 6
                and await group_state() == "Stable"
            )

        await wait_for(four_settled, what="four members sharing six partitions")
        after = {n: consumers[n].assignment() for n in "abcd"}
        stop.set()

    # Balance needed one partition moved, and only that one moved.
    moved = {tp for n in "abc" for tp in before[n] - after[n]}
    assert len(moved) == 1 and after["d"] == moved
    for n in "abc":
        assert after[n] <= before[n]
    events = log[mark:]
    assert not [e for e in events if e[2] == "lost"]
    # Nobody was told of a revoke of a partition it kept, nor assigned one it had.
    for _, who, kind, tps in events:
        if kind == "revoked":
            assert tps <= moved and not tps & after[who], (who, tps)
        if who != "d":
            assert kind != "assigned" or not tps, (who, tps)  # cooperative: no new ones
    # The moved partition: revoked by its owner, then (later) assigned to d.
    (tp,) = moved
    revoked_at = [t for t, who, kind, tps in events if kind == "revoked" and tp in tps]
    assigned_at = [t for t, who, kind, tps in events if kind == "assigned" and tp in tps]
    assert len(revoked_at) == 1 and len(assigned_at) == 1
    assert revoked_at[0] < assigned_at[0]
    assert [who for _, who, kind, tps in events if kind == "assigned" and tp in tps] == ["d"]
    # Nothing read twice: every handover started at the commit of the revoke before it.
    reads = [(p, o) for _, p, o in seen]
    assert len(reads) == len(set(reads))
    # And no gap: each partition's reads are its offsets from 0 up.
    for p in range(6):
        offsets = sorted(o for q, o in reads if q == p)
        assert offsets == list(range(len(offsets)))


# --- confluent-kafka (librdkafka) with cooperative-sticky -------------------------------------


class RdCooperative(Rd):
    """confluent-kafka with partition.assignment.strategy=cooperative-sticky; its rebalance
    callbacks get only the partitions that change (librdkafka's incremental assign)."""

    name = "confluent-coop"

    def __init__(self, cluster, group: str, topic: str) -> None:
        self.events: list[tuple[str, set[int]]] = []
        self.c = RdConsumer(
            {
                "bootstrap.servers": cluster.kafka_bootstrap,
                "group.id": group,
                "client.id": f"{self.name}-{group}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": SESSION_MS,
                "heartbeat.interval.ms": HEARTBEAT_MS,
                "partition.assignment.strategy": "cooperative-sticky",
            }
        )
        self.c.subscribe(
            [topic],
            on_assign=lambda c, parts: self.events.append(
                ("assigned", {p.partition for p in parts})
            ),
            on_revoke=lambda c, parts: self.events.append(
                ("revoked", {p.partition for p in parts})
            ),
        )


class NativeCooperative(Native):
    """Our consumer with cooperative-sticky, its listener's calls recorded (polling,
    assignment and close as the groups tests' adapter)."""

    name = "minibroker-coop"
    strategy = "cooperative-sticky"

    def __init__(self, cluster, group: str, topic: str) -> None:
        self.events: list[tuple[str, set[int]]] = []
        settings = {
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            "partition.assignment.strategy": self.strategy,
        }
        self.c = SyncConsumer(cluster.bootstrap, group_id=group, **settings)
        events = self.events

        class Listener:
            def on_partitions_revoked(self, parts) -> None:
                events.append(("revoked", {tp.partition for tp in parts}))

            def on_partitions_assigned(self, parts) -> None:
                events.append(("assigned", {tp.partition for tp in parts}))

        self.c.subscribe([topic], Listener())


@pytest.mark.parametrize(
    "pair",
    [
        (RdCooperative, RdCooperative),
        (RdCooperative, NativeCooperative),  # librdkafka leads, over our subscription
        (NativeCooperative, RdCooperative),  # we lead, over librdkafka's
    ],
    ids=lambda pair: "+".join(c.name for c in pair),
)
def test_cooperative_sticky_members_of_stock_and_our_clients_share_a_topic(cluster, pair):
    """The first member owns all four partitions; the second joins: two move, each revoked
    by the first (and only those: it never lets go of the two it keeps) before the second
    is given them; then the two read everything produced, without overlap."""
    name = "-".join(c.name for c in pair)
    topic, group = f"coop-{name}", f"g-coop-{name}"
    create_and_fill(cluster.kafka_bootstrap, topic, 4, 0)
    first = Poller(pair[0](cluster, group, topic))
    members = [first]
    try:
        until(lambda: first.assigned == {0, 1, 2, 3}, "the first member to own all four")
        second = Poller(pair[1](cluster, group, topic))
        members.append(second)
        until(
            lambda: len(first.assigned) == 2 and len(second.assigned) == 2,
            "two partitions each",
        )
        a, b = first.member, second.member
        assert first.assigned.isdisjoint(second.assigned)
        kept, moved = first.assigned, second.assigned
        assert a.events[0] == ("assigned", {0, 1, 2, 3})
        revoked = [parts for kind, parts in a.events[1:] if kind == "revoked"]
        assert set().union(*revoked) == moved  # only what moved, never what it kept
        assert not [p for kind, p in a.events[1:] if kind == "assigned" and p]
        assert set().union(*(p for kind, p in b.events if kind == "assigned")) == moved

        producer = RdProducer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"})
        for p in range(4):
            for i in range(10):
                producer.produce(topic, b"%d-%d" % (p, i), partition=p)
        assert producer.flush(60) == 0
        until(lambda: len(first.records) + len(second.records) >= 40, "all 40 records")
        assert sorted(first.records + second.records) == [
            (p, i) for p in range(4) for i in range(10)
        ]
        assert {p for p, _ in first.records} == kept
        assert {p for p, _ in second.records} == moved
    finally:
        for member in members:
            member.close()


class NativeEager(NativeCooperative):
    """Ours in the middle of a rolling upgrade: it prefers range but offers
    cooperative-sticky too, so it rebalances eagerly (Kafka's rule)."""

    name = "minibroker-eager"
    strategy = "range,cooperative-sticky"


def test_a_group_mixing_strategies_agrees_on_cooperative_sticky(cluster):
    """The coordinator picks the one protocol every member offers; the eager member revokes
    everything at each rebalance and claims nothing, the cooperative one keeps its own."""
    topic, group = "coop-mixed", "g-coop-mixed"
    create_and_fill(cluster.kafka_bootstrap, topic, 4, 0)
    first = Poller(NativeCooperative(cluster, group, topic))
    members = [first]
    try:
        until(lambda: first.assigned == {0, 1, 2, 3}, "the first member to own all four")
        second = Poller(NativeEager(cluster, group, topic))
        members.append(second)
        until(
            lambda: len(first.assigned) == 2 and len(second.assigned) == 2,
            "two partitions each",
        )
        assert first.assigned.isdisjoint(second.assigned)
        revoked = [p for kind, p in first.member.events[1:] if kind == "revoked"]
        assert set().union(*revoked) == second.assigned  # the cooperative one kept its two

        async def protocol() -> str:
            async with Admin(cluster.bootstrap) as admin:
                return (await admin.describe_consumer_group(group)).protocol

        assert trio.run(protocol) == "cooperative-sticky"
    finally:
        for member in members:
            member.close()
