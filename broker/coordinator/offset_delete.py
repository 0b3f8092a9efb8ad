"""OffsetDelete (KIP-496): a group's committed offsets of some partitions go, as Kafka's
GroupCoordinator.handleDeleteOffsets.

An Empty group loses every asked partition's offset. A group with members keeps the offsets
of topics it is subscribed to (GROUP_SUBSCRIBED_TO_TOPIC for those partitions: its members
may commit them again at any moment) and loses the others; the subscriptions are read from
the members' consumer-protocol metadata, as Kafka reads them. A group that is not a consumer
group and has members is NON_EMPTY_GROUP; no group: GROUP_ID_NOT_FOUND. Deleted offsets are
tombstones in ``__consumer_offsets`` (acks=all), leaving the cache once they are stored.
"""

from __future__ import annotations

from minibroker.broker.coordinator.coordinator import DEAD, EMPTY, GroupCoordinator
from minibroker.broker.coordinator.group import GroupMetadata
from minibroker.broker.coordinator.records import offset_key
from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol.errors import ErrorCode
from minibroker.protocol.kafka import consumer_protocol
from minibroker.protocol.kafka.messages import KafkaDecodeError

CONSUMER = "consumer"


def subscribed_topics(group: GroupMetadata) -> set[str] | None:
    """Every topic a member of a consumer group subscribes to; None when unknown."""
    if group.protocol_type != CONSUMER or group.protocol_name is None:
        return None
    topics: set[str] = set()
    for member in group.members.values():
        try:
            data = member.metadata(group.protocol_name)
            topics.update(consumer_protocol.decode(consumer_protocol.SUBSCRIPTION, data)["topics"])
        except (KeyError, KafkaDecodeError):
            return None
    return topics


def delete_offsets(coordinator: GroupCoordinator, body: dict) -> dict | PendingResponse:
    group_id = body["group_id"]
    error = coordinator.group_error(group_id)
    group = coordinator.groups.get(group_id) if error is None else None
    if error is None and (group is None or group.is_in(DEAD)):
        error = ErrorCode.GROUP_ID_NOT_FOUND
    subscribed: set[str] = set()
    if error is None and not group.is_in(EMPTY):
        known = subscribed_topics(group)
        if known is None:
            error = ErrorCode.NON_EMPTY_GROUP
        else:
            subscribed = known
    if error is not None:
        return {"error_code": int(error), "topics": [], "throttle_time_ms": 0}
    codes: dict[tuple[str, int], ErrorCode] = {}
    for t in body["topics"]:
        for p in t["partitions"]:
            tp = (t["name"], p["partition_index"])
            codes[tp] = (
                ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if tp[0] in subscribed else ErrorCode.NONE
            )
    gone = [tp for tp, code in codes.items() if code is ErrorCode.NONE and tp in group.offsets]
    response = PendingResponse()

    def answer(stored: ErrorCode) -> None:
        if stored is ErrorCode.NONE:
            for tp in gone:
                group.offsets.pop(tp, None)
        by_topic: dict[str, list[dict]] = {}
        for (topic, partition), code in codes.items():
            if code is ErrorCode.NONE:
                code = stored
            by_topic.setdefault(topic, []).append(
                {"partition_index": partition, "error_code": int(code)}
            )
        response.set(
            {
                "error_code": 0,
                "topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()],
                "throttle_time_ms": 0,
            }
        )

    if not gone:
        answer(ErrorCode.NONE)
    else:
        entries = [(offset_key(group_id, t, p), None) for t, p in gone]
        coordinator.manager.append(group.partition, entries, answer)
    return response.body if response.body is not None else response
