"""Three broker processes: replication, high watermarks, ISR shrink/expand, acks=all."""

from __future__ import annotations

import signal
import time

import psutil
import pytest
import trio

from minibroker.client import Admin, Consumer, NewTopic, Producer
from minibroker.protocol.errors import NotEnoughReplicas, RequestTimedOut

from .cluster_helpers import isr_of, partition_view, segment_bytes, wait_for

pytestmark = pytest.mark.integration

FAST_ISR = {"replica.lag.time.max.ms": 1500, "min.insync.replicas": 2}


async def create(state, name, partitions=1, rf=3, configs=None):
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic(name, partitions, rf, configs or {})])


async def test_acks_all_round_trip_replicas_identical(cluster_factory):
    state = await cluster_factory(3)
    await create(state, "orders", partitions=3)
    async with Producer(state.bootstrap, acks="all") as producer:
        handles = [
            producer.send_nowait("orders", f"v{i}".encode(), key=f"k{i % 7}".encode())
            for i in range(300)
        ]
        acked = [await h for h in handles]
    assert len({(m.partition, m.offset) for m in acked}) == 300

    async def all_caught_up():
        for p in range(3):
            views = [await partition_view(state, b, "orders", p) for b in range(3)]
            if len({(v["high_watermark"], v["log_end_offset"]) for v in views}) != 1:
                return False
        return True

    await wait_for(all_caught_up, 20, "HW and LEO equal on every replica")
    for p in range(3):
        copies = {segment_bytes(state, b, "orders", p) for b in range(3)}
        assert len(copies) == 1, f"replicas of orders-{p} differ"
        assert copies.pop()

    async with Consumer(state.bootstrap) as consumer:
        consumer.assign([("orders", p) for p in range(3)])
        consumer.seek_to_beginning()
        seen = []
        while len(seen) < 300:
            seen += await consumer.poll(timeout_ms=2000)
    assert sorted(r.value for r in seen) == sorted(f"v{i}".encode() for i in range(300))


async def test_a_new_topics_first_acks_all_write_never_waits_out_a_parked_replica_fetch(
    cluster_factory,
):
    """A follower often asks for a new partition a moment before its leader has applied
    the topic; refused, it retries. The retry used to wait behind the replica fetch that
    went out meanwhile, parked at the leader for replica.fetch.wait.max.ms: about one
    topic creation in eight held its first acks=all write that long. With the long poll
    at 20 s, each of 15 new topics' first writes is awaited with a bound of half of it."""
    state = await cluster_factory(3, {"replica.fetch.wait.max.ms": 20000})
    async with Admin(state.bootstrap) as admin, Producer(state.bootstrap, acks="all") as producer:
        for i in range(15):
            name = f"fresh-{i}"
            await admin.create_topics([NewTopic(name, 3, 3)])
            with trio.move_on_after(10) as bound:
                for p in range(3):
                    await producer.send(name, b"first", partition=p)
            assert not bound.cancelled_caught, f"{name}'s first acks=all writes waited 10 s"


async def test_paused_follower_times_out_then_isr_shrinks(cluster_factory):
    # Five voters, so the metadata quorum keeps its majority while both followers of a
    # partition are paused: ISR changes commit through it. The partition is one whose
    # followers are neither the active controller nor broker 0 (where reads bootstrap).
    state = await cluster_factory(5, FAST_ISR)
    await create(state, "slow", partitions=10)
    async with Admin(state.bootstrap) as admin:
        controller = (await admin.describe_cluster())[1]
        parts = (await admin.describe_topics(["slow"]))["slow"].partitions
    p, leader, f1, f2 = next(
        (i, x.leader, *[r for r in x.replicas if r != x.leader])
        for i, x in enumerate(parts)
        if not {0, controller} & (set(x.replicas) - {x.leader})
    )
    settings = {
        "retries": 0,
        "request.timeout.ms": 700,
        "delivery.timeout.ms": 5000,
        "linger.ms": 0,
    }
    async with Producer(state.bootstrap, acks="all", **settings) as producer:
        await producer.send("slow", b"before", partition=p)
        state.signal(f2, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            # The produce timeout is carried in the request (request.timeout.ms), as in Kafka.
            with pytest.raises(RequestTimedOut):
                await producer.send("slow", b"stalled", partition=p)
            assert time.monotonic() - t0 < 5
            await wait_for(
                lambda: _isr_is(state, p, sorted([leader, f1])), 20, "ISR to shrink to two"
            )
            await producer.send("slow", b"after-shrink", partition=p)

            state.signal(f1, signal.SIGSTOP)
            # A caught-up follower stays in the ISR (Kafka's isCaughtUp); a write makes it lag.
            with pytest.raises(RequestTimedOut):
                await producer.send("slow", b"stalled-again", partition=p)
            await wait_for(lambda: _isr_is(state, p, [leader]), 20, "ISR to shrink to the leader")
            leo_before = (await partition_view(state, leader, "slow", p))["log_end_offset"]
            with pytest.raises(NotEnoughReplicas):
                await producer.send("slow", b"refused", partition=p)
            assert (await partition_view(state, leader, "slow", p))["log_end_offset"] == leo_before
        finally:
            state.signal(f1, signal.SIGCONT)
            state.signal(f2, signal.SIGCONT)
        await wait_for(
            lambda: _isr_is(state, p, sorted([leader, f1, f2])), 30, "both followers to rejoin"
        )
        await producer.send("slow", b"healed", partition=p)


async def _isr_is(state, partition, expected):
    return await isr_of(state, "slow", partition) == expected


async def test_long_poll_completes_when_follower_fetch_moves_hw(cluster_factory):
    state = await cluster_factory(3)
    await create(state, "poll")
    async with Consumer(
        state.bootstrap, **{"fetch.max.wait.ms": 20000, "fetch.min.bytes": 1}
    ) as consumer:
        consumer.assign([("poll", 0)])
        consumer.seek_to_end()
        await consumer.position(("poll", 0))
        async with trio.open_nursery() as nursery:
            got = []

            async def poll():
                t0 = time.monotonic()
                got.extend(await consumer.poll(timeout_ms=20000))
                got.append(time.monotonic() - t0)

            nursery.start_soon(poll)
            await trio.sleep(0.3)  # let the long poll park in the leader's purgatory
            async with Producer(state.bootstrap, acks=1) as producer:
                await producer.send("poll", b"wake up")
    elapsed = got.pop()
    assert [r.value for r in got] == [b"wake up"]
    # acks=1 leaves the HW where it was; only the followers' next fetch moves it.
    assert elapsed < 10


async def test_idle_cluster_uses_almost_no_cpu(cluster_factory):
    state = await cluster_factory(3)
    await create(state, "idle", partitions=3)
    procs = [state.process(i) for i in range(3)]
    await trio.sleep(1)  # let start-up work finish before measuring
    before = [sum(p.cpu_times()[:2]) for p in procs]
    t0 = time.monotonic()
    await trio.sleep(3)
    wall = time.monotonic() - t0
    used = [sum(p.cpu_times()[:2]) - b for p, b in zip(procs, before, strict=True)]
    for broker_id, cpu in enumerate(used):
        assert cpu / wall < 0.05, f"broker {broker_id} used {cpu:.2f}s CPU in {wall:.1f}s idle"
    assert all(isinstance(p, psutil.Process) for p in procs)
