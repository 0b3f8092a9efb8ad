"""Fault injection, each fault on both sides of a timeout boundary."""

from __future__ import annotations

import pytest
import trio

from minibroker.client import Admin, NewTopic, Producer, TopicPartition
from minibroker.protocol import LATEST_TIMESTAMP, ApiKey
from minibroker.protocol.errors import ErrorCode, InvalidRequest, NotEnoughReplicas, RequestTimedOut

from .cluster_helpers import isr_of, wait_for

pytestmark = pytest.mark.integration

NO_RETRY = {"retries": 0, "linger.ms": 0, "delivery.timeout.ms": 40000}


async def test_replication_delay_vs_request_timeout(cluster_factory):
    state = await cluster_factory(3, {"faults.enable": True})
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic("rd", 1, 3)])
        leader = (await admin.describe_topics(["rd"]))["rd"].partitions[0].leader
        followers = [b for b in range(3) if b != leader]
        for follower in followers:
            await admin.faults(follower, "delay-replication", delay_ms=200, topic="rd")
    async with Producer(
        state.bootstrap, acks="all", **NO_RETRY, **{"request.timeout.ms": 100}
    ) as producer:
        with pytest.raises(RequestTimedOut):
            await producer.send("rd", b"too slow")
    async with Producer(
        state.bootstrap, acks="all", **NO_RETRY, **{"request.timeout.ms": 3000}
    ) as producer:
        assert (await producer.send("rd", b"in time")).offset >= 1
    async with Admin(state.bootstrap) as admin:
        for follower in followers:
            assert await admin.faults(follower, "clear") == []


async def test_dropped_replication_shrinks_then_clear_restores_the_isr(cluster_factory):
    state = await cluster_factory(3, {"faults.enable": True, "replica.lag.time.max.ms": 1000})
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic("dr", 1, 3)])
        leader = (await admin.describe_topics(["dr"]))["dr"].partitions[0].leader
        follower = max(b for b in range(3) if b != leader)
        active = await admin.faults(follower, "drop-replication", topic="dr", partition=0)
        assert active[0]["action"] == "drop-replication"
    rest = [b for b in range(3) if b != follower]
    async with Producer(
        state.bootstrap, acks="all", **NO_RETRY, **{"request.timeout.ms": 300}
    ) as producer:
        with pytest.raises(RequestTimedOut):
            await producer.send("dr", b"stuck behind the follower")
        await wait_for(lambda: _isr(state, "dr", rest), 20, "the follower to leave the ISR")
        await producer.send("dr", b"flows without the follower")
    async with Admin(state.bootstrap) as admin:
        await admin.faults(follower, "clear")
    await wait_for(lambda: _isr(state, "dr", [0, 1, 2]), 20, "the follower to rejoin the ISR")


async def _isr(state, topic, expected):
    return await isr_of(state, topic, 0) == expected


async def test_api_delay_and_api_failure(broker_factory):
    proc = broker_factory({"faults.enable": True})
    async with Admin(proc.address) as admin:
        await admin.create_topics([NewTopic("api", 1, 1)])
        await admin.faults(0, "delay-api", api_key=int(ApiKey.PRODUCE), delay_ms=1300)
    # The producer waits request.timeout.ms plus a 1 s network allowance for a response.
    async with Producer(
        proc.address, acks=1, **NO_RETRY, **{"request.timeout.ms": 100}
    ) as producer:
        with pytest.raises(RequestTimedOut):
            await producer.send("api", b"late")
    async with Producer(
        proc.address, acks=1, **NO_RETRY, **{"request.timeout.ms": 3000}
    ) as producer:
        await producer.send("api", b"on time")
    async with Admin(proc.address) as admin:
        await admin.faults(0, "clear")
        await admin.faults(
            0,
            "fail-api",
            api_key=int(ApiKey.PRODUCE),
            error_code=int(ErrorCode.NOT_ENOUGH_REPLICAS),
            count=2,
        )
    async with Producer(proc.address, acks=1, **NO_RETRY) as producer:
        with pytest.raises(NotEnoughReplicas):
            await producer.send("api", b"refused once")
    # One injected failure left: a producer that retries gets through it.
    async with Producer(proc.address, acks=1, **{"retry.backoff.ms": 10}) as producer:
        await producer.send("api", b"retried")
    async with Admin(proc.address) as admin:
        assert await admin.faults(0, "clear") == []


async def test_delay_request_handles_the_request_late_delay_api_only_answers_late(broker_factory):
    # A ListOffsets held 1.5 s before it is handled sees a record produced meanwhile;
    # one handled at once and answered 1.5 s late (delay-api) does not.
    proc = broker_factory({"faults.enable": True})
    async with Admin(proc.address) as admin, Producer(proc.address, acks=1) as producer:
        await admin.create_topics([NewTopic("late", 1, 1)])
        await producer.send("late", b"first")
        latest = {("late", 0): LATEST_TIMESTAMP}
        # (the end offset when asked: 1, then 2; the held request sees the one produced)
        for action, end in (("delay-request", 2), ("delay-api", 2)):
            await admin.faults(0, action, api_key=int(ApiKey.LIST_OFFSETS), delay_ms=1500)
            async with trio.open_nursery() as nursery:
                found = {}

                async def ask(found=found):
                    found.update(await admin.list_offsets(latest))

                nursery.start_soon(ask)
                await trio.sleep(0.3)  # the request is at the broker, held or handled
                await producer.send("late", b"while it was held")
            assert found[TopicPartition("late", 0)].offset == end, action
            await admin.faults(0, "clear")
        with pytest.raises(InvalidRequest, match="delay-request needs an api_key"):
            await admin.faults(0, "delay-request", delay_ms=10)


async def test_faults_are_refused_unless_enabled(broker):
    async with Admin(broker) as admin:
        with pytest.raises(InvalidRequest, match=r"faults\.enable=true"):
            await admin.faults(0, "drop-replication")
