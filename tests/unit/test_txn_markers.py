"""WriteTxnMarkers on the partition side (broker/replication/txn_markers.py): markers wait
for the ISR as acks=all produces do, answer per marker and partition, tell the
__consumer_offsets listeners once replicated; read_committed fetches (v1) stop at the LSO
and name aborted transactions, and v0 answers carry none of it. Manual clock, no sockets."""

from __future__ import annotations

import pytest

import minibroker.protocol as p
from minibroker.broker.metadata.image import PartitionState
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.protocol import GROUP_METADATA_TOPIC, encode_batch
from minibroker.protocol.batch import TRANSACTIONAL_FLAG
from minibroker.protocol.errors import ErrorCode
from tests.unit.replica_helpers import manual_replica_manager

PID = 41


@pytest.fixture
def manager(tmp_path):
    manager = manual_replica_manager(tmp_path)
    manager.on_isr_change = lambda partition, isr: None
    for topic in ("t", GROUP_METADATA_TOPIC):
        manager.host_partition(topic, 0, PartitionState(0, 1, [0, 1], [0, 1], 1))
    yield manager
    manager.close()


def validated(key: int, version: int, raw: dict) -> dict:
    return p.validate_request(p.RequestHeader(key, version, 1, None), raw)


def produce_txn(manager: ReplicaManager, topic: str = "t", seq: int = 0, epoch: int = 0) -> None:
    batch = encode_batch(
        [(1000, b"k", b"v", [])],
        producer_id=PID,
        producer_epoch=epoch,
        base_sequence=seq,
        attributes=TRANSACTIONAL_FLAG,
    )
    raw = {
        "acks": 1,
        "timeout_ms": 30_000,
        "topics": [{"name": topic, "partitions": [{"partition": 0, "records": batch}]}],
    }
    answer = manager.produce(validated(p.ApiKey.PRODUCE, 0, raw), internal_topics_allowed=True)
    assert answer["topics"][0]["partitions"][0]["error_code"] == 0


def markers(manager: ReplicaManager, *entries: tuple[str, bool, int]):
    """One marker per (topic, commit, producer epoch), coordinator epoch 0."""
    raw = {
        "markers": [
            {
                "producer_id": PID,
                "producer_epoch": epoch,
                "transaction_result": commit,
                "topics": [{"name": topic, "partition_indexes": [0]}],
                "coordinator_epoch": 0,
            }
            for topic, commit, epoch in entries
        ]
    }
    return manager.write_txn_markers(validated(p.ApiKey.WRITE_TXN_MARKERS, 1, raw))


def follower_fetch(manager: ReplicaManager, topic: str, offset: int) -> None:
    raw = {
        "replica_id": 1,
        "max_wait_ms": 0,
        "min_bytes": 1,
        "topics": [{"name": topic, "partitions": [{"partition": 0, "fetch_offset": offset}]}],
    }
    manager.fetch(manager.fetch_request(validated(p.ApiKey.FETCH, 0, raw)))


def consumer_fetch(manager: ReplicaManager, committed: bool, version: int = 1) -> dict:
    raw = {
        "replica_id": -1,
        "max_wait_ms": 0,
        "min_bytes": 1,
        "isolation_level": int(committed),
        "topics": [{"name": "t", "partitions": [{"partition": 0, "fetch_offset": 0}]}],
    }
    body = validated(p.ApiKey.FETCH, version, raw)
    return manager.fetch(manager.fetch_request(body, version))["topics"][0]["partitions"][0]


def codes(answer: dict) -> list[int]:
    return [m["topics"][0]["partitions"][0]["error_code"] for m in answer["markers"]]


def test_markers_wait_for_the_isr_then_tell_the_offsets_listeners(manager):
    heard = []
    manager.txn_marker_listeners.append(lambda *args: heard.append(args))
    produce_txn(manager, "t")
    produce_txn(manager, GROUP_METADATA_TOPIC)
    follower_fetch(manager, "t", 1)
    follower_fetch(manager, GROUP_METADATA_TOPIC, 1)
    pending = markers(manager, ("t", True, 0), (GROUP_METADATA_TOPIC, True, 0))
    assert isinstance(pending, PendingResponse) and pending.body is None
    follower_fetch(manager, "t", 2)
    assert pending.body is None and heard == []  # the offsets partition's marker waits
    follower_fetch(manager, GROUP_METADATA_TOPIC, 2)
    assert codes(pending.body) == [0, 0]
    assert heard == [(GROUP_METADATA_TOPIC, 0, PID, True)]  # only __consumer_offsets'


def test_a_marker_the_isr_never_gets_times_out(manager):
    produce_txn(manager)
    pending = markers(manager, ("t", False, 0))
    manager.clock.advance(29_999)
    assert pending.body is None
    manager.clock.advance(1)  # the expired marker answers from the timer
    assert codes(pending.body) == [ErrorCode.REQUEST_TIMED_OUT]


def test_stale_markers_and_unknown_partitions_are_answered_at_once(manager):
    produce_txn(manager)
    follower_fetch(manager, "t", 1)
    pending = markers(manager, ("t", False, 2))  # the fencing abort, epoch bumped
    follower_fetch(manager, "t", 2)
    assert codes(pending.body) == [0]
    assert codes(markers(manager, ("t", True, 1))) == [ErrorCode.INVALID_PRODUCER_EPOCH]
    assert codes(markers(manager, ("nope", True, 2))) == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]


def test_read_committed_fetches_stop_at_the_lso_and_v0_answers_carry_no_txn_fields(manager):
    produce_txn(manager)  # offset 0, open
    follower_fetch(manager, "t", 1)  # HW 1
    part = consumer_fetch(manager, committed=True)
    assert (part["records"], part["last_stable_offset"], part["aborted_transactions"]) == (
        b"",
        0,
        [],
    )
    assert consumer_fetch(manager, committed=False)["records"] != b""
    pending = markers(manager, ("t", False, 0))  # abort at 1
    follower_fetch(manager, "t", 2)
    assert codes(pending.body) == [0]
    part = consumer_fetch(manager, committed=True)
    assert part["last_stable_offset"] == 2
    assert part["aborted_transactions"] == [{"producer_id": PID, "first_offset": 0}]
    v0 = consumer_fetch(manager, committed=True, version=0)
    assert "last_stable_offset" not in v0 and "aborted_transactions" not in v0
