"""ReplicaManager's triggers: which Partition change completes which delayed operation.

No sockets and no sleeping: a manual clock and timer, requests validated by the real
schema, a leader for partition t-0 with followers 1 and 2 (kafka-semantics.md §3-§5).
"""

from __future__ import annotations

import pytest

import minibroker.protocol as p
from minibroker.broker.metadata.image import PartitionState
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.protocol import encode_batch
from minibroker.protocol.errors import ErrorCode, InvalidRequest
from tests.unit.replica_helpers import manual_replica_manager


@pytest.fixture
def manager(tmp_path):
    manager = manual_replica_manager(tmp_path)
    manager.proposals = []
    manager.on_isr_change = lambda partition, isr: manager.proposals.append(sorted(isr))
    manager.host_partition("t", 0, PartitionState(0, 1, [0, 1, 2], [0, 1, 2], 1))
    yield manager
    manager.close()


def produce(manager: ReplicaManager, n: int = 3, acks: int = -1):
    rows = [(1000 + i, None, b"v", []) for i in range(n)]
    raw = {
        "acks": acks,
        "timeout_ms": 30_000,
        "topics": [{"name": "t", "partitions": [{"partition": 0, "records": encode_batch(rows)}]}],
    }
    return manager.produce(p.validate_request(p.RequestHeader(p.ApiKey.PRODUCE, 0, 1, None), raw))


def fetch(
    manager: ReplicaManager,
    replica_id: int,
    offset: int,
    max_wait_ms: int = 0,
    known_hw: int | None = None,
):
    part = {"partition": 0, "fetch_offset": offset}
    if known_hw is not None:
        part["high_watermark"] = known_hw
    raw = {
        "replica_id": replica_id,
        "max_wait_ms": max_wait_ms,
        "min_bytes": 1,
        "topics": [{"name": "t", "partitions": [part]}],
    }
    body = p.validate_request(p.RequestHeader(p.ApiKey.FETCH, 0, 1, None), raw)
    return manager.fetch(manager.fetch_request(body))


def only_partition(body: dict) -> dict:
    return body["topics"][0]["partitions"][0]


def test_acks_all_completes_when_the_last_follower_fetch_moves_the_hw(manager):
    pending = produce(manager)
    assert isinstance(pending, PendingResponse)
    fetch(manager, 1, 3)
    assert pending.body is None  # follower 2 still holds the HW
    fetch(manager, 2, 3)
    assert only_partition(pending.body)["error_code"] == ErrorCode.NONE
    assert manager.partitions[("t", 0)].high_watermark == 3


def test_a_consumer_long_poll_completes_when_the_hw_moves(manager):
    produce(manager)
    parked = fetch(manager, -1, 0, max_wait_ms=10_000)
    assert isinstance(parked, PendingResponse) and parked.body is None  # HW is 0
    fetch(manager, 1, 3)
    fetch(manager, 2, 3)
    answer = only_partition(parked.body)
    assert answer["high_watermark"] == 3 and answer["records"]


def test_losing_leadership_completes_pending_produces_with_not_leader(manager):
    pending = produce(manager)
    manager.host_partition("t", 0, PartitionState(1, 2, [0, 1, 2], [1, 2], 2))
    assert only_partition(pending.body)["error_code"] == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_an_accepted_isr_shrink_completes_the_produce_it_held(manager):
    pending = produce(manager)
    fetch(manager, 1, 3)
    manager.maybe_shrink_isr(manager.now_ms() + 60_000, 30_000)
    assert manager.proposals == [[0, 1]]  # replica 2 fell behind; 1 is caught up
    assert pending.body is None  # proposed, not yet accepted
    manager.isr_update_accepted(manager.partitions[("t", 0)], 1, [0, 1], 2)
    assert only_partition(pending.body)["error_code"] == ErrorCode.NONE


def test_a_follower_fetch_at_the_leo_proposes_it_back_into_the_isr(manager):
    partition = manager.partitions[("t", 0)]
    manager.isr_update_accepted(partition, 1, [0, 1], 2)
    produce(manager, acks=1)
    fetch(manager, 1, 3)
    fetch(manager, 2, 3)
    fetch(manager, 2, 3)
    assert manager.proposals == [[0, 1, 2], [0, 1, 2]]  # every fetch, until accepted


