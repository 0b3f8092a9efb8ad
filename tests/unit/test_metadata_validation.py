"""Metadata documents are checked before use; the controller answers once its records commit."""

from __future__ import annotations

import copy
import json

import pytest
import structlog

from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.controller.controller import METADATA_FILE, Controller
from minibroker.broker.metadata.check import MetadataError, check_document
from minibroker.broker.metadata.image import (
    BrokerInfo,
    ClusterMetadata,
    MetadataStoreError,
    epoch_regression,
    load_metadata,
    save_metadata,
)
from minibroker.broker.metadata.records import decode_change
from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol.errors import ErrorCode

LOG = structlog.get_logger("test")


def good() -> dict:
    return {
        "controller_id": 0,
        "epoch": 7,
        "brokers": [{"node_id": i, "host": "127.0.0.1", "port": 9092 + i} for i in range(3)],
        "live_brokers": [0, 1, 2],
        "topics": [
            {
                "name": "orders",
                "configs": {},
                "partitions": [
                    {
                        "leader": 0,
                        "leader_epoch": 2,
                        "replicas": [0, 1, 2],
                        "isr": [0, 1],
                        "partition_epoch": 3,
                    }
                ],
            }
        ],
    }


def broken(path: str, value) -> dict:
    """``good()`` with one field replaced: ``broken("topics.0.name", "x")``."""
    doc = good()
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return doc


def test_a_sound_document_round_trips():
    md = ClusterMetadata.parse(good())
    assert md.epoch == 7 and md.topics["orders"].partitions[0].isr == [0, 1]
    assert ClusterMetadata.parse(md.to_json()).to_json() == md.to_json()


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("topics.0.name", "../../../x/pwned", "topics[0].name"),
        ("topics.0.name", "zz/../orders", "topics[0].name"),
        ("topics.0.name", "..", "topics[0].name"),
        ("topics.0.name", "", "topics[0].name"),
        ("topics.0.partitions.0.replicas", [0, 1, 7], "not registered"),
        ("topics.0.partitions.0.replicas", [0, 0, 1], "duplicate"),
        ("topics.0.partitions.0.replicas", [], "replicas: empty"),
        ("topics.0.partitions.0.isr", [0, 5], "not replicas"),
        ("topics.0.partitions.0.leader", 5, "not a replica"),
        ("topics.0.partitions.0.leader_epoch", -3, "negative"),
        ("topics.0.partitions.0.leader_epoch", "7", "expected int32, got str"),
        ("topics.0.partitions.0.leader_epoch", True, "expected int32, got bool"),
        ("topics.0.partitions.0.leader_epoch", 2**40, "outside"),
        ("topics.0.partitions", [], "no partitions"),
        ("epoch", "7", "epoch: expected int64"),
        ("epoch", -1, "negative"),
        ("live_brokers", [0, 9], "not registered"),
        ("brokers.1.node_id", 0, "duplicate"),
        ("brokers.1.host", "", "host: empty"),
        ("brokers.1.port", 70000, "port"),
    ],
)
def test_bad_documents_are_refused_naming_the_field(path, value, named):
    with pytest.raises(MetadataError, match=None) as info:
        ClusterMetadata.parse(broken(path, value))
    assert named in str(info.value)


def test_missing_fields_unknown_fields_and_non_objects_are_refused():
    doc = good()
    del doc["topics"][0]["partitions"][0]["replicas"]
    with pytest.raises(MetadataError, match="missing field 'replicas'"):
        check_document(doc)
    with pytest.raises(MetadataError, match="unknown field"):
        check_document({**good(), "extra": 1})
    for bad in ([], "x", None, 3):
        with pytest.raises(MetadataError, match="expected map"):
            check_document(bad)
    twice = good()
    twice["topics"].append(copy.deepcopy(twice["topics"][0]))
    with pytest.raises(MetadataError, match="appears twice"):
        check_document(twice)


def test_epochs_may_not_go_backwards():
    old = ClusterMetadata.parse(good())
    assert epoch_regression(old, ClusterMetadata.parse(good())) is None
    lower = ClusterMetadata.parse(broken("topics.0.partitions.0.leader_epoch", 1))
    assert "leader_epoch 1 is below the current 2" in epoch_regression(old, lower)
    lower = ClusterMetadata.parse(broken("topics.0.partitions.0.partition_epoch", 0))
    assert "partition_epoch" in epoch_regression(old, lower)


