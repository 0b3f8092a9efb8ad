"""The client against a real broker process: produce, consume, seek, long poll, errors."""

from __future__ import annotations

import signal
import time

import pytest
import trio

from minibroker.client import (
    Admin,
    Consumer,
    NewTopic,
    Producer,
    SyncAdmin,
    SyncConsumer,
    SyncProducer,
    TopicPartition,
    key_partition,
)
from minibroker.deploy.launcher import free_port
from minibroker.protocol.errors import (
    BrokerNotAvailable,
    RequestTimedOut,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)

pytestmark = pytest.mark.integration

EARLIEST = {"auto.offset.reset": "earliest"}


async def create(
    bootstrap: str, name: str, partitions: int = 1, configs: dict | None = None
) -> None:
    async with Admin(bootstrap) as admin:
        await admin.create_topics([NewTopic(name, partitions, 1, configs or {})])


async def consume_all(bootstrap: str, parts: list[tuple[str, int]], count: int, **settings) -> list:
    out: list = []
    async with Consumer(bootstrap, {**EARLIEST, **settings}) as consumer:
        consumer.assign(parts)
        with trio.fail_after(30):
            while len(out) < count:
                out += await consumer.poll(timeout_ms=1000)
    return out


async def test_round_trip_keeps_keys_headers_and_timestamps(broker):
    await create(broker, "rt", 3)
    async with Producer(broker, acks="all") as producer:
        meta = await producer.send(
            "rt",
            b"v1",
            key=b"user-1",
            headers={"trace": b"abc", "n": None},
            timestamp=1_700_000_000_123,
        )
        assert (
            meta.topic == "rt"
            and meta.partition == key_partition(b"user-1", 3)
            and meta.offset == 0
        )
        meta2 = await producer.send("rt", "text value", key="user-1")
        assert (meta2.partition, meta2.offset) == (meta.partition, 1)
    (first, second) = await consume_all(broker, [("rt", meta.partition)], 2)
    assert first.key == b"user-1" and first.value == b"v1"
    assert first.timestamp == 1_700_000_000_123
    assert first.headers == (("trace", b"abc"), ("n", None))
    assert (first.topic, first.partition, first.offset) == ("rt", meta.partition, 0)
    assert second.value == b"text value" and second.offset == 1


async def test_many_records_over_many_partitions_arrive_in_order(broker):
    await create(broker, "wide", 8)
    n = 5000
    async with Producer(broker, acks=1, **{"linger.ms": 2}) as producer:
        handles = [
            producer.send_nowait("wide", str(i).encode(), key=str(i % 50).encode())
            for i in range(n)
        ]
        await producer.flush()
        metas = [h.result() for h in handles]
    assert {m.partition for m in metas} == set(range(8))
    got = await consume_all(broker, [("wide", p) for p in range(8)], n)
    assert sorted(int(r.value) for r in got) == list(range(n))
    for p in range(8):
        values = [int(r.value) for r in got if r.partition == p]
        assert values == sorted(values)  # per-partition order is send order
        offsets = [r.offset for r in got if r.partition == p]
        assert offsets == list(range(len(offsets)))
    for i, meta in enumerate(metas):
        assert meta.partition == key_partition(str(i % 50).encode(), 8)


async def test_null_keys_are_spread_over_partitions(broker):
    await create(broker, "spread", 4)
    async with Producer(broker, acks=1, **{"batch.size": 1000}) as producer:
        handles = [producer.send_nowait("spread", b"x" * 90) for _ in range(400)]
        await producer.flush()
    assert len({h.result().partition for h in handles}) == 4


async def test_acks_zero_and_explicit_partition(broker):
    await create(broker, "a0", 2)
    async with Producer(broker, acks=0) as producer:
        meta = await producer.send("a0", b"fire", partition=1)
    assert meta == ("a0", 1, -1)
    (record,) = await consume_all(broker, [("a0", 1)], 1)
    assert record.value == b"fire"


