"""Metadata documents are checked before use; the controller persists before it applies."""

from __future__ import annotations

import copy
import errno
import json

import pytest
import structlog

import broker.controller as controller_module
from broker.config import BrokerConfig
from broker.controller import METADATA_FILE, Controller
from broker.metadata import (
    BrokerInfo,
    ClusterMetadata,
    MetadataStoreError,
    epoch_regression,
    load_metadata,
    save_metadata,
)
from broker.metadata_check import MetadataError, check_document
from protocol.errors import ErrorCode

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


# --- durable first ----------------------------------------------------------------------


class Published(list):
    def __call__(self, md: ClusterMetadata) -> None:
        self.append(md.to_json())


@pytest.fixture
def controller(tmp_path):
    published = Published()
    ctl = Controller(0, tmp_path, BrokerConfig(), LOG, published)
    ctl.register_self(BrokerInfo(0, "127.0.0.1", 9092))
    for i in (1, 2):
        ctl.register_broker(BrokerInfo(i, "127.0.0.1", 9092 + i))
    ctl.create_topics(
        [{"name": "orders", "num_partitions": 2, "replication_factor": 3, "configs": {}}]
    )
    published.clear()
    return ctl, published, tmp_path / METADATA_FILE


@pytest.fixture
def failing_save(monkeypatch):
    def save(path, md):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(controller_module, "save_metadata", save)


def test_failed_save_changes_nothing_and_answers_storage_error(controller, failing_save):
    ctl, published, path = controller
    before, on_disk = ctl.metadata.to_json(), path.read_bytes()
    committed = ctl.metadata

    results = ctl.create_topics(
        [
            {"name": "new", "num_partitions": 1, "replication_factor": 1, "configs": {}},
            {"name": "orders", "num_partitions": 1, "replication_factor": 1, "configs": {}},
        ]
    )
    assert results[0]["error_code"] == ErrorCode.KAFKA_STORAGE_ERROR
    assert "No space left" in results[0]["error_message"]
    assert results[1]["error_code"] == ErrorCode.TOPIC_ALREADY_EXISTS

    state = ctl.metadata.topics["orders"].partitions[0]
    answer = ctl.alter_partition(
        {
            "broker_id": state.leader,
            "topic": "orders",
            "partition": 0,
            "leader_epoch": state.leader_epoch,
            "partition_epoch": state.partition_epoch,
            "new_isr": [state.leader],
        }
    )
    assert answer["error_code"] == ErrorCode.KAFKA_STORAGE_ERROR

    with pytest.raises(controller_module.MetadataPersistError):
        ctl.fence(1, reason="test")
    with pytest.raises(controller_module.MetadataPersistError):
        ctl.register_broker(BrokerInfo(7, "10.0.0.7", 1))

    assert ctl.metadata is committed
    assert ctl.metadata.to_json() == before
    assert path.read_bytes() == on_disk
    assert published == []


def test_after_a_failed_save_the_next_change_succeeds(controller, failing_save, monkeypatch):
    ctl, published, path = controller
    epoch = ctl.metadata.epoch
    with pytest.raises(controller_module.MetadataPersistError):
        ctl.fence(1, reason="disk full")
    monkeypatch.setattr(controller_module, "save_metadata", save_metadata)
    ctl.fence(1, reason="disk back")
    assert 1 not in ctl.metadata.live and ctl.metadata.epoch == epoch + 1
    assert load_metadata(path).to_json() == ctl.metadata.to_json()
    assert [md["epoch"] for md in published] == [epoch + 1]


def test_committed_metadata_object_is_never_mutated(controller):
    ctl, _, _ = controller
    committed = ctl.metadata
    snapshot = committed.to_json()
    ctl.fence(2, reason="test")
    assert ctl.metadata is not committed
    assert committed.to_json() == snapshot  # brokers holding it saw no half-made change
    assert 2 not in ctl.metadata.live


def test_controller_refuses_to_start_on_a_corrupt_file(tmp_path):
    (tmp_path / METADATA_FILE).write_text('{"epoch": "7"}')
    with pytest.raises(MetadataStoreError, match=METADATA_FILE):
        Controller(0, tmp_path, BrokerConfig(), LOG, Published())