# --- the persisted file -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (b"[1, 2, 3]", "expected map, got list"),
        (json.dumps(broken("epoch", "7")).encode(), "epoch: expected int64, got str"),
        (json.dumps({"epoch": 1}).encode(), "missing field"),
        (json.dumps(good()).encode()[:-40], "not valid JSON"),
        (b"", "not valid JSON"),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
        (json.dumps(broken("topics.0.name", "../../x")).encode(), "topics[0].name"),
    ],
)
def test_corrupt_metadata_file_is_one_line_naming_file_and_problem(tmp_path, content, named):
    path = tmp_path / METADATA_FILE
    path.write_bytes(content)
    with pytest.raises(MetadataStoreError) as info:
        load_metadata(path)
    message = str(info.value)
    assert str(path) in message and named in message
    assert "\n" not in message


def test_metadata_file_round_trips_and_absent_is_none(tmp_path):
    path = tmp_path / METADATA_FILE
    assert load_metadata(path) is None
    md = ClusterMetadata.parse(good())
    save_metadata(path, md)
    assert load_metadata(path).to_json() == md.to_json()


# --- answered once committed ----------------------------------------------------------


class Submitted(list):
    """Stands in for the quorum: records the appended batches, answers later."""

    def __call__(self, records: list[bytes], answer: dict, lost=None) -> PendingResponse:
        pending = PendingResponse()
        self.append((records, answer, pending))
        self.lost = lost
        return pending


@pytest.fixture
def controller():
    submitted = Submitted()
    ctl = Controller(0, BrokerConfig(), LOG, ClusterMetadata(), submitted)
    for i in (0, 1, 2):
        ctl.register_broker(BrokerInfo(i, "127.0.0.1", 9092 + i), {})
    ctl.create_topics(
        [{"name": "orders", "num_partitions": 2, "replication_factor": 3, "configs": {}}]
    )
    submitted.clear()
    return ctl, submitted


def test_a_change_is_answered_only_when_its_records_commit(controller):
    ctl, submitted = controller
    answer = ctl.create_topics(
        [
            {"name": "new", "num_partitions": 1, "replication_factor": 1, "configs": {}},
            {"name": "orders", "num_partitions": 1, "replication_factor": 1, "configs": {}},
        ]
    )
    assert isinstance(answer, PendingResponse) and answer.body is None
    [(records, body, pending)] = submitted
    [entry] = records  # one change, one log entry
    assert [r["type"] for r in decode_change(entry)] == ["Topic", "Partition"]
    assert [t["error_code"] for t in body["topics"]] == [0, ErrorCode.TOPIC_ALREADY_EXISTS]
    assert pending is answer


def test_a_request_that_changes_nothing_is_answered_at_once(controller):
    ctl, submitted = controller
    answer = ctl.create_topics(
        [{"name": "orders", "num_partitions": 1, "replication_factor": 1, "configs": {}}]
    )
    assert answer["topics"][0]["error_code"] == ErrorCode.TOPIC_ALREADY_EXISTS
    assert ctl.broker_alive(1, {"error_code": 0}) == {"error_code": 0}
    assert submitted == []


def test_committed_metadata_object_is_never_mutated(controller):
    ctl, _ = controller
    committed = ctl.metadata
    snapshot = committed.to_json()
    ctl.fence(2, reason="test")
    assert ctl.metadata is not committed
    assert committed.to_json() == snapshot  # brokers holding it saw no half-made change
    assert 2 not in ctl.metadata.live


def test_a_create_over_the_partition_limit_is_refused_whole_naming_the_key():
    submitted = Submitted()
    config = BrokerConfig({"controller.max.partitions.per.request": 100})
    ctl = Controller(0, config, LOG, ClusterMetadata(), submitted)
    ctl.register_broker(BrokerInfo(0, "127.0.0.1", 9092), {})
    submitted.clear()
    answer = ctl.create_topics(
        [
            {"name": "a", "num_partitions": 60, "replication_factor": 1, "configs": {}},
            {"name": "b", "num_partitions": 41, "replication_factor": 1, "configs": {}},
        ]
    )
    assert [t["error_code"] for t in answer["topics"]] == [ErrorCode.POLICY_VIOLATION] * 2
    assert "controller.max.partitions.per.request=100" in answer["topics"][0]["error_message"]
    assert submitted == [] and ctl.metadata.topics == {}  # nothing appended, nothing made
    ctl.create_topics(
        [{"name": "a", "num_partitions": 100, "replication_factor": 1, "configs": {}}]
    )
    assert len(submitted) == 1  # at the limit: one change


def test_a_create_whose_controller_is_deposed_answers_timed_out_not_not_controller(controller):
    """NOT_CONTROLLER would make the forwarding broker send it to the next controller,
    which may already have the change: the outcome is unknown, so REQUEST_TIMED_OUT."""
    ctl, submitted = controller
    ctl.create_topics([{"name": "x", "num_partitions": 1, "replication_factor": 1, "configs": {}}])
    [topic] = submitted.lost["topics"]
    assert topic["name"] == "x" and topic["error_code"] == ErrorCode.REQUEST_TIMED_OUT
    assert "may still commit" in topic["error_message"]
