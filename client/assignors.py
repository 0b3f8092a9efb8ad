"""Partition assignors and the consumer protocol's bytes (Kafka's ConsumerProtocol).

The broker never reads these: a group's leader gets every member's subscription in its
JoinGroup answer, runs the assignor the group agreed on, and hands each member its
partitions through SyncGroup. The bytes are Kafka's own (protocol/kafka/consumer_protocol),
so a group may mix our consumers with stock Kafka clients.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping

from minibroker.client.records import TopicPartition
from minibroker.client.sticky import MemberSubscription, PartitionCounts, cooperative_sticky_assign
from minibroker.protocol.kafka import consumer_protocol
from minibroker.protocol.kafka.consumer_protocol import ASSIGNMENT, SUBSCRIPTION

# Java's CooperativeStickyAssignor also puts the generation in the user data (an int32),
# for leaders that read subscriptions older than v2.
_GENERATION_USER_DATA = struct.Struct(">i")


def _by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[int]]:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return {t: sorted(ps) for t, ps in sorted(by_topic.items())}


def encode_subscription(
    topics: list[str], owned: Iterable[TopicPartition] = (), generation: int = -1
) -> bytes:
    """Kafka's current subscription (v3, as its clients write it): the partitions this
    member owns and the generation it got them in are what a sticky leader keeps in place."""
    return consumer_protocol.encode_subscription(sorted(topics), _by_topic(owned), generation)


def decode_subscription(data: bytes) -> MemberSubscription:
    body = consumer_protocol.decode(SUBSCRIPTION, data)
    generation = body["generation_id"]
    user_data = body["user_data"]
    if generation < 0 and user_data and len(user_data) == _GENERATION_USER_DATA.size:
        (generation,) = _GENERATION_USER_DATA.unpack(user_data)
    owned = [
        TopicPartition(o["topic"], p) for o in body["owned_partitions"] for p in o["partitions"]
    ]
    return MemberSubscription(list(body["topics"]), owned, generation)


def encode_assignment(partitions: list[TopicPartition]) -> bytes:
    return consumer_protocol.encode_assignment(_by_topic(partitions))


def decode_assignment(data: bytes) -> list[TopicPartition]:
    if not data:
        return []
    body = consumer_protocol.decode(ASSIGNMENT, data)
    return [
        TopicPartition(a["topic"], p) for a in body["assigned_partitions"] for p in a["partitions"]
    ]


Subscriptions = Mapping[str, list[str]]  # member id -> topics


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


Assignor = Callable[
    [Mapping[str, MemberSubscription], PartitionCounts], dict[str, list[TopicPartition]]
]


def _topics_only(assign: Callable[[Subscriptions, PartitionCounts], dict]) -> Assignor:
    """Range and round-robin look at topics only (owned partitions mean nothing to them)."""
    return lambda members, counts: assign({m: s.topics for m, s in members.items()}, counts)


# Kafka's protocol names: the group agrees on one of them (the coordinator's vote).
ASSIGNORS: dict[str, Assignor] = {
    "range": _topics_only(range_assign),
    "roundrobin": _topics_only(round_robin_assign),
    "cooperative-sticky": cooperative_sticky_assign,
}
# Assignors that support KIP-429's incremental protocol. A consumer rebalances
# cooperatively only if every assignor it offers does (Kafka's rule: the group may pick
# any of them), so "range,cooperative-sticky" stays eager until range is dropped.
COOPERATIVE = frozenset({"cooperative-sticky"})


def is_cooperative(strategies: Iterable[str]) -> bool:
    offered = list(strategies)
    return bool(offered) and all(s in COOPERATIVE for s in offered)
