"""Metadata records: the controller's changes as records, applied the same on every voter.

A real Controller makes the changes (registration, topic creation, fencing with leader
moves, unfencing, ISR changes); each published state must be exactly what applying the
records of the change to the previous state gives. Then the records go through a real
one-voter QuorumDriver: a restart rebuilds the same metadata from log and snapshot.
"""

from __future__ import annotations

import itertools

import pytest
import structlog

from minibroker.broker.common.clock import ManualClock
from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.controller.controller import Controller
from minibroker.broker.metadata.image import BrokerInfo, ClusterMetadata
from minibroker.broker.metadata.records import (
    MetadataImage,
    MetadataRecordError,
    decode_change,
    encode_change,
    records_for_change,
)
from minibroker.broker.raft import Entry
from minibroker.broker.raft.driver import QuorumDriver
from minibroker.protocol.errors import ErrorCode

LOG = structlog.get_logger("test")


def changes(tmp_path) -> list[ClusterMetadata]:
    """Every state a controller published through a busy life, oldest first."""
    states = [ClusterMetadata()]

    def submit(records: list[bytes], answer: dict, lost: dict | None = None) -> dict:
        states.append(ctl.metadata.copy())  # the draft whose records were appended
        return answer

    ctl = Controller(0, BrokerConfig(), LOG, ClusterMetadata(), submit)
    for i in (0, 1, 2):
        ctl.register_broker(BrokerInfo(i, "127.0.0.1", 9092 + i), {})
    ctl.create_topics(
        [
            {"name": "orders", "num_partitions": 3, "replication_factor": 3, "configs": {}},
            {"name": "logs", "num_partitions": 1, "replication_factor": 2, "configs": {}},
        ]
    )
    ctl.fence(1, reason="test")  # leaders move, ISRs shrink, epochs bump
    state = ctl.metadata.topics["orders"].partitions[0]
    ctl.alter_partition(
        {
            "broker_id": state.leader,
            "topic": "orders",
            "partition": 0,
            "leader_epoch": state.leader_epoch,
            "partition_epoch": state.partition_epoch,
            "new_isr": [state.leader],
        }
    )
    ctl.broker_alive(1, {})
    ctl.register_broker(BrokerInfo(2, "127.0.0.1", 9999), {})  # moved
    app = [{"entity_type": "client-id", "entity_name": "app"}]
    defaults = [
        {"entity_type": "user", "entity_name": None},
        {"entity_type": "client-id", "entity_name": None},
    ]
    rate = {"key": "producer_byte_rate", "value": 1000.0, "remove": False}
    ctl.alter_client_quotas([{"entity": app, "ops": [rate]}], False)
    ctl.alter_client_quotas(
        [
            {
                "entity": defaults,
                "ops": [{"key": "request_percentage", "value": 12.5, "remove": False}],
            }
        ],
        False,
    )
    bad = ctl.alter_client_quotas([{"entity": app, "ops": [{**rate, "key": "bogus"}]}], False)
    assert bad["entries"][0]["error_code"] == ErrorCode.INVALID_REQUEST  # nothing appended
    ctl.alter_client_quotas([{"entity": app, "ops": [{**rate, "remove": True}]}], False)
    ctl.delete_topics(["logs"])
    ctl.create_topics(  # the name again: a new topic (another topic id)
        [{"name": "logs", "num_partitions": 2, "replication_factor": 1, "configs": {}}]
    )
    return states


def same(a: ClusterMetadata, b: ClusterMetadata) -> bool:
    ja, jb = a.to_json(), b.to_json()
    for doc in (ja, jb):
        doc.pop("epoch")
        doc.pop("controller_id")
    return ja == jb


def test_records_of_each_change_rebuild_the_next_state(tmp_path):
    states = changes(tmp_path)
    assert len(states) >= 9
    image = MetadataImage()
    for offset, (old, new) in enumerate(itertools.pairwise(states)):
        records = records_for_change(old, new)
        assert records, "every published change has records"
        image.apply(Entry(offset, 1, encode_change(records)))  # one change, one entry
        assert same(image.metadata, new)
        assert image.metadata.epoch == offset + 1  # the epoch names the applied log prefix
    assert records_for_change(states[-1], states[-1]) == []


