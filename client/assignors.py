"""Partition assignors and the consumer protocol's bytes (Kafka's ConsumerProtocol).

The broker never reads these: a group's leader gets every member's subscription in its
JoinGroup answer, runs the assignor the group agreed on, and hands each member its
partitions through SyncGroup. The bytes are Kafka's own (protocol/kafka/consumer_protocol),
so a group may mix our consumers with stock Kafka clients.
"""

from __future__ import annotations

from collections.abc import Mapping

from minibroker.client.records import TopicPartition
from minibroker.protocol.kafka import consumer_protocol
from minibroker.protocol.kafka.consumer_protocol import ASSIGNMENT, SUBSCRIPTION


def encode_subscription(topics: list[str]) -> bytes:
    return consumer_protocol.encode_subscription(sorted(topics))


def decode_subscription(data: bytes) -> list[str]:
    return list(consumer_protocol.decode(SUBSCRIPTION, data)["topics"])


def encode_assignment(partitions: list[TopicPartition]) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return consumer_protocol.encode_assignment(
        {t: sorted(ps) for t, ps in sorted(by_topic.items())}
    )


def decode_assignment(data: bytes) -> list[TopicPartition]:
    if not data:
        return []
    body = consumer_protocol.decode(ASSIGNMENT, data)
    return [
        TopicPartition(a["topic"], p) for a in body["assigned_partitions"] for p in a["partitions"]
    ]


Subscriptions = Mapping[str, list[str]]  # member id -> topics
PartitionCounts = Mapping[str, int]  # topic -> partitions


def range_assign(
    subscriptions: Subscriptions, counts: PartitionCounts
) -> dict[str, list[TopicPartition]]:
    """Kafka's RangeAssignor: per topic, consecutive ranges to its subscribers in member-id
    order, the first ``partitions % members`` getting one more."""
    out: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
    for topic in sorted({t for ts in subscriptions.values() for t in ts}):
        members = sorted(m for m, ts in subscriptions.items() if topic in ts)
        n = counts.get(topic, 0)
        if not members or not n:
            continue
        per, extra = divmod(n, len(members))
        start = 0
        for i, member in enumerate(members):
            length = per + (1 if i < extra else 0)
            out[member] += [TopicPartition(topic, p) for p in range(start, start + length)]
            start += length
    return out


def round_robin_assign(
    subscriptions: Subscriptions, counts: PartitionCounts
) -> dict[str, list[TopicPartition]]:
    """Kafka's RoundRobinAssignor: every partition of every topic in order, dealt to the
    members in turn, skipping a member not subscribed to that partition's topic."""
    out: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
    members = sorted(subscriptions)
    if not members:
        return out
    turn = 0
    for topic in sorted({t for ts in subscriptions.values() for t in ts}):
        for p in range(counts.get(topic, 0)):
            for _ in range(len(members)):
                member = members[turn % len(members)]
                turn += 1
                if topic in subscriptions[member]:
                    out[member].append(TopicPartition(topic, p))
                    break
    return out


ASSIGNORS = {"range": range_assign, "roundrobin": round_robin_assign}
