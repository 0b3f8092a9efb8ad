"""ListOffsets for a set of partitions: each request goes to the partition's leader.

Shared by the consumer (positions, seek_to_beginning/end, offsets_for_times) and
admin-style lookups. Leadership can move between the metadata and the request, so
NOT_LEADER_OR_FOLLOWER and friends trigger a refresh and another try.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import trio

from minibroker.client.cluster import Cluster
from minibroker.client.fetcher import isolation_level
from minibroker.client.records import TopicPartition
from minibroker.protocol import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, ApiKey
from minibroker.protocol.errors import KafkaError, LeaderNotAvailable, error_class

__all__ = [
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "OffsetAndTimestamp",
    "list_offsets",
    "lookup_retries",
]


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


def lookup_retries(config: Mapping[str, Any]) -> dict[str, Any]:
    """``list_offsets``'s settings for a client: retries ``retry.backoff.ms`` apart, for up
    to ``request.timeout.ms``, so a lookup waits out a leader's failover; and its
    isolation level (a read_committed consumer's "latest" is the last stable offset, as
    Kafka's endOffsets and auto.offset.reset=latest give it)."""
    return {
        "backoff": config["retry.backoff.ms"] / 1000,
        "patience": config["request.timeout.ms"] / 1000,
        "isolation_level": isolation_level(config),
    }


async def list_offsets(
    cluster: Cluster,
    wanted: dict[TopicPartition, int],
    *,
    attempts: int = 5,
    backoff: float = 0.1,
    patience: float = 0.0,
    isolation_level: int = 0,
) -> dict[TopicPartition, OffsetAndTimestamp]:
    """``{tp: timestamp}`` -> ``{tp: (offset, timestamp)}``; -2 earliest, -1 latest, else by time.

    A timestamp later than every record gives offset -1 (Kafka's "no such offset").
    Retriable failures are retried ``attempts`` times, and for at least ``patience``
    seconds: a leader that died needs its successor elected (a few seconds), and the
    metadata is refreshed before every retry so the new one is asked.
    """
    results: dict[TopicPartition, OffsetAndTimestamp] = {}
    todo = dict(wanted)
    error: KafkaError | None = None
    deadline = time.monotonic() + patience
    attempt = 0
    while attempt < attempts or time.monotonic() < deadline:
        if attempt:
            await trio.sleep(backoff)
        missing = {tp.topic for tp in todo if cluster.leader(*tp) is None}
        if attempt:
            missing |= {tp.topic for tp in todo}  # the leader we knew may be the dead one
        if missing:
            await cluster.refresh(missing)
        attempt += 1
        by_node, error = by_leader(cluster, todo, error)
        for node, tps in by_node.items():
            error = await _ask(cluster, node, tps, todo, results, isolation_level) or error
        if not todo:
            return results
    assert error is not None
    raise error


def by_leader(
    cluster: Cluster, todo: Iterable[TopicPartition], error: KafkaError | None
) -> tuple[dict[int, list[TopicPartition]], KafkaError | None]:
    """The partitions grouped by their leader's node, as the cluster knows them now; a
    partition without a leader is left out, and its error is the one to raise if the
    retries run out (else ``error``, the last one seen)."""
    by_node: dict[int, list[TopicPartition]] = defaultdict(list)
    for tp in todo:
        leader = cluster.leader(*tp)
        if leader is None:
            error = cluster_error(cluster, tp)
        else:
            by_node[leader].append(tp)
    return by_node, error


def cluster_error(cluster: Cluster, tp: TopicPartition) -> KafkaError:
    code, message = cluster.topic_errors.get(tp.topic, (0, None))
    if code:
        return error_class(code)(message or f"topic '{tp.topic}'")
    return LeaderNotAvailable(f"no leader for {tp.topic}-{tp.partition}")


async def _ask(
    cluster: Cluster,
    node: int,
    tps: list[TopicPartition],
    todo: dict[TopicPartition, int],
    results: dict[TopicPartition, OffsetAndTimestamp],
    isolation_level: int,
) -> KafkaError | None:
    by_topic: dict[str, list[dict]] = defaultdict(list)
    for tp in tps:
        by_topic[tp.topic].append({"partition": tp.partition, "timestamp": todo[tp]})
    body: dict[str, Any] = {"topics": [{"name": t, "partitions": p} for t, p in by_topic.items()]}
    if isolation_level:  # (left out otherwise: a broker from before transactions knows none)
        body["isolation_level"] = isolation_level
    try:
        response = await cluster.request(node, ApiKey.LIST_OFFSETS, body)
    except KafkaError as exc:
        if not exc.retriable:
            raise
        return exc
    error = None
    for t in response["topics"]:
        for p in t["partitions"]:
            tp = TopicPartition(t["name"], p["partition"])
            if tp not in todo:
                continue
            if p["error_code"]:
                exc = error_class(p["error_code"])(
                    p.get("error_message") or f"{tp.topic}-{tp.partition}"
                )
                if not exc.retriable:
                    raise exc
                error = exc
                continue
            results[tp] = OffsetAndTimestamp(p["offset"], p["timestamp"])
            del todo[tp]
    return error


async def delete_records(
    cluster: Cluster, wanted: dict[TopicPartition, int], *, attempts: int = 5, backoff: float = 0.1
) -> dict[TopicPartition, int]:
    """Kafka's Admin.deleteRecords: ``{tp: offset}`` (-1: the high watermark) -> ``{tp: low
    watermark}``, from each partition's leader; a leader that moved is found again after a
    metadata refresh. OffsetOutOfRange for an offset past the high watermark."""
    results: dict[TopicPartition, int] = {}
    todo = dict(wanted)
    error: KafkaError | None = None
    for attempt in range(attempts):
        if attempt:
            await trio.sleep(backoff)
        await cluster.refresh({tp.topic for tp in todo})
        by_node, error = by_leader(cluster, todo, error)
        for node, tps in by_node.items():
            by_topic: dict[str, list[dict]] = defaultdict(list)
            for tp in tps:
                by_topic[tp.topic].append({"partition": tp.partition, "offset": todo[tp]})
            body = {"topics": [{"name": t, "partitions": p} for t, p in by_topic.items()]}
            try:
                response = await cluster.request(node, ApiKey.DELETE_RECORDS, body)
            except KafkaError as exc:
                if not exc.retriable:
                    raise
                error = exc
                continue
            for t in response["topics"]:
                for p in t["partitions"]:
                    tp = TopicPartition(t["name"], p["partition"])
                    if p["error_code"]:
                        exc = error_class(p["error_code"])(p.get("error_message") or str(tp))
                        if not exc.retriable:
                            raise exc
                        error = exc
                        continue
                    results[tp] = p["low_watermark"]
                    todo.pop(tp, None)
        if not todo:
            return results
    assert error is not None
    raise error
