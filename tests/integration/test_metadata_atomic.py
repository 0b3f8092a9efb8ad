"""A metadata change commits whole or not at all, and a big one does not depose the controller.

Real broker processes (`cluster up`'s launcher). Every broker's own Metadata answer is read,
not a client's merged view: each broker applies the metadata log on its own.
"""

from __future__ import annotations

import time

import pytest
import trio

from minibroker.client import Admin, NewTopic
from minibroker.deploy.cluster import ClusterError
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, KafkaError, error_class

from .cluster_helpers import wait_for
from .test_controller_quorum import active_controller, quorum_views

pytestmark = pytest.mark.integration

BROKERS = [0, 1, 2]


async def partition_counts(state, topic: str) -> dict[int, int]:
    """How many partitions of ``topic`` each broker's own metadata has (0: none)."""
    counts = {}
    for b in BROKERS:
        async with Admin(f"{state.host}:{state.port(b)}") as admin:
            body = await admin._open().request(b, ApiKey.METADATA, {"topics": [topic]})
        [entry] = [t for t in body["topics"] if t["name"] == topic]
        counts[b] = len(entry.get("partitions") or ())
    return counts


async def test_a_create_cut_by_kill_9_of_the_controller_is_absent_or_whole_everywhere(
    cluster_factory,
):
    """kill -9 of the active controller 100, 300 and 600 ms into a 1,000-partition RF 1
    create: afterwards the topic has 0 or 1,000 partitions on every broker, the same on
    all, and never anything else at any moment we look (before: 499 of 1,000, for good)."""
    state = await cluster_factory(3)
    outcomes = {}
    for delay in (0.1, 0.3, 0.6):
        name = f"cut{int(delay * 1000)}"
        controller, _ = await wait_for(
            lambda: active_controller(state, BROKERS), 30, "a controller"
        )

        async def create(name=name) -> None:
            try:
                async with Admin(state.bootstrap) as admin:
                    await admin.create_topics(
                        [NewTopic(name, 1000, 1)], wait_for_leaders=False, timeout_ms=10000
                    )
            except KafkaError:
                pass  # the controller died under it: the outcome is what the brokers show

        async with trio.open_nursery() as nursery:
            nursery.start_soon(create)
            await trio.sleep(delay)  # the fault's schedule, not a wait for an outcome
            state.kill(controller)
            nursery.cancel_scope.deadline = trio.current_time() + 30

        async def restarted(controller=controller) -> bool:
            try:
                state.restart(controller)
            except ClusterError:  # its port is not free again yet
                return False
            return True

        await wait_for(restarted, 30, f"broker {controller} to restart")

        async def settled(name=name) -> dict | None:
            counts = await partition_counts(state, name)
            assert set(counts.values()) <= {0, 1000}, f"{name} is half made: {counts}"
            views = await quorum_views(state, BROKERS)
            caught_up = len(views) == 3 and len({v["applied"] for v in views.values()}) == 1
            return counts if caught_up and len(set(counts.values())) == 1 else None

        counts = await wait_for(settled, 60, f"every broker to agree on {name}")
        outcomes[delay] = counts[0]
    print(f"partitions after kill -9 at 100/300/600 ms: {outcomes}")


async def test_a_2000_topic_and_a_10000_partition_create_elect_nobody(cluster_factory):
    """Each request is one change and the brokers take it up in slices, so the quorum
    keeps its epoch and its controller (before: a 2,000-topic create held the controller's
    loop ~4 s, 9 elections in 30 s, NOT_CONTROLLER for every topic). One partition past
    controller.max.partitions.per.request is refused naming the key."""
    state = await cluster_factory(3)
    controller, view = await wait_for(lambda: active_controller(state, BROKERS), 30, "a controller")
    epoch = view["epoch"]
    async with Admin(state.bootstrap) as admin:
        t0 = time.monotonic()
        many = await admin.create_topics(
            [NewTopic(f"t{i}", 1, 1) for i in range(2000)], raise_errors=False, timeout_ms=60000
        )
        many_s = time.monotonic() - t0
        t0 = time.monotonic()
        big = await admin.create_topics(
            [NewTopic("big", 10000, 1)], wait_for_leaders=False, timeout_ms=60000
        )
        big_s = time.monotonic() - t0
        with pytest.raises(
            error_class(ErrorCode.POLICY_VIOLATION),
            match=r"controller\.max\.partitions\.per\.request",
        ):
            await admin.create_topics([NewTopic("huge", 10001, 1)])
    assert list(many.values()) == [None] * 2000 and big == {"big": None}

    async def whole_everywhere() -> bool:
        return set((await partition_counts(state, "big")).values()) == {10000}

    t0 = time.monotonic()
    await wait_for(whole_everywhere, 180, "every broker to take up the 10,000 partitions")
    print(
        f"2,000 topics created (leaders known) in {many_s:.2f}s; 10,000 partitions "
        f"committed in {big_s:.2f}s, taken up by every broker {time.monotonic() - t0:.1f}s later"
    )
    views = await quorum_views(state, BROKERS)
    assert {b: (v["epoch"], v["leader_id"]) for b, v in views.items()} == {
        b: (epoch, controller) for b in BROKERS
    }, f"an election happened: epoch {epoch} -> {views}"
