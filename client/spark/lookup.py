"""Driver-side calls to the cluster: which partitions a subscription covers, their offsets,
and a streaming query's progress committed to a group.

Each call is one private ``trio.run`` with its own short-lived connections, closed on
return. Spark's planner processes and the streaming source's driver-side runner call
these a few times per query or micro-batch, and nothing of ours survives in them that
would need closing (Spark never calls the stream reader's ``stop()``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio

from minibroker.client.cluster import Cluster
from minibroker.client.group_admin import alter_group_offsets
from minibroker.client.offsets import list_offsets, lookup_retries
from minibroker.client.records import TopicPartition
from minibroker.client.spark.options import Subscription
from minibroker.protocol import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from minibroker.protocol.errors import ErrorCode, UnknownTopicOrPartition


@dataclass(frozen=True)
class Snapshot:
    """Every partition the subscription covers now, with its log start offset and its HW."""

    earliest: dict[TopicPartition, int]
    latest: dict[TopicPartition, int]

    @property
    def partitions(self) -> list[TopicPartition]:
        return sorted(self.latest)


def snapshot(config: dict[str, Any], subscription: Subscription, *, strict: bool) -> Snapshot:
    """Look the partitions and their earliest/latest (HW) offsets up.

    ``strict`` (batch reads) makes a missing topic or assigned partition an error; a
    streaming query instead waits for it to appear, as Kafka's source does.
    """
    return trio.run(_snapshot, config, subscription, strict)


def earliest_offsets(
    config: dict[str, Any], tps: list[TopicPartition]
) -> dict[TopicPartition, int]:
    return trio.run(_offsets, config, tps, EARLIEST_TIMESTAMP)


def offsets_for_times(
    config: dict[str, Any], wanted: dict[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """Per partition the first offset whose record's timestamp is at or after the given
    one, or -1 when there is none (Kafka's offsetsForTimes, exact to the record)."""
    return trio.run(_times, config, wanted)


def commit_progress(config: dict[str, Any], offsets: dict[TopicPartition, int]) -> None:
    """Commit ``offsets`` to the group ``config["group.id"]`` from outside it (generation
    -1, no member id): the coordinator takes it while the group has no members."""
    trio.run(_with_cluster, config, alter_group_offsets, config["group.id"], offsets, config)


async def _times(config: dict[str, Any], wanted: dict[TopicPartition, int]) -> dict:
    async def ask(cluster: Cluster) -> dict:
        if not wanted:
            return {}
        # The broker answers the record itself (its time index), -1 past every record.
        found = await list_offsets(cluster, dict(wanted), **lookup_retries(config))
        return {tp: hit.offset for tp, hit in found.items()}

    return await _with_cluster(config, ask)


async def _with_cluster(config: dict[str, Any], fn: Any, *args: Any) -> Any:
    async with trio.open_nursery() as nursery:
        cluster = Cluster(config, nursery)
        try:
            return await fn(cluster, *args)
        finally:
            await cluster.aclose()


async def _offsets(config: dict[str, Any], tps: list[TopicPartition], which: int) -> dict:
    async def ask(cluster: Cluster) -> dict:
        if not tps:
            return {}
        found = await list_offsets(cluster, dict.fromkeys(tps, which), **lookup_retries(config))
        return {tp: r.offset for tp, r in found.items()}

    return await _with_cluster(config, ask)


async def _snapshot(config: dict[str, Any], subscription: Subscription, strict: bool) -> Snapshot:
    async def ask(cluster: Cluster) -> Snapshot:
        tps = await _partitions(cluster, subscription, strict)
        if not tps:
            return Snapshot({}, {})
        retries = lookup_retries(config)
        early = await list_offsets(cluster, dict.fromkeys(tps, EARLIEST_TIMESTAMP), **retries)
        late = await list_offsets(cluster, dict.fromkeys(tps, LATEST_TIMESTAMP), **retries)
        return Snapshot(
            {tp: r.offset for tp, r in early.items()}, {tp: r.offset for tp, r in late.items()}
        )

    return await _with_cluster(config, ask)


async def _partitions(cluster: Cluster, sub: Subscription, strict: bool) -> list[TopicPartition]:
    if sub.kind == "subscribePattern":
        await cluster.refresh(None)
        topics = [t for t in cluster.topics if sub.matches(t)]
    else:
        topics = (
            list(sub.topics)
            if sub.kind == "subscribe"
            else sorted({tp.topic for tp in sub.assigned})
        )
        await cluster.refresh(topics)
    counts = {}
    for topic in topics:
        count = cluster.partition_count(topic)
        if count is None:
            code = cluster.topic_errors.get(topic, (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None))[0]
            if strict and code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise UnknownTopicOrPartition(f"topic '{topic}' does not exist")
            continue
        counts[topic] = count
    if sub.kind != "assign":
        return [TopicPartition(t, p) for t in sorted(counts) for p in range(counts[t])]
    out = []
    for tp in sub.assigned:
        if tp.partition < counts.get(tp.topic, 0):
            out.append(tp)
        elif strict:
            raise UnknownTopicOrPartition(
                f"option 'assign': partition {tp.topic}-{tp.partition} does not exist"
            )
    return out