async def test_seek_position_and_offset_lookups(broker):
    await create(broker, "seek")
    tp = TopicPartition("seek", 0)
    async with Producer(broker, acks=1) as producer:
        for i in range(10):
            await producer.enqueue("seek", str(i), timestamp=1000 + i * 10)
        await producer.flush()
    async with Consumer(broker) as consumer:
        consumer.assign([tp])
        assert await consumer.position(tp) == 10  # auto.offset.reset=latest
        assert await consumer.beginning_offsets([tp]) == {tp: 0}
        assert await consumer.end_offsets([tp]) == {tp: 10}
        found = await consumer.offsets_for_times({("seek", 0): 1045})
        assert found[tp].offset == 5
        assert (await consumer.offsets_for_times({tp: 99_999}))[tp] is None

        consumer.seek(tp, 7)
        assert await consumer.position(tp) == 7
        records = await consumer.poll(timeout_ms=5000)
        assert [r.value for r in records] == [b"7", b"8", b"9"]
        assert await consumer.position(tp) == 10

        consumer.seek_to_beginning(tp)
        assert await consumer.position(tp) == 0
        records = await consumer.poll(timeout_ms=5000, max_records=4)
        assert [r.offset for r in records] == [0, 1, 2, 3]
        assert await consumer.position(tp) == 4

        consumer.seek_to_end()
        assert await consumer.position(tp) == 10


async def test_out_of_range_position_is_reset(broker):
    await create(broker, "oor")
    async with Producer(broker, acks=1) as producer:
        await producer.send("oor", b"only")
    async with Consumer(broker, EARLIEST) as consumer:
        consumer.assign([("oor", 0)])
        consumer.seek(("oor", 0), 500)
        with trio.fail_after(20):
            records = []
            while not records:
                records = await consumer.poll(timeout_ms=1000)
        assert records[0].offset == 0


async def test_long_poll_returns_when_data_arrives(broker):
    await create(broker, "lp")
    # A fetch that waits 20 s at the broker: the poll may only come back early if the
    # broker completes the fetch when the record lands (the bound below is generous).
    async with Consumer(broker, **{"fetch.max.wait.ms": 20000}) as consumer:
        consumer.assign([("lp", 0)])
        assert await consumer.position(("lp", 0)) == 0
        got = []

        async def poll():
            got.extend(await consumer.poll(timeout_ms=60000))

        with trio.fail_after(15):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(poll)
                await trio.sleep(0.3)  # let the fetch park at the broker
                async with Producer(broker, acks=1) as producer:
                    await producer.send("lp", b"wake up")
    assert [r.value for r in got] == [b"wake up"]


async def test_poll_without_data_returns_empty_after_its_timeout(broker):
    await create(broker, "quiet")
    async with Consumer(broker, **{"fetch.max.wait.ms": 100}) as consumer:
        consumer.assign([("quiet", 0)])
        assert await consumer.poll(timeout_ms=300) == []


async def test_unreachable_broker_is_a_clear_error():
    port = free_port()
    with pytest.raises(
        BrokerNotAvailable,
        match=f"no broker answered METADATA: 127.0.0.1:{port} \\(connection refused\\)",
    ):
        async with Producer(f"127.0.0.1:{port}"):
            pass


async def test_unknown_topic_fails_after_max_block(broker):
    async with Producer(broker, **{"max.block.ms": 300}) as producer:
        with pytest.raises(UnknownTopicOrPartition, match="nope"):
            await producer.send("nope", b"x")
        handle = producer.send_nowait("nope2", b"x")
        with pytest.raises(UnknownTopicOrPartition):
            await handle


async def paused_follower_topic(cluster_factory, name: str):
    """A 2-broker cluster with topic ``name`` (RF 2) whose follower is SIGSTOPped: acks=all stalls."""
    state = await cluster_factory(2)
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic(name, 1, 2)])
        leader = (await admin.describe_topics([name]))[name].partitions[0].leader
    follower = 1 - leader
    state.signal(follower, signal.SIGSTOP)
    return state, f"127.0.0.1:{state.port(leader)}"