def test_delete_topics_commits_removal_and_a_namesake_is_another_topic(tmp_path):
    states = changes(tmp_path)
    deleted = next(
        i
        for i, (a, b) in enumerate(itertools.pairwise(states))
        if "logs" in a.topics and "logs" not in b.topics
    )
    before, after, recreated = states[deleted], states[deleted + 1], states[deleted + 2]
    old_id = before.topics["logs"].topic_id
    assert records_for_change(before, after) == [
        {"type": "RemoveTopic", "name": "logs", "topic_id": old_id}
    ]
    new_id = recreated.topics["logs"].topic_id
    assert new_id and new_id != old_id
    assert len(recreated.topics["logs"].partitions) == 2
    # Deleted and created again in one change: removed first, then made, as a new topic.
    for i, record in enumerate(records_for_change(before, recreated)):
        assert i or record["type"] == "RemoveTopic"
    image = MetadataImage()
    # One entry per change (records.py): each applied whole.
    image.apply(Entry(0, 1, encode_change(records_for_change(ClusterMetadata(), before))))
    image.apply(Entry(1, 1, encode_change(records_for_change(before, recreated))))
    assert same(image.metadata, recreated)
    # A RemoveTopic applied again (replayed) never removes the newer namesake.
    image.apply(Entry(2, 1, encode_change(records_for_change(before, after))))
    assert image.metadata.topics["logs"].topic_id == new_id


def test_delete_topics_errors_are_kafkas():
    answers = []
    config = BrokerConfig({"delete.topic.enable": False})
    for cfg in (BrokerConfig(), config):
        ctl = Controller(0, cfg, LOG, ClusterMetadata(), lambda records, answer, lost=None: answer)
        ctl.register_broker(BrokerInfo(0, "127.0.0.1", 9092), {})
        ctl.create_topics(
            [{"name": "t", "num_partitions": 1, "replication_factor": 1, "configs": {}}]
        )
        answers.append(ctl.delete_topics(["t", "missing"])["responses"])
        assert ("t" in ctl.metadata.topics) == (cfg is config)
    codes = [[r["error_code"] for r in answer] for answer in answers]
    assert codes == [
        [0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION],
        [ErrorCode.TOPIC_DELETION_DISABLED, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION],
    ]


def test_a_snapshot_restores_the_same_metadata(tmp_path):
    states = changes(tmp_path)
    image = MetadataImage()
    image.apply(Entry(0, 1, encode_change(records_for_change(ClusterMetadata(), states[-1]))))
    assert same(image.metadata, states[-1])
    other = MetadataImage()
    other.restore(image.snapshot())
    assert other.metadata.to_json() == image.metadata.to_json()
    # The default (user, client-id) entity's quota survived; app's was removed.
    assert other.metadata.client_quotas == {
        (("client-id", None), ("user", None)): {"request_percentage": 12.5}
    }


def test_unknown_or_garbled_records_are_refused_not_skipped():
    with pytest.raises(MetadataRecordError, match="unknown metadata record"):
        decode_change(encode_change([{"type": "DeleteEverything"}]))
    with pytest.raises(MetadataRecordError):
        decode_change(b"\xc1")
    with pytest.raises(MetadataRecordError, match="unknown orders-0"):
        MetadataImage().apply(
            Entry(
                0,
                1,
                encode_change(
                    [
                        {
                            "type": "Partition",
                            "topic": "orders",
                            "partition": 0,
                            "leader": 0,
                            "leader_epoch": 0,
                            "partition_epoch": 0,
                            "replicas": [0],
                            "isr": [0],
                        }
                    ]
                ),
            )
        )
    with pytest.raises(MetadataRecordError, match="snapshot"):
        MetadataImage().restore(b"not a snapshot")


def test_metadata_survives_a_voter_restart_from_log_and_snapshot(tmp_path):
    (tmp_path / "ctl").mkdir()
    states = changes(tmp_path / "ctl")

    def start(image):
        clock = ManualClock()
        d = QuorumDriver(
            0,
            {0: ("127.0.0.1", 1)},
            tmp_path,
            clock,
            LOG,
            state_machine=image,
            snapshot_every=5,
        )
        d.load()
        d._apply(d.core.start())
        clock.advance(d.core.next_deadline_ms() - clock.now_ms())
        d._apply(d.core.poll())
        assert d.is_active
        return d

    image = MetadataImage()
    d = start(image)
    for old, new in itertools.pairwise(states):
        d.append([encode_change(records_for_change(old, new))])
        assert same(image.metadata, new)  # committed (one voter) and applied at once
    assert d.core.log.start_offset > 0  # snapshots taken along the way
    d.store.close()

    again = MetadataImage()
    start(again)
    assert same(again.metadata, states[-1])
    assert again.metadata.epoch == image.metadata.epoch
