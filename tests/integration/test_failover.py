"""Leader failover by the controller, and truncation by leader epoch on the way back."""

from __future__ import annotations

import signal
import time

import pytest

from minibroker.client import Admin, Consumer, NewTopic, Producer

from .cluster_helpers import (
    isr_of,
    leader_of,
    partition_led_by,
    partition_view,
    segment_bytes,
    wait_for,
)

pytestmark = pytest.mark.integration

FAST = {
    "broker.session.timeout.ms": 1500,
    "broker.heartbeat.interval.ms": 200,
    "replica.fetch.backoff.ms": 50,
}


async def read_all(bootstrap, topic, partition, expected):
    async with Consumer(bootstrap) as consumer:
        consumer.assign([(topic, partition)])
        consumer.seek_to_beginning()
        out = []
        while len(out) < expected:
            batch = await consumer.poll(timeout_ms=3000)
            assert batch, f"only {len(out)} of {expected} records readable"
            out += batch
    return out


async def test_leader_sigkill_elects_from_isr_and_loses_no_acknowledged_write(cluster_factory):
    state = await cluster_factory(3, {**FAST, "min.insync.replicas": 2})
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic("fo", 3, 3)])
    # Broker 0 is the controller (no controller failover yet): kill a leader that is not it.
    p = await partition_led_by(state, "fo", lambda leader: leader != 0)
    victim = await leader_of(state, "fo", p)
    acked = []
    settings = {"delivery.timeout.ms": 30000, "request.timeout.ms": 2000, "retry.backoff.ms": 50}
    async with Producer(state.bootstrap, acks="all", **settings) as producer:
        for i in range(50):
            acked.append((await producer.send("fo", f"a{i}".encode(), partition=p)).offset)
        state.kill(victim)
        t0 = time.monotonic()
        # The client retries through the failover: these land on the new leader.
        for i in range(50, 100):
            acked.append((await producer.send("fo", f"a{i}".encode(), partition=p)).offset)
        failover_s = time.monotonic() - t0
    new_leader = await leader_of(state, "fo", p)
    assert new_leader in {0, 1, 2} - {victim}
    assert failover_s < 1.5 + 10
    assert acked == sorted(acked) and len(set(acked)) == 100
    records = await read_all(state.bootstrap, "fo", p, 100)
    assert [r.value for r in records] == [f"a{i}".encode() for i in range(100)]
    assert [r.offset for r in records] == acked

    state.start(victim)
    state.save()
    state.wait_ready([victim])
    await wait_for(
        lambda: _isr_has(state, "fo", p, 3), 30, "the restarted broker to rejoin the ISR"
    )
    await wait_for(lambda: _replicas_agree(state, "fo", p), 30, "replicas to agree")


async def _isr_has(state, topic, partition, count):
    return len(await isr_of(state, topic, partition)) == count


async def _replicas_agree(state, topic, partition):
    views = [await partition_view(state, b, topic, partition) for b in range(state.brokers)]
    if len({v["log_end_offset"] for v in views if v}) != 1:
        return False
    return len({segment_bytes(state, b, topic, partition) for b in range(state.brokers)}) == 1


async def test_unreplicated_suffix_of_a_dead_leader_is_truncated(cluster_factory):
    # A partition on brokers 1 and 2 only (not the controller, which must stay up): its
    # leader gets killed, its follower paused; a long lag time keeps it in the ISR.
    state = await cluster_factory(3, {**FAST, "replica.lag.time.max.ms": 30000})
    async with Admin(state.bootstrap) as admin:
        # Three partitions of two replicas: one of them is on brokers 1 and 2 (placement
        # puts each leader's follower at the same distance in the first round).
        await admin.create_topics([NewTopic("div", 3, 2)])
        partitions = (await admin.describe_topics(["div"]))["div"].partitions
    p = next(i for i, part in enumerate(partitions) if sorted(part.replicas) == [1, 2])
    leader = partitions[p].leader
    follower = 3 - leader
    async with Producer(state.bootstrap, acks="all") as producer:
        for i in range(5):
            await producer.send("div", f"both{i}".encode(), partition=p)
    state.signal(follower, signal.SIGSTOP)
    try:
        async with Producer(state.bootstrap, acks=1, **{"linger.ms": 0}) as producer:
            for i in range(3):
                await producer.send("div", f"lost{i}".encode(), partition=p)
        assert (await partition_view(state, leader, "div", p))["log_end_offset"] == 8
        state.kill(leader)
    finally:
        state.signal(follower, signal.SIGCONT)
    await wait_for(
        lambda: _leader_is(state, "div", p, follower), 30, f"broker {follower} to lead div-{p}"
    )
    async with Producer(state.bootstrap, acks="all") as producer:
        for i in range(4):
            await producer.send("div", f"new{i}".encode(), partition=p)
    state.start(leader)
    state.save()
    state.wait_ready([leader])
    await wait_for(lambda: _isr_has(state, "div", p, 2), 30, f"broker {leader} to rejoin the ISR")
    views = {b: await partition_view(state, b, "div", p) for b in (leader, follower)}
    leo = views[follower]["log_end_offset"]
    assert views[leader]["log_end_offset"] == leo
    assert segment_bytes(state, leader, "div", p) == segment_bytes(state, follower, "div", p)
    values = [r.value for r in await read_all(state.bootstrap, "div", p, leo)]
    # A paused follower may still receive the response to a fetch that was already in
    # flight, so it can hold the first acks=1 record; it can never hold all three.
    kept = values[5:-4]
    assert values[:5] == [f"both{i}".encode() for i in range(5)]
    assert values[-4:] == [f"new{i}".encode() for i in range(4)]
    assert kept == [f"lost{i}".encode() for i in range(len(kept))] and len(kept) < 3
    log = (state.data_dir / f"broker-{leader}" / "broker.log").read_text()
    assert "follower_truncating_to_leader" in log


async def _leader_is(state, topic, partition, broker):
    return await leader_of(state, topic, partition) == broker
