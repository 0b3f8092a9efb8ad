"""The Kafka listener's incremental fetch sessions (KIP-227): the cache's state machine,
driven with Fetch request bodies and Kafka-shaped answers, on a manual clock."""

from __future__ import annotations

from minibroker.broker.common.clock import ManualClock
from minibroker.broker.kafka.fetch_session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    FetchSessionCache,
    next_epoch,
)
from minibroker.protocol.errors import ErrorCode


def part(index: int, offset: int = 0) -> dict:
    return {"partition": index, "fetch_offset": offset, "partition_max_bytes": 1 << 20}


def request(session_id: int, epoch: int, topics=(), forgotten=()) -> dict:
    return {
        "session_id": session_id,
        "session_epoch": epoch,
        "topics": [{"topic": t, "partitions": ps} for t, ps in topics],
        "forgotten_topics_data": [{"topic": t, "partitions": ps} for t, ps in forgotten],
    }


def fetched(context) -> list[tuple[str, int, int]]:
    return [(t["topic"], p["partition"], p["fetch_offset"]) for t in context.topics for p in t["partitions"]]  # fmt: skip


def answer(context, rows: dict[tuple[str, int], tuple[int, bytes]], error: int = 0) -> dict:
    """Answer every fetched partition: rows give (high watermark, records), default (0, b"")."""
    response = {
        "session_id": 0,
        "responses": [
            {
                "topic": t["topic"],
                "partitions": [
                    {
                        "partition_index": p["partition"],
                        "error_code": error,
                        "high_watermark": rows.get((t["topic"], p["partition"]), (0, b""))[0],
                        "log_start_offset": 0,
                        "records": rows.get((t["topic"], p["partition"]), (0, b""))[1],
                    }
                    for p in t["partitions"]
                ],
            }
            for t in context.topics
        ],
    }
    return context.answer(response)


def answered(response: dict) -> list[tuple[str, int]]:
    return [(t["topic"], p["partition_index"]) for t in response["responses"] for p in t["partitions"]]  # fmt: skip


def start(cache: FetchSessionCache, partitions: int = 3) -> tuple[int, dict]:
    """A full fetch of t-0..t-n that creates a session: (session id, its answer)."""
    context = cache.new_context(request(0, INITIAL_EPOCH, [("t", [part(i) for i in range(partitions)])]))  # fmt: skip
    response = answer(context, {})
    return response["session_id"], response


def test_a_full_fetch_creates_a_session_and_answers_every_partition():
    cache = FetchSessionCache(10, ManualClock())
    session_id, response = start(cache)
    assert session_id > 0
    assert answered(response) == [("t", 0), ("t", 1), ("t", 2)]
    assert cache.stats() == {"sessions": 1, "partitions_cached": 3, "created": 1, "evictions": 0}


def test_a_sessionless_fetch_creates_nothing_and_closes_the_named_session():
    cache = FetchSessionCache(10, ManualClock())
    context = cache.new_context(request(0, FINAL_EPOCH, [("t", [part(0)])]))
    assert answer(context, {})["session_id"] == 0
    session_id, _ = start(cache)
    context = cache.new_context(request(session_id, FINAL_EPOCH, [("t", [part(0)])]))
    assert answer(context, {})["session_id"] == 0
    assert cache.stats()["sessions"] == 0


def test_an_incremental_fetch_reads_the_whole_session_and_answers_only_news():
    cache = FetchSessionCache(10, ManualClock())
    session_id, _ = start(cache)
    # Only t-1 moved (the client read records there); the session supplies t-0 and t-2.
    context = cache.new_context(request(session_id, 1, [("t", [part(1, 5)])]))
    assert context.error == ErrorCode.NONE
    assert fetched(context) == [("t", 0, 0), ("t", 1, 5), ("t", 2, 0)]
    response = answer(context, {("t", 2): (7, b"records")})
    assert response["session_id"] == session_id
    # t-2 has records and a new high watermark; t-0 and t-1 are unchanged: left out.
    assert answered(response) == [("t", 2)]
    # t-2 returned records: it moves to the back of the fetch order.
    context = cache.new_context(request(session_id, 2, [("t", [part(2, 7)])]))
    assert fetched(context) == [("t", 0, 0), ("t", 1, 5), ("t", 2, 7)]
    assert answered(answer(context, {("t", 2): (7, b"")})) == []


def test_records_move_a_partition_to_the_back_of_the_fetch_order():
    cache = FetchSessionCache(10, ManualClock())
    session_id, _ = start(cache)
    context = cache.new_context(request(session_id, 1))
    answer(context, {("t", 0): (3, b"r")})
    context = cache.new_context(request(session_id, 2, [("t", [part(0, 3)])]))
    assert [p for _, p, _ in fetched(context)] == [1, 2, 0]


