"""ISR expansion on an idle partition: Kafka's maybeExpandIsr runs on every follower fetch.

A follower that is paused long enough to leave the ISR and then resumed fetches at
the leader's log end straight away, so its fetch offset never *changes*. The leader
must still readmit it on that fetch (and retry a proposal the controller rejected),
or the ISR stays short until somebody writes a record.
"""

from __future__ import annotations

import signal

import pytest

from minibroker.client import Admin, NewTopic, Producer

from .cluster_helpers import isr_of, wait_for

pytestmark = pytest.mark.integration

LAG_MS = 600
FAST = {
    "replica.lag.time.max.ms": LAG_MS,
    "broker.session.timeout.ms": 60000,  # paused brokers must not be fenced: only the ISR moves
    "replica.fetch.backoff.ms": 50,
}


async def test_paused_followers_rejoin_isr_without_new_writes(cluster_factory):
    # Five brokers: a partition whose replicas leave out the active controller (its ISR
    # proposals travel over the network and can be in flight or rejected) and broker 0
    # (where reads bootstrap), and the metadata quorum keeps its majority (3 of 5) while
    # both its followers are paused.
    state = await cluster_factory(5, FAST)

    async def all_registered():
        async with Admin(state.bootstrap) as admin:
            return len((await admin.describe_cluster())[0]) == 5

    await wait_for(all_registered, 15, "all five brokers to register")
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic("idle", 10, 3)])
        described = (await admin.describe_topics(["idle"]))["idle"]
        controller = (await admin.describe_cluster())[1]
    index, part = next(
        (i, p) for i, p in enumerate(described.partitions) if not {0, controller} & set(p.replicas)
    )
    leader = part.leader
    followers = [b for b in part.replicas if b != leader]
    async with Producer(state.bootstrap, acks="all") as producer:
        for i in range(5):
            await producer.send("idle", f"r{i}".encode(), partition=index)

    for b in followers:
        state.signal(b, signal.SIGSTOP)
    try:
        # One acks=1 write moves the leader's log end past the paused followers, so they
        # fall out of the ISR after replica.lag.time.max.ms (caught-up replicas never do).
        async with Producer(state.bootstrap, acks=1) as producer:
            await producer.send("idle", b"last", partition=index)

        async def shrunk():
            return await isr_of(state, "idle", index) == [leader]

        await wait_for(shrunk, LAG_MS / 1000 + 10, "the ISR to shrink to the leader alone")
    finally:
        for b in followers:
            state.signal(b, signal.SIGCONT)

    # Nothing is written from here on: both followers catch up with one fetch each, after
    # which their fetch offsets stop moving; they must still come back on fetches alone.
    async def full():
        return await isr_of(state, "idle", index) == sorted(part.replicas)

    await wait_for(full, LAG_MS / 1000 + 10, "both resumed followers to rejoin the ISR")
