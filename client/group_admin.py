"""Consumer groups seen from outside (Kafka's Admin listConsumerGroups,
describeConsumerGroups, deleteConsumerGroups, list/alterConsumerGroupOffsets), as
Admin's methods call them: each group's requests go to its coordinator.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from minibroker.client.assignors import decode_assignment
from minibroker.client.cluster import Cluster
from minibroker.client.group import GroupMembership
from minibroker.client.records import TopicPartition
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, KafkaError, error_class


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    state: str
    protocol_type: str


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    client_id: str
    host: str
    assignment: list[TopicPartition]
    group_instance_id: str | None = None  # a static member's (KIP-345); None: dynamic


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: list[MemberDescription] = field(default_factory=list)
    coordinator: int = -1  # the broker that coordinates the group (Kafka's coordinator())


def _outsider(cluster: Cluster, group_id: str, config: Mapping) -> GroupMembership:
    """The group's coordinator routing, without joining (generation -1, no member id)."""
    return GroupMembership(cluster, {**config, "group.id": group_id}, lambda *a, **k: None)


async def list_groups(cluster: Cluster) -> list[GroupListing]:
    """Every broker's groups (each coordinates its own share)."""
    await cluster.refresh(())
    out: dict[str, GroupListing] = {}
    for node in sorted(cluster.brokers):
        try:
            body = await cluster.request(node, ApiKey.LIST_GROUPS, {})
        except KafkaError:
            continue  # a dead broker coordinates nothing until its partitions move
        for g in body["groups"]:
            out[g["group_id"]] = GroupListing(g["group_id"], g["group_state"], g["protocol_type"])
    return sorted(out.values(), key=lambda g: g.group_id)


async def describe_group(cluster: Cluster, group_id: str, config: Mapping) -> GroupDescription:
    outsider = _outsider(cluster, group_id, config)
    body = await outsider.call(ApiKey.DESCRIBE_GROUPS, {"groups": [group_id]})
    g = body["groups"][0]
    if g["error_code"]:
        raise error_class(g["error_code"])(f"describing group {group_id}")
    members = [
        MemberDescription(
            m["member_id"],
            m["client_id"],
            m["client_host"],
            decode_assignment(m["member_assignment"]) if g["protocol_type"] == "consumer" else [],
            m.get("group_instance_id"),
        )
        for m in g["members"]
    ]
    return GroupDescription(
        group_id,
        g["group_state"],
        g["protocol_type"],
        g["protocol_data"],
        members,
        -1 if outsider.coordinator is None else outsider.coordinator,
    )


async def delete_groups(
    cluster: Cluster, group_ids: Iterable[str], config: Mapping
) -> dict[str, KafkaError | None]:
    out: dict[str, KafkaError | None] = {}
    for group_id in group_ids:
        body = await _outsider(cluster, group_id, config).call(
            ApiKey.DELETE_GROUPS, {"groups_names": [group_id]}
        )
        code = ErrorCode.parse(body["results"][0]["error_code"])
        out[group_id] = None if code is ErrorCode.NONE else error_class(code)(group_id)
    return out


async def group_offsets(
    cluster: Cluster, group_id: str, config: Mapping
) -> dict[TopicPartition, int]:
    """Every committed offset of the group."""
    body = await _outsider(cluster, group_id, config).call(
        ApiKey.OFFSET_FETCH, {"group_id": group_id, "topics": None}
    )
    if body["error_code"]:
        raise error_class(body["error_code"])(f"offsets of group {group_id}")
    return {
        TopicPartition(t["name"], p["partition"]): p["committed_offset"]
        for t in body["topics"]
        for p in t["partitions"]
    }


async def alter_group_offsets(
    cluster: Cluster, group_id: str, offsets: Mapping[TopicPartition, int], config: Mapping
) -> None:
    """Commit ``offsets`` from outside the group: refused (UNKNOWN_MEMBER_ID) unless the
    group is empty, as Kafka's alterConsumerGroupOffsets is."""
    await _outsider(cluster, group_id, config).commit(offsets)


async def delete_group_offsets(
    cluster: Cluster, group_id: str, partitions: Iterable[TopicPartition], config: Mapping
) -> dict[TopicPartition, KafkaError | None]:
    """Kafka's deleteConsumerGroupOffsets (OffsetDelete): per partition None when its
    committed offset is gone, else GroupSubscribedToTopic (a member consumes the topic);
    a group-wide refusal (GroupIdNotFound, NonEmptyGroup) raises."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    body = {
        "group_id": group_id,
        "topics": [
            {"name": t, "partitions": [{"partition_index": p} for p in ps]}
            for t, ps in by_topic.items()
        ],
    }
    answer = await _outsider(cluster, group_id, config).call(ApiKey.OFFSET_DELETE, body)
    if answer["error_code"]:
        raise error_class(answer["error_code"])(f"offsets of group {group_id}")
    return {
        TopicPartition(t["name"], p["partition_index"]): error_class(p["error_code"])(
            f"{t['name']}-{p['partition_index']} of group {group_id}"
        )
        if p["error_code"]
        else None
        for t in answer["topics"]
        for p in t["partitions"]
    }
