"""The broker's wiring pieces: a broker built whole, the task nursery its collaborators
share, the metadata cache's controller wake-ups, and answers deferred until catch-up."""

from __future__ import annotations

import pytest
import structlog
import trio

from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.common.tasks import BackgroundTasks, NotRunningError
from minibroker.broker.metadata.cache import MetadataCache
from minibroker.broker.metadata.image import ClusterMetadata
from minibroker.broker.network.deferral import (
    CATCH_UP_WAIT_S,
    UNKNOWN_TOPIC_WAIT_S,
    RequestDeferral,
)
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.server import Broker
from minibroker.protocol.errors import ErrorCode


def test_a_broker_is_built_whole(tmp_path):
    broker = Broker(0, "127.0.0.1", 19092, tmp_path, BrokerConfig(), structlog.get_logger())
    empty = sorted(name for name, value in vars(broker).items() if value is None)
    # A lone broker has no cluster secret (nobody to trust): the one None by design.
    assert empty == ["credentials"]
    handler = broker.connections.dispatcher
    assert handler.replica_manager is broker.replica_manager and handler.link is broker.link


async def test_background_tasks_run_only_while_open():
    tasks = BackgroundTasks()
    ran = trio.Event()

    async def job() -> None:
        ran.set()

    with pytest.raises(NotRunningError):
        tasks.start_soon(job)
    async with trio.open_nursery() as nursery:
        await nursery.start(tasks.run)
        tasks.start_soon(job)
        with trio.fail_after(5):
            await ran.wait()
        nursery.cancel_scope.cancel()
    # Once shut down, a late start (a task past the cancel, not yet at a checkpoint) is
    # dropped: raising it crashed the broker's clean shutdown.
    late = trio.Event()

    async def late_job() -> None:
        late.set()

    tasks.start_soon(late_job)
    await trio.sleep(0)
    assert not late.is_set()