async def test_acks_all_times_out_when_the_follower_stalls(cluster_factory):
    _, leader = await paused_follower_topic(cluster_factory, "stall")
    settings = {
        "acks": "all",
        "request.timeout.ms": 500,
        "delivery.timeout.ms": 1500,
        "linger.ms": 0,
    }
    async with Producer(leader, settings) as producer:
        with pytest.raises(RequestTimedOut):
            await producer.send("stall", b"x")
    async with Producer(leader, acks=1) as producer:
        meta = await producer.send("stall", b"y")
    assert meta.offset >= 1  # the timed-out record was appended by the leader all the same


async def test_admin_topics_and_stats(broker):
    async with Admin(broker) as admin:
        await admin.create_topics([NewTopic("adm", 3, 1)])
        with pytest.raises(TopicAlreadyExists):
            await admin.create_topics([NewTopic("adm", 3, 1)])
        assert "adm" in await admin.list_topics()
        desc = (await admin.describe_topics(["adm"]))["adm"]
        assert [p.partition for p in desc.partitions] == [0, 1, 2]
        assert all(p.leader == 0 and p.replicas == [0] and p.isr == [0] for p in desc.partitions)
        with pytest.raises(UnknownTopicOrPartition):
            await admin.describe_topics(["missing"])
        stats = await admin.broker_stats()
        assert stats["broker_id"] == 0 and isinstance(stats["stats"], dict)
        assert (await admin.broker_stats(0))["broker_id"] == 0


def test_sync_facade_round_trip(broker):
    with SyncAdmin(broker) as admin:
        admin.create_topics([NewTopic("sync", 2, 1)])
    with SyncProducer(broker, acks=1) as producer:
        first = producer.send("sync", b"one", partition=0)
        handles = producer.send_many(
            "sync", [{"value": b"two", "partition": 1}, {"value": b"three", "partition": 0}]
        )
        producer.flush()
        assert first.offset == 0
        assert handles[1].result(timeout=10).offset == 1
    with SyncConsumer(broker, EARLIEST) as consumer:
        consumer.assign([("sync", 0), ("sync", 1)])
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 3 and time.monotonic() < deadline:
            got += consumer.poll(timeout_ms=1000)
        assert sorted(r.value for r in got) == [b"one", b"three", b"two"]
        assert consumer.position(("sync", 0)) == 2


async def test_producer_and_consumer_follow_a_leader_change(cluster_factory):
    state = await cluster_factory(
        3, {"broker.session.timeout.ms": 1500, "broker.heartbeat.interval.ms": 200}
    )
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic("moving", 3, 3)])
        _, controller = await admin.describe_cluster()
        parts = (await admin.describe_topics(["moving"]))["moving"].partitions
    # Kill the leader of a partition that the controller does not lead (the controller stays up).
    old = next(p for p in parts if p.leader != controller)
    tp = ("moving", old.partition)
    async with (
        Producer(state.bootstrap, acks="all", **{"retry.backoff.ms": 50}) as producer,
        Consumer(state.bootstrap, EARLIEST) as consumer,
    ):
        consumer.assign([tp])
        before = await producer.send("moving", b"before", partition=old.partition)
        with trio.fail_after(30):
            got = []
            while not got:
                got = await consumer.poll(timeout_ms=1000)
        state.kill(old.leader)
        with trio.fail_after(30):
            after = await producer.send("moving", b"after", partition=old.partition)
            while len(got) < 2:  # the consumer finds the new leader on its own
                got += await consumer.poll(timeout_ms=1000)
    assert after.offset == before.offset + 1
    assert [r.value for r in got] == [b"before", b"after"]
    async with Admin(state.bootstrap) as admin:
        new = (await admin.describe_topics(["moving"]))["moving"].partitions[old.partition]
    assert new.leader not in (old.leader, -1) and new.leader_epoch > old.leader_epoch
