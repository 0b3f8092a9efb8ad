"""CreatePartitions on the controller (Kafka's rules): one metadata change for a request,
Kafka's codes and messages for bad input, manual assignments for the new partitions."""

from __future__ import annotations

from minibroker.broker.controller.partitions import create_partitions
from minibroker.broker.metadata.image import PartitionState, TopicState
from minibroker.broker.metadata.records import MetadataImage, encode_change
from minibroker.broker.raft import Entry
from minibroker.protocol.errors import ErrorCode
from tests.unit.test_preferred_leader import controller, metadata


def grow(name: str, count: int, assignments=None) -> dict:
    return {"name": name, "count": count, "assignments": assignments}


def codes(answer: dict) -> dict[str, int]:
    return {r["name"]: r["error_code"] for r in answer["results"]}


def two_topics():
    md = metadata([(0, [0, 1], [0, 1]), (1, [1, 2], [1, 2])])
    md.topics["u"] = TopicState("u", [PartitionState(2, 0, [2, 0], [2, 0])], {}, "uid")
    return md


def test_one_request_is_one_change_that_every_voter_applies():
    md = two_topics()
    image = MetadataImage()
    image.metadata = md.copy()
    ctl, quorum = controller(md)
    answer = create_partitions(ctl, [grow("t", 4), grow("u", 2, [[1, 0]])], False)
    assert codes(answer) == {"t": 0, "u": 0}
    [records] = quorum.batches  # one log entry for both topics
    assert [(r["topic"], r["partition"]) for r in records] == [("t", 2), ("t", 3), ("u", 1)]
    assert all(len(r["replicas"]) == 2 and r["leader"] == r["replicas"][0] for r in records)
    assert records[-1]["replicas"] == [1, 0] and records[-1]["isr"] == [1, 0]
    image.apply(Entry(0, 1, encode_change(records)))
    assert len(image.metadata.topics["t"].partitions) == 4
    assert image.metadata.topics["u"].partitions[1].replicas == [1, 0]


def test_validate_only_and_errors_change_nothing():
    ctl, quorum = controller(two_topics())
    assert codes(create_partitions(ctl, [grow("t", 5)], True)) == {"t": 0}
    refused = create_partitions(ctl, [grow("t", 2), grow("u", 0), grow("nope", 3)], False)
    assert codes(refused) == {
        "t": ErrorCode.INVALID_PARTITIONS,
        "u": ErrorCode.INVALID_PARTITIONS,
        "nope": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
    messages = {r["name"]: r["error_message"] for r in refused["results"]}
    assert messages["t"] == "Topic already has 2 partition(s)."
    assert messages["u"] == "The topic u currently has 1 partition(s); 0 would not be an increase."
    assert quorum.batches == []
    assert len(ctl.metadata.topics["t"].partitions) == 2


def test_manual_assignments_are_checked_as_kafka_does():
    md = two_topics()
    md.live = {0, 1}  # broker 2 fenced
    ctl, _ = controller(md)
    cases = {
        "only 1 assignment(s)": [[0, 1]],  # two partitions added, one list
        "no such broker": [[0, 7], [0, 1]],
        "more than once": [[0, 0], [0, 1]],
        "which have 2 replica(s)": [[0, 1, 2], [0, 1]],
        "empty replica list": [[], [0, 1]],
    }
    for why, assignments in cases.items():
        [result] = create_partitions(ctl, [grow("t", 4, assignments)], False)["results"]
        assert result["error_code"] == ErrorCode.INVALID_REPLICA_ASSIGNMENT, why
        assert why in result["error_message"]
    # Only fenced replicas: refused; one live one: it leads, alone in the ISR.
    [result] = create_partitions(ctl, [grow("u", 2, [[2, 2]])], False)["results"]
    assert result["error_code"] == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert codes(create_partitions(ctl, [grow("u", 2, [[2, 1]])], False)) == {"u": 0}
    new = ctl.metadata.topics["u"].partitions[1]
    assert (new.leader, new.replicas, new.isr) == (1, [2, 1], [1])


def test_the_per_request_cap_and_internal_topics_are_refused():
    ctl, quorum = controller(two_topics(), **{"controller.max.partitions.per.request": 5})
    over = create_partitions(ctl, [grow("t", 5), grow("u", 4)], False)
    assert codes(over) == {"t": ErrorCode.POLICY_VIOLATION, "u": ErrorCode.POLICY_VIOLATION}
    assert "controller.max.partitions.per.request=5" in over["results"][0]["error_message"]
    md = two_topics()
    md.topics["__consumer_offsets"] = TopicState(
        "__consumer_offsets", [PartitionState(0, 0, [0], [0])], {}, "cid"
    )
    ctl, quorum = controller(md)
    internal = create_partitions(ctl, [grow("__consumer_offsets", 2)], False)
    assert codes(internal) == {"__consumer_offsets": ErrorCode.INVALID_REQUEST}
    duplicate = create_partitions(ctl, [grow("t", 3), grow("t", 4)], False)
    assert codes(duplicate) == {"t": ErrorCode.INVALID_REQUEST}
    assert quorum.batches == []