def test_errors_are_always_answered_and_again_once_they_clear():
    cache = FetchSessionCache(10, ManualClock())
    session_id, _ = start(cache, 1)
    context = cache.new_context(request(session_id, 1))
    assert answered(answer(context, {}, error=ErrorCode.NOT_LEADER_OR_FOLLOWER)) == [("t", 0)]
    context = cache.new_context(request(session_id, 2))
    assert answered(answer(context, {}, error=ErrorCode.NOT_LEADER_OR_FOLLOWER)) == [("t", 0)]
    context = cache.new_context(request(session_id, 3))
    assert answered(answer(context, {})) == [("t", 0)]  # the error cleared: news too
    context = cache.new_context(request(session_id, 4))
    assert answered(answer(context, {})) == []


def test_forgotten_partitions_leave_the_session_and_the_last_one_closes_it():
    cache = FetchSessionCache(10, ManualClock())
    session_id, _ = start(cache, 2)
    context = cache.new_context(request(session_id, 1, forgotten=[("t", [0])]))
    assert fetched(context) == [("t", 1, 0)]
    assert answer(context, {})["session_id"] == session_id
    assert cache.stats()["partitions_cached"] == 1
    context = cache.new_context(request(session_id, 2, forgotten=[("t", [1])]))
    assert fetched(context) == []
    assert answer(context, {})["session_id"] == 0
    assert cache.stats()["sessions"] == 0


def test_added_partitions_join_the_session():
    cache = FetchSessionCache(10, ManualClock())
    session_id, _ = start(cache, 1)
    context = cache.new_context(request(session_id, 1, [("u", [part(0, 9)])]))
    assert fetched(context) == [("t", 0, 0), ("u", 0, 9)]
    assert answered(answer(context, {})) == [("u", 0)]  # new: its watermark is news


def test_an_unknown_session_and_a_wrong_epoch_are_refused():
    cache = FetchSessionCache(10, ManualClock())
    session_id, _ = start(cache)
    context = cache.new_context(request(session_id + 1, 1))
    assert context.error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert answer(context, {}) == {
        "error_code": ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
        "session_id": 0,
        "responses": [],
    }
    context = cache.new_context(request(session_id, 2))
    assert context.error == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    # The right epoch still works: a refused request does not advance the session.
    assert cache.new_context(request(session_id, 1)).error == ErrorCode.NONE


def test_a_parked_fetch_overtaken_by_the_next_epoch_answers_invalid_epoch():
    cache = FetchSessionCache(10, ManualClock())
    session_id, _ = start(cache)
    parked = cache.new_context(request(session_id, 1))
    retry = cache.new_context(request(session_id, 2))
    assert answer(parked, {})["error_code"] == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert answer(retry, {}).get("error_code", 0) == 0


def test_a_full_fetch_naming_a_session_closes_it_and_starts_another():
    cache = FetchSessionCache(10, ManualClock())
    session_id, _ = start(cache)
    context = cache.new_context(request(session_id, INITIAL_EPOCH, [("t", [part(0)])]))
    new_id = answer(context, {})["session_id"]
    assert new_id not in (0, session_id)
    assert list(cache.sessions) == [new_id]


def test_a_full_cache_evicts_a_stale_session_first():
    clock = ManualClock()
    cache = FetchSessionCache(2, clock, eviction_ms=1000)
    first, _ = start(cache, 5)
    clock.advance(10)
    second, _ = start(cache, 5)
    # Full, nothing idle long enough, nothing old enough: no session for the newcomer.
    assert start(cache, 9)[0] == 0
    clock.advance(995)  # first idle for 1005 ms, second for 995 ms
    third, _ = start(cache, 1)
    assert third != 0 and set(cache.sessions) == {second, third} and first not in cache.sessions
    assert cache.stats()["evictions"] == 1


def test_a_full_cache_evicts_a_smaller_settled_session_for_a_bigger_one():
    clock = ManualClock()
    cache = FetchSessionCache(2, clock, eviction_ms=1000)
    small, _ = start(cache, 2)
    big, _ = start(cache, 4)
    clock.advance(1001)
    for session_id, epoch in ((small, 1), (big, 1)):  # both in use: none is stale
        answer(cache.new_context(request(session_id, epoch)), {})
    assert start(cache, 2)[0] == 0  # not bigger than the smallest: no eviction
    newcomer, _ = start(cache, 3)
    assert newcomer != 0 and set(cache.sessions) == {big, newcomer}


def test_no_slots_means_every_fetch_is_full():
    cache = FetchSessionCache(0, ManualClock())
    assert start(cache)[0] == 0


def test_epochs_wrap_past_the_maximum_to_one():
    assert next_epoch(0) == 1
    assert next_epoch((1 << 31) - 1) == 1
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH
