"""Read-only offset lookups on a leader: ListOffsets (by time) and OffsetsForLeaderEpoch.

They change nothing and park nothing, so they are plain functions over a partition
lookup; ReplicaManager hands them its registry. Consumers see offsets up to the HW
(read_committed ones up to the LSO), replicas up to the LEO, as for fetches.
"""

from __future__ import annotations

from collections.abc import Callable

from minibroker.broker.replication.partition import Partition
from minibroker.protocol import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP
from minibroker.protocol.errors import ErrorCode

Key = tuple[str, int]
Lookup = Callable[[Key], Partition | None]


def offsets_for_leader_epoch(lookup: Lookup, body: dict) -> dict:
    """Where each requested epoch ends on this leader (Kafka's OffsetsForLeaderEpoch)."""
    topics = []
    for t in body["topics"]:
        parts = []
        for p in t["partitions"]:
            entry = {
                "partition": p["partition"],
                "error_code": 0,
                "leader_epoch": -1,
                "end_offset": -1,
            }
            partition = lookup((t["name"], p["partition"]))
            if partition is None:
                entry["error_code"] = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            elif not partition.is_leader:
                entry["error_code"] = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
            else:
                epoch, end = partition.last_offset_for_leader_epoch(p["leader_epoch"])
                entry["leader_epoch"], entry["end_offset"] = epoch, end
            parts.append(entry)
        topics.append({"name": t["name"], "partitions": parts})
    return {"topics": topics}


def list_offsets(lookup: Lookup, body: dict) -> dict:
    """The offset for each (partition, timestamp): earliest (-2), latest (-1) or by time."""
    consumer = body["replica_id"] < 0
    committed = consumer and body.get("isolation_level", 0) == 1
    topics = []
    for t in body["topics"]:
        parts = [
            _list_offset(
                lookup((t["name"], p["partition"])),
                p["partition"],
                p["timestamp"],
                consumer,
                committed,
            )
            for p in t["partitions"]
        ]
        topics.append({"name": t["name"], "partitions": parts})
    return {"topics": topics}


def _list_offset(
    partition: Partition | None, index: int, timestamp: int, consumer: bool, committed: bool
) -> dict:
    """read_committed (``committed``) sees the log up to the LSO, as its fetches do."""
    out = {"partition": index, "error_code": 0, "timestamp": -1, "offset": -1}
    if partition is None:
        out["error_code"] = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    elif not partition.is_leader:
        out["error_code"] = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
    elif timestamp == EARLIEST_TIMESTAMP:
        out["offset"] = partition.log.log_start_offset
    elif timestamp == LATEST_TIMESTAMP:
        if committed:
            out["offset"] = partition.last_stable_offset
        else:
            out["offset"] = partition.high_watermark if consumer else partition.log_end_offset
    elif timestamp == MAX_TIMESTAMP:  # below the last fetchable offset, as Kafka's
        if committed:
            upper = partition.last_stable_offset
        else:
            upper = partition.high_watermark if consumer else partition.log_end_offset
        found = partition.log.max_timestamp_offset(upper)
        if found is not None:
            out["offset"], out["timestamp"] = found
    elif timestamp < 0:
        out["error_code"] = int(ErrorCode.INVALID_REQUEST)
        out["error_message"] = (
            f"timestamp {timestamp}: use -2 (earliest), -1 (latest), -3 (max timestamp) or >= 0"
        )
    else:
        found = partition.log.offset_for_timestamp(timestamp)
        visible = partition.last_stable_offset if committed else partition.high_watermark
        if found is not None and found[0] < visible:
            out["offset"], out["timestamp"] = found
    return out
