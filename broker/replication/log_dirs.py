"""DescribeLogDirs and DescribeProducers: what this broker holds, per partition replica.

DescribeLogDirs (Kafka's ReplicaManager.describeLogDirs): the broker's one log directory,
its disk's total and usable bytes, and each hosted replica's size on disk; an offline
directory answers KAFKA_STORAGE_ERROR. DescribeProducers (KIP-664): a leader's active
idempotent producers per partition (their epoch, last sequence and last write time), from
the same producer state its appends check; there are no transactions, so
coordinator_epoch and current_txn_start_offset are -1.
"""

from __future__ import annotations

import shutil
from typing import Any

from minibroker.protocol.errors import ErrorCode


def describe_log_dirs(rm: Any, body: dict) -> dict:
    """The native DescribeLogDirs answer from ReplicaManager ``rm``."""
    result: dict[str, Any] = {"log_dir": str(rm.data_dir), "error_code": 0, "topics": []}
    if rm.offline_reason is not None:
        result["error_code"] = int(ErrorCode.KAFKA_STORAGE_ERROR)
        return {"results": [result]}
    try:
        usage = shutil.disk_usage(rm.data_dir)
        result["total_bytes"], result["usable_bytes"] = usage.total, usage.free
    except OSError:
        pass  # -1: unknown
    wanted = None
    if body["topics"] is not None:
        wanted = {(t["topic"], p) for t in body["topics"] for p in t["partitions"]}
    topics: dict[str, list[dict]] = {}
    for (topic, index), partition in sorted(rm.partitions.items()):
        if wanted is not None and (topic, index) not in wanted:
            continue
        log = partition.log
        topics.setdefault(topic, []).append(
            {
                "partition_index": index,
                "partition_size": log.size_bytes,
                # Kafka: how far a replica's log end is behind its high watermark (0 here:
                # no future replicas; the HW never passes this replica's own log end).
                "offset_lag": max(0, partition.high_watermark - log.log_end_offset),
                "is_future_key": False,
            }
        )
    result["topics"] = [{"name": n, "partitions": ps} for n, ps in topics.items()]
    return {"results": [result]}


def describe_producers(rm: Any, body: dict) -> dict:
    """The native DescribeProducers answer: each partition's active producers, on its leader."""
    topics = []
    for t in body["topics"]:
        parts = []
        for index in t["partition_indexes"]:
            out: dict[str, Any] = {"partition_index": index, "error_code": 0}
            partition = rm.partitions.get((t["name"], index))
            if partition is None:
                out["error_code"] = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            elif not partition.is_leader:
                out["error_code"] = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
            else:
                state = partition.log.producers
                # Kafka's: the first offset of the producer's ongoing transaction, else -1;
                # the coordinator epoch of the last marker seen (-1: none yet).
                out["active_producers"] = [
                    {
                        "producer_id": entry.producer_id,
                        "producer_epoch": entry.epoch,
                        "last_sequence": entry.last_seq,
                        "last_timestamp": entry.last_timestamp,
                        "coordinator_epoch": entry.coordinator_epoch,
                        "current_txn_start_offset": state.ongoing.get(entry.producer_id, -1),
                    }
                    for entry in state.producers.values()
                ]
            parts.append(out)
        topics.append({"name": t["name"], "partitions": parts})
    return {"topics": topics}
