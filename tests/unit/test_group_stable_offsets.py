"""A read_committed consumer's OffsetFetch asks require_stable and waits out a transaction
that holds the group's offsets (KIP-447, as Kafka's ConsumerCoordinator): the real
GroupMembership over the scripted coordinator of test_group_stale_answers, on trio's
autojump clock."""

from __future__ import annotations

import pytest
import trio

from minibroker.client.config import load_config
from minibroker.client.group import GroupMembership
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, UnstableOffsetCommit

from .test_group_stale_answers import TP0, Transport


def member(transport: Transport, isolation: str) -> GroupMembership:
    config = load_config("consumer", {"group.id": "g", "isolation.level": isolation})
    return GroupMembership(transport, config, lambda *a, **k: None)  # type: ignore[arg-type]


def offsets(code: ErrorCode, offset: int = -1) -> dict:
    partition = {"partition": 0, "committed_offset": offset, "metadata": None}
    return {
        "error_code": 0,
        "topics": [{"name": "t", "partitions": [{**partition, "error_code": int(code)}]}],
    }


async def test_read_committed_waits_until_the_transaction_holding_the_offsets_ends(
    autojump_clock,
):
    transport = Transport()
    group = member(transport, "read_committed")
    found = {}

    async def fetch() -> None:
        found.update(await group.committed([TP0]))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(fetch)
        asked = await transport.next(ApiKey.OFFSET_FETCH)
        assert asked.body["require_stable"] is True
        for _ in range(3):  # the transaction is still open
            answered_at = trio.current_time()
            asked.answer(**offsets(ErrorCode.UNSTABLE_OFFSET_COMMIT))
            asked = await transport.next(ApiKey.OFFSET_FETCH)
            assert trio.current_time() - answered_at >= group.config["retry.backoff.ms"] / 1000
            assert found == {}
        asked.answer(**offsets(ErrorCode.NONE, 42))  # it committed
    assert found == {TP0: 42}


async def test_read_uncommitted_does_not_ask_for_stable_offsets(autojump_clock):
    transport = Transport()
    group = member(transport, "read_uncommitted")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(group.committed, [TP0])
        asked = await transport.next(ApiKey.OFFSET_FETCH)
        assert "require_stable" not in asked.body
        asked.answer(**offsets(ErrorCode.NONE, 7))


async def test_an_offset_held_past_the_timeout_raises_unstable_offset_commit(autojump_clock):
    transport = Transport()
    group = member(transport, "read_committed")

    async def coordinator() -> None:
        while True:
            (await transport.next(ApiKey.OFFSET_FETCH)).answer(
                **offsets(ErrorCode.UNSTABLE_OFFSET_COMMIT)
            )

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator)
        with pytest.raises(UnstableOffsetCommit, match="t-0"):
            await group.committed([TP0], timeout=5)
        nursery.cancel_scope.cancel()
    assert 4.8 <= trio.current_time() - started <= 5.2
