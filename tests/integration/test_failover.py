"""Leader failover by the controller, and truncation by leader epoch on the way back."""

from __future__ import annotations

import signal
import time

import pytest

from client import Admin, Consumer, NewTopic, Producer

from .cluster_helpers import isr_of, partition_view, segment_bytes, wait_for

pytestmark = pytest.mark.integration

FAST = {
    "broker.session.timeout.ms": 1500,
    "broker.heartbeat.interval.ms": 200,
    "replica.fetch.backoff.ms": 50,
}


async def leader_of(state, topic, partition):
    async with Admin(state.bootstrap) as admin:
        return (await admin.describe_topics([topic]))[topic].partitions[partition].leader


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
    assert await leader_of(state, "fo", 1) == 1  # broker 0 is the controller: kill another
    acked = []
    settings = {"delivery.timeout.ms": 30000, "request.timeout.ms": 2000, "retry.backoff.ms": 50}
    async with Producer(state.bootstrap, acks="all", **settings) as producer:
        for i in range(50):
            acked.append((await producer.send("fo", f"a{i}".encode(), partition=1)).offset)
        state.kill(1)
        t0 = time.monotonic()
        # The client retries through the failover: these land on the new leader.
        for i in range(50, 100):
            acked.append((await producer.send("fo", f"a{i}".encode(), partition=1)).offset)
        failover_s = time.monotonic() - t0
    new_leader = await leader_of(state, "fo", 1)
    assert new_leader in (0, 2)
    assert failover_s < 1.5 + 10
    assert acked == sorted(acked) and len(set(acked)) == 100
    records = await read_all(state.bootstrap, "fo", 1, 100)
    assert [r.value for r in records] == [f"a{i}".encode() for i in range(100)]
    assert [r.offset for r in records] == acked

    state.start(1)
    state.save()
    state.wait_ready([1])
    await wait_for(
        lambda: _isr_has(state, "fo", 1, 3), 30, "the restarted broker to rejoin the ISR"
    )
    await wait_for(lambda: _replicas_agree(state, "fo", 1), 30, "replicas to agree")


async def _isr_has(state, topic, partition, count):
    return len(await isr_of(state, topic, partition)) == count


async def _replicas_agree(state, topic, partition):
    views = [await partition_view(state, b, topic, partition) for b in range(state.brokers)]
    if len({v["log_end_offset"] for v in views if v}) != 1:
        return False
    return len({segment_bytes(state, b, topic, partition) for b in range(state.brokers)}) == 1


async def test_unreplicated_suffix_of_a_dead_leader_is_truncated(cluster_factory):
    # Broker 1 leads, broker 2 follows; a long lag time keeps 2 in the ISR while paused.
    state = await cluster_factory(3, {**FAST, "replica.lag.time.max.ms": 30000})
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic("div", 2, 2)])
    assert await leader_of(state, "div", 1) == 1
    async with Producer(state.bootstrap, acks="all") as producer:
        for i in range(5):
            await producer.send("div", f"both{i}".encode(), partition=1)
    state.signal(2, signal.SIGSTOP)
    try:
        async with Producer(state.bootstrap, acks=1, **{"linger.ms": 0}) as producer:
            for i in range(3):
                await producer.send("div", f"lost{i}".encode(), partition=1)
        assert (await partition_view(state, 1, "div", 1))["log_end_offset"] == 8
        state.kill(1)
    finally:
        state.signal(2, signal.SIGCONT)
    await wait_for(lambda: _leader_is(state, "div", 1, 2), 30, "broker 2 to lead div-1")
    async with Producer(state.bootstrap, acks="all") as producer:
        for i in range(4):
            await producer.send("div", f"new{i}".encode(), partition=1)
    state.start(1)
    state.save()
    state.wait_ready([1])
    await wait_for(lambda: _isr_has(state, "div", 1, 2), 30, "broker 1 to rejoin the ISR")
    views = {b: await partition_view(state, b, "div", 1) for b in (1, 2)}
    leo = views[2]["log_end_offset"]
    assert views[1]["log_end_offset"] == leo
    assert segment_bytes(state, 1, "div", 1) == segment_bytes(state, 2, "div", 1)
    values = [r.value for r in await read_all(state.bootstrap, "div", 1, leo)]
    # A paused follower may still receive the response to a fetch that was already in
    # flight, so it can hold the first acks=1 record; it can never hold all three.
    kept = values[5:-4]
    assert values[:5] == [f"both{i}".encode() for i in range(5)]
    assert values[-4:] == [f"new{i}".encode() for i in range(4)]
    assert kept == [f"lost{i}".encode() for i in range(len(kept))] and len(kept) < 3
    assert (
        "follower_truncating_to_leader" in (state.data_dir / "broker-1" / "broker.log").read_text()
    )


async def _leader_is(state, topic, partition, broker):
    return await leader_of(state, topic, partition) == broker
