"""The idempotent producer against real brokers: a retry is stored once, in order, even
across a leader killed mid-stream (KIP-98; client/idempotence.py, broker/storage/producer_state.py)."""

from __future__ import annotations

import pytest
import trio

from minibroker.client import Admin, Consumer, NewTopic, Producer
from minibroker.protocol import ApiKey

from .cluster_helpers import leader_of, wait_for

pytestmark = pytest.mark.integration

FAST = {
    "broker.session.timeout.ms": 1500,
    "broker.heartbeat.interval.ms": 200,
    "replica.fetch.backoff.ms": 50,
}


async def read_values(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    async with Consumer(bootstrap) as consumer:
        consumer.assign([(topic, 0)])
        consumer.seek_to_beginning()
        out: list[bytes] = []
        while True:
            batch = await consumer.poll(timeout_ms=1500)
            if not batch:
                break
            out += [r.value for r in batch]
    assert len(out) >= expected, f"only {len(out)} of {expected} records readable"
    return out


async def _late_answer_retry(proc, topic: str, idempotence: bool) -> list[bytes]:
    """The broker stores the produce but answers after the client gave up on it; once the
    record is in the log the delay is lifted, so the client's retry is answered."""
    async with Admin(proc.address) as admin:
        await admin.create_topics([NewTopic(topic, 1, 1)])
        await admin.faults(0, "delay-api", api_key=int(ApiKey.PRODUCE), delay_ms=5000)
    settings = {
        "enable.idempotence": idempotence,
        "request.timeout.ms": 300,  # the client waits 0.3 s + 1 s for an answer
        "retry.backoff.ms": 50,
    }

    async def stored() -> bool:
        async with Admin(proc.address) as admin:
            stats = (await admin.broker_stats(0))["stats"]
        return any(p["topic"] == topic and p["log_end_offset"] >= 1 for p in stats["partitions"])

    async with (
        Producer(proc.address, acks="all", **settings) as producer,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(producer.send, topic, b"once")
        await wait_for(stored, 10, "the first attempt to be stored")
        async with Admin(proc.address) as admin:
            await admin.faults(0, "clear")
    return await read_values(proc.address, topic, 1)


async def test_a_produce_answered_too_late_is_retried_and_stored_once(broker_factory):
    proc = broker_factory({"faults.enable": True})
    assert await _late_answer_retry(proc, "late-idem", idempotence=True) == [b"once"]
    # The same retry without idempotence stores the record twice: what the test guards.
    assert await _late_answer_retry(proc, "late-plain", idempotence=False) == [b"once", b"once"]


async def test_leader_sigkill_mid_stream_leaves_no_duplicate_and_no_reordering(cluster_factory):
    state = await cluster_factory(3, {**FAST, "min.insync.replicas": 2})
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic("idem", 1, 3)])
    victim = await leader_of(state, "idem", 0)
    total = 3000
    settings = {
        "linger.ms": 2,
        "batch.size": 2048,  # many small batches: several in flight when the leader dies
        "request.timeout.ms": 1500,
        "delivery.timeout.ms": 60000,
        "retry.backoff.ms": 50,
    }
    async with Producer(state.bootstrap, acks="all", **settings) as producer:
        handles = []
        for i in range(total):
            handles.append(await producer.enqueue("idem", f"{i:06d}".encode(), partition=0))
            if i == total // 3:
                await handles[0]
                state.kill(victim)
        offsets = [(await h).offset for h in handles]
    assert offsets == sorted(offsets) and len(set(offsets)) == total
    values = await read_values(state.bootstrap, "idem", total)
    assert values == [f"{i:06d}".encode() for i in range(total)], (
        f"{len(values) - len(set(values))} duplicate(s); reordered: {values != sorted(values)}"
    )
