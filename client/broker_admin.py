"""What each broker holds (Kafka's Admin describeLogDirs, describeProducers), as Admin's
methods call them: a log dir is described by its broker, producers by each leader."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from minibroker.client.cluster import Cluster
from minibroker.client.records import TopicPartition
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import BrokerNotAvailable, KafkaError, error_class


@dataclass(frozen=True)
class ReplicaInfo:
    size: int  # bytes on disk
    offset_lag: int
    is_future: bool = False


@dataclass(frozen=True)
class LogDirDescription:
    path: str
    error: KafkaError | None
    replicas: dict[TopicPartition, ReplicaInfo]
    total_bytes: int = -1
    usable_bytes: int = -1


@dataclass(frozen=True)
class ProducerState:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int


async def describe_log_dirs(
    cluster: Cluster, brokers: Iterable[int]
) -> dict[int, dict[str, LogDirDescription]]:
    """Per broker, per log directory: its replicas' sizes."""
    out: dict[int, dict[str, LogDirDescription]] = {}
    for broker in brokers:
        if broker not in cluster.brokers:
            await cluster.refresh(())
        if broker not in cluster.brokers:
            raise BrokerNotAvailable(f"broker {broker} is not in the cluster metadata")
        answer = await cluster.request(broker, ApiKey.DESCRIBE_LOG_DIRS, {"topics": None})
        dirs = {}
        for r in answer["results"]:
            code = r["error_code"]
            dirs[r["log_dir"]] = LogDirDescription(
                r["log_dir"],
                error_class(code)(r["log_dir"]) if code else None,
                {
                    TopicPartition(t["name"], p["partition_index"]): ReplicaInfo(
                        p["partition_size"], p["offset_lag"], p["is_future_key"]
                    )
                    for t in r["topics"]
                    for p in t["partitions"]
                },
                r["total_bytes"],
                r["usable_bytes"],
            )
        out[broker] = dirs
    return out


async def describe_producers(
    cluster: Cluster, partitions: Iterable[tuple[str, int]]
) -> dict[TopicPartition, list[ProducerState]]:
    """Each partition's active idempotent producers, from its leader (an error raises)."""
    wanted = [TopicPartition(*tp) for tp in partitions]
    await cluster.refresh({tp.topic for tp in wanted})
    by_leader: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for tp in wanted:
        leader = cluster.leader(*tp)
        if leader is None:
            raise cluster.topic_error(tp.topic, f"no leader for {tp.topic}-{tp.partition}")
        by_leader[leader][tp.topic].append(tp.partition)
    out: dict[TopicPartition, list[ProducerState]] = {}
    for leader, topics in by_leader.items():
        body = {"topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()]}
        answer = await cluster.request(leader, ApiKey.DESCRIBE_PRODUCERS, body)
        for t in answer["topics"]:
            for p in t["partitions"]:
                tp = TopicPartition(t["name"], p["partition_index"])
                if p["error_code"]:
                    raise error_class(p["error_code"])(p.get("error_message") or str(tp))
                out[tp] = [
                    ProducerState(
                        a["producer_id"],
                        a["producer_epoch"],
                        a["last_sequence"],
                        a["last_timestamp"],
                    )
                    for a in p["active_producers"]
                ]
    return out