def test_offset_lookups_see_the_hw_as_consumers_and_the_leo_as_replicas(manager):
    produce(manager, n=4)
    fetch(manager, 1, 4)  # follower 2 has not fetched: HW 0, LEO 4

    def latest(replica_id: int) -> int:
        raw = {
            "replica_id": replica_id,
            "topics": [{"name": "t", "partitions": [{"partition": 0, "timestamp": -1}]}],
        }
        body = p.validate_request(p.RequestHeader(p.ApiKey.LIST_OFFSETS, 0, 1, None), raw)
        return only_partition(manager.list_offsets(body))["offset"]

    assert (latest(-1), latest(1)) == (0, 4)
    raw = {
        "replica_id": 1,
        "topics": [
            {
                "name": "t",
                "partitions": [
                    {"partition": 0, "leader_epoch": 0},
                    {"partition": 5, "leader_epoch": 1},
                ],
            }
        ],
    }
    body = p.validate_request(p.RequestHeader(p.ApiKey.OFFSET_FOR_LEADER_EPOCH, 0, 1, None), raw)
    known, unknown = manager.offsets_for_leader_epoch(body)["topics"][0]["partitions"]
    assert (known["leader_epoch"], known["end_offset"]) == (-1, -1)  # epoch 0 predates us
    assert unknown["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    raw["topics"][0]["partitions"] = [{"partition": 0, "leader_epoch": 1}]
    body = p.validate_request(p.RequestHeader(p.ApiKey.OFFSET_FOR_LEADER_EPOCH, 0, 1, None), raw)
    assert only_partition(manager.offsets_for_leader_epoch(body))["end_offset"] == 4


def test_a_follower_fetch_from_a_broker_that_is_no_replica_is_refused_by_name(manager):
    produce(manager, acks=1)
    answer = only_partition(fetch(manager, 7, 0))
    assert answer["error_code"] == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert "broker 7 is not a replica of t-0" in answer["error_message"]
    assert 7 not in manager.partitions[("t", 0)].replica_states


def test_identical_long_polls_share_one_answer_and_never_a_stale_one(manager):
    produce(manager)
    fetch(manager, 1, 3)
    fetch(manager, 2, 3)  # HW 3
    first, second = (fetch(manager, -1, 3, max_wait_ms=500) for _ in range(2))
    manager.fetch_purgatory.timer.clock.advance(500)
    # Both expired empty in one pass: one answer, read once and shared.
    assert first.body is second.body and only_partition(first.body)["records"] == b""
    assert only_partition(first.body)["high_watermark"] == 3
    # The log moves: the same fetch shape now reads the new state, not the shared answer.
    woken = fetch(manager, -1, 3, max_wait_ms=500)
    produce(manager)
    fetch(manager, 1, 6)
    fetch(manager, 2, 6)
    answer = only_partition(woken.body)
    assert answer["high_watermark"] == 6 and answer["records"]
    again = fetch(manager, -1, 6, max_wait_ms=500)
    manager.fetch_purgatory.timer.clock.advance(500)
    assert only_partition(again.body)["high_watermark"] == 6
    # Leadership moves: not the leader's shared answer, an error.
    manager.host_partition("t", 0, PartitionState(1, 2, [0, 1, 2], [1, 2], 2))
    moved = fetch(manager, -1, 6)
    assert only_partition(moved)["error_code"] == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_a_prepared_fetch_reads_afresh_each_time_and_a_refused_one_is_refused_again(manager):
    produce(manager)
    fetch(manager, 1, 3)
    fetch(manager, 2, 3)

    def body(offset: int, copies: int = 1) -> dict:
        raw = {
            "max_wait_ms": 0,
            "min_bytes": 1,
            "topics": [
                {"name": "t", "partitions": [{"partition": 0, "fetch_offset": offset}] * copies}
            ],
        }
        return p.validate_request(p.RequestHeader(p.ApiKey.FETCH, 0, 1, None), raw)

    # The network layer hands every sender of the same bytes one prepared request.
    at_zero = manager.fetch_request(body(0))
    assert only_partition(manager.fetch(at_zero))["records"]
    assert only_partition(manager.fetch(at_zero))["records"]
    assert only_partition(manager.fetch(manager.fetch_request(body(3))))["records"] == b""
    twice = body(0, copies=2)
    for _ in range(2):
        with pytest.raises(InvalidRequest, match="more than once"):
            manager.fetch_request(twice)


def produce_one(topic: str) -> dict:
    raw = {
        "acks": 1,
        "timeout_ms": 30_000,
        "topics": [
            {
                "name": topic,
                "partitions": [{"partition": 0, "records": encode_batch([(1, b"k", b"v", [])])}],
            }
        ],
    }
    return p.validate_request(p.RequestHeader(p.ApiKey.PRODUCE, 0, 1, None), raw)


@pytest.mark.parametrize("topic", sorted(p.INTERNAL_TOPICS))
def test_internal_topics_take_appends_only_from_internal_callers(manager, topic):
    """Kafka's appendRecords(internalTopicsAllowed): __consumer_offsets is the coordinator's,
    __minibroker_health the health check's."""
    manager.host_partition(topic, 0, PartitionState(0, 1, [0], [0], 1))
    body = produce_one(topic)
    refused = only_partition(manager.produce(body))
    assert refused["error_code"] == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert refused["error_message"] == f"Cannot append to internal topic {topic}"
    log = manager.partitions[(topic, 0)].log
    assert log.log_end_offset == 0
    accepted = only_partition(manager.produce(body, internal_topics_allowed=True))
    assert accepted["error_code"] == ErrorCode.NONE and log.log_end_offset == 1


@pytest.mark.parametrize("topic", ["bad$#!", ".", ".."])
def test_a_produce_to_an_illegal_topic_name_is_an_invalid_topic(manager, topic):
    """Not UNKNOWN_TOPIC_OR_PARTITION, which a producer retries until its timeout."""
    refused = only_partition(manager.produce(produce_one(topic)))
    assert refused["error_code"] == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert "topic name" in refused["error_message"]


def test_a_follower_that_has_everything_is_left_out_of_the_answer(manager):
    """A follower fetch that gives its HW gets no entry for a partition with no records
    for it and the same HW (FetchRequest.known_hw), and an entry as soon as either
    differs; the fetch still counts as the follower's (its LEO moves the HW)."""
    produce(manager)  # LEO 3, HW 0
    fetch(manager, 1, 3, known_hw=0)
    p = manager.partitions[("t", 0)]
    assert p.replica_states[1].log_end_offset == 3
    # Follower 2 fetches at the LEO: its fetch moves the HW to 3, so the answer names it.
    answer = fetch(manager, 2, 3, known_hw=0)
    assert only_partition(answer)["high_watermark"] == 3 and p.high_watermark == 3
    # Nothing new and the HW it has: left out.
    assert fetch(manager, 2, 3, known_hw=3) == {"topics": []}
    # An old HW, records it lacks, or no HW given: answered.
    assert only_partition(fetch(manager, 1, 3, known_hw=0))["high_watermark"] == 3
    assert only_partition(fetch(manager, 1, 0, known_hw=3))["records"] != b""
    assert only_partition(fetch(manager, 1, 3))["high_watermark"] == 3
    # Left out, the fetch still keeps the follower caught up (ISR bookkeeping).
    manager.partitions[("t", 0)].replica_states[2].last_caught_up_ms = -1
    assert fetch(manager, 2, 3, known_hw=3) == {"topics": []}
    assert p.replica_states[2].last_caught_up_ms >= 0


def test_a_parked_follower_fetch_answers_only_what_changed(manager):
    produce(manager)
    fetch(manager, 1, 3)
    fetch(manager, 2, 3)  # HW 3 everywhere
    parked = fetch(manager, 1, 3, max_wait_ms=10_000, known_hw=3)
    assert isinstance(parked, PendingResponse) and parked.body is None
    produce(manager, 2)
    assert only_partition(parked.body)["records"] != b""
