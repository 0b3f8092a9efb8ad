"""Answers that outlive their generation (issue 35): a heartbeat, SyncGroup or OffsetCommit
answer that arrives after a join started or finished, or after the generation was reset,
is ignored, as Kafka's consumer does (AbstractCoordinator's ``generationUnchanged()``).

The GroupMembership under test is the real one; only the transport is scripted: each
request waits in ``Transport.asked`` until the test answers it, so every interleaving of
answers is chosen by the test. Time is trio's autojump MockClock (the autojump_clock fixture).
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from minibroker.client.assignors import encode_assignment
from minibroker.client.config import load_config
from minibroker.client.group import CommitFailed, GroupMembership
from minibroker.client.records import TopicPartition
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, RebalanceInProgress

OK = int(ErrorCode.NONE)
ILLEGAL = int(ErrorCode.ILLEGAL_GENERATION)
REBALANCING = int(ErrorCode.REBALANCE_IN_PROGRESS)
TP0 = TopicPartition("t", 0)


class Request:
    def __init__(self, api_key: int, body: dict) -> None:
        self.api_key, self.body = api_key, body
        self._answered = trio.Event()
        self._answer: dict = {}

    def answer(self, **body) -> None:
        self._answer = body
        self._answered.set()

    async def wait(self) -> dict:
        await self._answered.wait()
        return self._answer


class Connection:
    versions: dict = {}  # version 0 of every API: a dynamic member needs nothing newer


class Transport:
    """A coordinator (node 0) whose every answer the test gives by hand."""

    brokers = {0: None}

    def __init__(self) -> None:
        self._send, self.asked = trio.open_memory_channel[Request](100)

    async def any_request(self, api_key: int, body: dict) -> dict:
        assert api_key == ApiKey.FIND_COORDINATOR
        return {"error_code": OK, "node_id": 0}

    async def connection(self, node: int) -> Connection:
        return Connection()

    async def request(
        self, node: int, api_key: int, body: dict, version: int = 0, timeout: float = 0
    ) -> dict:
        request = Request(api_key, body)
        await self._send.send(request)
        return await request.wait()

    async def next(self, api_key: int) -> Request:
        # (virtual time: a request that never comes fails at once instead of hanging)
        with trio.fail_after(60):
            request = await self.asked.receive()
        assert request.api_key == api_key, (ApiKey(request.api_key).name, request.body)
        return request


def member(transport: Transport, generation: int = 1) -> GroupMembership:
    config = load_config("consumer", {"group.id": "g", "max.poll.interval.ms": 600_000})
    group = GroupMembership(transport, config, lambda *a, **k: None)  # type: ignore[arg-type]
    group.member_id, group.generation, group.rejoin_needed = "m", generation, False
    return group


async def join_to(transport: Transport, generation: int) -> Request:
    """Answer the member's JoinGroup (another member leads): generation ``generation``;
    returns its SyncGroup, unanswered."""
    join = await transport.next(ApiKey.JOIN_GROUP)
    join.answer(error_code=OK, generation_id=generation, protocol_name="range",
                leader="other", member_id="m", members=[])  # fmt: skip
    return await transport.next(ApiKey.SYNC_GROUP)


def answer_sync(sync: Request, partitions: list[TopicPartition]) -> None:
    sync.answer(error_code=OK, assignment=encode_assignment(partitions))


async def test_a_heartbeat_answered_illegal_generation_after_the_join_completed_is_ignored(
    autojump_clock,
):
    transport = Transport()
    group = member(transport)
    assigned = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(group.heartbeat_loop, lambda: None)
        beat = await transport.next(ApiKey.HEARTBEAT)
        assert beat.body["generation_id"] == 1
        # The member rejoins while that heartbeat is in flight; generation 2 forms.
        nursery.start_soon(lambda: _join_into(group, assigned))
        sync = await join_to(transport, 2)
        assert sync.body["generation_id"] == 2
        # The coordinator answers the generation-1 heartbeat now that 2 is current.
        beat.answer(error_code=ILLEGAL)
        await trio.testing.wait_all_tasks_blocked()
        assert (group.generation, group.member_id, group.lost) == (2, "m", False)
        answer_sync(sync, [TP0])
        beat = await transport.next(ApiKey.HEARTBEAT)
        assert assigned == [[TP0]]
        # It is still a member of generation 2: its next heartbeat says so.
        assert (beat.body["generation_id"], beat.body["member_id"]) == (2, "m")
        assert not group.rejoin_needed
        nursery.cancel_scope.cancel()


async def test_a_heartbeat_answered_after_the_whole_join_is_ignored_too(autojump_clock):
    transport = Transport()
    group = member(transport)
    assigned = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(group.heartbeat_loop, lambda: None)
        beat = await transport.next(ApiKey.HEARTBEAT)
        nursery.start_soon(lambda: _join_into(group, assigned))
        answer_sync(await join_to(transport, 2), [TP0])
        await trio.testing.wait_all_tasks_blocked()
        assert assigned == [[TP0]]
        beat.answer(error_code=REBALANCING)  # of generation 1's rebalance, long over
        await trio.testing.wait_all_tasks_blocked()
        assert (group.generation, group.rejoin_needed, group.lost) == (2, False, False)
        nursery.cancel_scope.cancel()


async def test_a_current_heartbeat_answered_illegal_generation_still_loses_the_generation(
    autojump_clock,
):
    # The rule's other side: with no join in between, the answer is about this member.
    transport = Transport()
    group = member(transport)
    woken = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(group.heartbeat_loop, lambda: woken.append(1))
        (await transport.next(ApiKey.HEARTBEAT)).answer(error_code=ILLEGAL)
        await trio.testing.wait_all_tasks_blocked()
        assert (group.generation, group.member_id, group.lost) == (-1, "", True)
        assert group.rejoin_needed and woken == [1]
        nursery.cancel_scope.cancel()


async def test_a_sync_answer_after_the_generation_was_reset_is_not_an_assignment(autojump_clock):
    transport = Transport()
    group = member(transport)
    assigned = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _join_into(group, assigned))
        sync = await join_to(transport, 2)
        group.reset()  # e.g. the session was judged over while SyncGroup was in flight
        answer_sync(sync, [TP0])
        # The assignment of a generation this member no longer holds is not taken: it
        # joins afresh (no member id) instead of consuming without membership.
        rejoin = await transport.next(ApiKey.JOIN_GROUP)
        assert rejoin.body["member_id"] == "" and assigned == []
        rejoin.answer(error_code=OK, generation_id=3, protocol_name="range", leader="other",
                      member_id="m2", members=[])  # fmt: skip
        answer_sync(await transport.next(ApiKey.SYNC_GROUP), [TopicPartition("t", 1)])
    assert assigned == [[TopicPartition("t", 1)]] and group.generation == 3


async def test_a_stale_sync_refusal_keeps_the_new_membership(autojump_clock):
    # SyncGroup of generation 2 refused ILLEGAL_GENERATION after the member's id changed:
    # the refusal is not about the new id, so it is not thrown away; the member rejoins.
    transport = Transport()
    group = member(transport)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _join_into(group, []))
        sync = await join_to(transport, 2)
        group.member_id = "m-new"  # a MEMBER_ID_REQUIRED-style reassignment, for example
        sync.answer(error_code=ILLEGAL, assignment=b"")
        rejoin = await transport.next(ApiKey.JOIN_GROUP)
        assert rejoin.body["member_id"] == "m-new"
        nursery.cancel_scope.cancel()


async def test_a_commit_refused_after_a_rebalance_is_retriable_and_changes_nothing(autojump_clock):
    transport = Transport()
    group = member(transport)
    outcome = []

    async def commit():
        try:
            await group.commit({TP0: 5})
        except Exception as exc:  # the test inspects which one
            outcome.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(commit)
        committing = await transport.next(ApiKey.OFFSET_COMMIT)
        assert committing.body["generation_id"] == 1
        nursery.start_soon(lambda: _join_into(group, []))
        answer_sync(await join_to(transport, 2), [TP0])
        await trio.testing.wait_all_tasks_blocked()
        committing.answer(topics=[{"name": "t", "partitions": [{"partition": 0,
                                                                 "error_code": ILLEGAL}]}])  # fmt: skip
    [exc] = outcome
    assert isinstance(exc, RebalanceInProgress) and not isinstance(exc, CommitFailed)
    assert "generation 1" in str(exc)
    assert (group.generation, group.rejoin_needed, group.lost) == (2, False, False)


async def test_a_current_commit_refusal_fails_the_commit_and_asks_for_a_rejoin(autojump_clock):
    transport = Transport()
    group = member(transport)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _answer_commit(transport, ILLEGAL))
        with pytest.raises(CommitFailed, match="t-0 refused"):
            await group.commit({TP0: 5})
    assert group.rejoin_needed


async def _answer_commit(transport: Transport, code: int) -> None:
    request = await transport.next(ApiKey.OFFSET_COMMIT)
    request.answer(topics=[{"name": "t", "partitions": [{"partition": 0, "error_code": code}]}])


async def _join_into(group: GroupMembership, assigned: list) -> None:
    assigned.append(await group.join(["t"]))