async def test_a_task_started_by_a_collaborator_past_the_shutdown_is_dropped():
    """The metadata publisher, back from a thread after the shutdown's cancel (no
    checkpoint yet), started a fetcher on the closed nursery: the broker's clean shutdown
    ended in a traceback. Now the start is dropped and the shutdown completes."""
    tasks = BackgroundTasks()
    tasks_ended, started_late = trio.Event(), []

    async def run_tasks(task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            await tasks.run(task_status=task_status)
        finally:
            tasks_ended.set()

    async def publisher() -> None:
        with trio.CancelScope(shield=True):  # stands in for the thread it waits on
            await tasks_ended.wait()
        tasks.start_soon(trio.sleep, 0)  # what follow() does
        started_late.append(True)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(run_tasks)
            nursery.start_soon(publisher)
            await trio.sleep(0)
            nursery.cancel_scope.cancel()
    assert started_late == [True]


async def test_a_new_controller_wakes_waiters_and_the_same_one_does_not():
    cache = MetadataCache()
    first = cache.leader_known
    cache.controller_changed(-1)  # the controller it already knows of
    assert not first.is_set() and cache.leader_known is first
    cache.controller_changed(2)
    assert first.is_set() and not cache.leader_known.is_set()
    assert cache.controller_id == 2 and cache.metadata.controller_id == 2
    cache.update(ClusterMetadata(epoch=7))
    assert cache.metadata.epoch == 7 and cache.metadata.controller_id == 2


async def test_a_held_request_is_answered_once_caught_up(nursery, autojump_clock):
    ready = trio.Event()
    deferral = RequestDeferral(nursery, ready)
    pending = deferral.after_catch_up(lambda: {"error_code": 0})
    await trio.sleep(1)
    assert pending.body is None
    ready.set()
    assert await pending.wait() == {"error_code": 0}


async def test_a_held_request_is_answered_anyway_after_the_catch_up_wait(nursery, autojump_clock):
    deferral = RequestDeferral(nursery, trio.Event())
    inner = PendingResponse()
    pending = deferral.after_catch_up(lambda: inner)
    start = trio.current_time()
    await trio.sleep(CATCH_UP_WAIT_S - 1)
    assert pending.body is None
    inner.set({"error_code": 3})
    assert await pending.wait() == {"error_code": 3}
    assert trio.current_time() - start >= CATCH_UP_WAIT_S


async def test_a_produce_for_a_topic_not_applied_yet_waits_for_the_update_that_brings_it(
    nursery, autojump_clock
):
    """RequestDeferral.after_topics_known: a held request runs at the metadata update that
    makes it known, not before; a later one of the same connection waits behind it even
    when it could go at once (ordering), and another connection's does not."""
    cache = MetadataCache()
    deferral = RequestDeferral(nursery, cache.ready, cache.updated)
    known: set[str] = set()
    ran: list[str] = []

    def hold(key: str, topic: str, name: str) -> PendingResponse | None:
        def handle() -> dict:
            ran.append(name)
            return {"error_code": 0 if topic in known else 3}

        return deferral.after_topics_known(key, lambda: topic in known, handle)

    first = hold("conn-a", "new", "first")
    second = hold("conn-a", "old", "second")  # known at once, but behind the first
    known.add("old")
    other = hold("conn-b", "old", "other")
    assert await other.wait() == {"error_code": 0}
    await trio.sleep(0.01)
    assert ran == ["other"] and first.body is None and second.body is None
    assert deferral.holding("conn-a") and not deferral.holding("conn-b")
    known.add("new")
    cache.update(ClusterMetadata(epoch=2))
    assert await first.wait() == {"error_code": 0}
    assert await second.wait() == {"error_code": 0}
    assert ran == ["other", "first", "second"]
    assert not deferral.holding("conn-a")


async def test_a_produce_for_a_topic_that_never_comes_is_answered_after_the_bound(
    nursery, autojump_clock
):
    cache = MetadataCache()
    deferral = RequestDeferral(nursery, cache.ready, cache.updated)
    start = trio.current_time()
    pending = deferral.after_topics_known("conn", lambda: False, lambda: {"error_code": 3})
    cache.update(ClusterMetadata(epoch=2))  # an update that does not bring it
    assert await pending.wait() == {"error_code": 3}
    assert trio.current_time() - start == pytest.approx(UNKNOWN_TOPIC_WAIT_S)
    # A request that gets no answer (acks=0) is held and run all the same.
    ran = trio.Event()
    assert deferral.after_topics_known("conn", lambda: True, ran.set, answered=False) is None
    with trio.fail_after(1):
        await ran.wait()


async def test_a_held_request_whose_handler_fails_is_answered_and_the_next_still_runs(nursery):
    """A failure in a deferred handler is answered UNKNOWN_SERVER_ERROR, as the socket
    server answers one handled at once, instead of escaping into the background tasks
    (the nursery would end, and the broker with it)."""
    deferral = RequestDeferral(nursery, trio.Event())

    def broken() -> dict:
        raise RuntimeError("boom")

    failed = deferral.after_topics_known("conn", lambda: True, broken)
    after = deferral.after_topics_known("conn", lambda: True, lambda: {"error_code": 0})
    with trio.fail_after(1):
        assert await failed.wait() == {
            "error_code": int(ErrorCode.UNKNOWN_SERVER_ERROR),
            "error_message": "RuntimeError: boom",
        }
        assert await after.wait() == {"error_code": 0}
    held = deferral.after_catch_up(broken)
    deferral.caught_up.set()
    with trio.fail_after(1):
        assert (await held.wait())["error_code"] == ErrorCode.UNKNOWN_SERVER_ERROR


async def test_a_delayed_answer_comes_after_its_delay(nursery, autojump_clock):
    deferral = RequestDeferral(nursery, trio.Event())
    assert deferral.delayed(500, None) is None
    start = trio.current_time()
    pending = deferral.delayed(500, {"error_code": 0})
    assert await pending.wait() == {"error_code": 0}
    assert trio.current_time() - start == pytest.approx(0.5)
