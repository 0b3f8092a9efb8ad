"""CreatePartitions on the active controller (Kafka's ReplicationControlManager.createPartitions).

Every topic of one request is one change (one metadata log entry, records.py): the new
partitions of all of them appear on every broker together or not at all. A topic's new
partitions keep its replication factor (its first partition's replica count); they are
placed as a new topic's are (placement.py) unless the request assigns them, one replica
list per new partition. Leader: the first live replica of the list; ISR: its live replicas.

Brokers take the new partitions from the committed metadata (replication's
metadata_publisher creates their logs); clients see them on their next metadata refresh,
and a group subscribed to the topic rebalances then (its leader sees more partitions).
"""

from __future__ import annotations

from typing import Any

from minibroker.broker.controller.placement import assign_replicas
from minibroker.broker.metadata.image import ClusterMetadata, PartitionState
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.storage.limits import partition_cap_error, replica_counts
from minibroker.protocol import INTERNAL_TOPICS
from minibroker.protocol.errors import ErrorCode


class AssignmentRefused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def create_partitions(
    controller: Any, topics: list[dict], validate_only: bool
) -> dict | PendingResponse:
    """``{"results": [{name, error_code, error_message}]}``, sent once the change commits
    (at once for ``validate_only`` or when nothing was added)."""
    limit = controller.config["controller.max.partitions.per.request"]
    md: ClusterMetadata = controller.metadata
    added = sum(
        max(0, t["count"] - len(md.topics[t["name"]].partitions))
        for t in topics
        if t["name"] in md.topics
    )
    if added > limit:
        message = (
            f"the request adds {added} partitions, over "
            f"controller.max.partitions.per.request={limit}: split it into smaller requests"
        )
        return {
            "results": [_result(t["name"], ErrorCode.POLICY_VIOLATION, message) for t in topics]
        }
    names = [t["name"] for t in topics]
    results: list[dict] = []
    with controller._change() as draft:
        live = sorted(b for b in draft.brokers if b in draft.live)
        counts = replica_counts(
            (p.replicas for t in draft.topics.values() for p in t.partitions), live
        )
        for request in topics:
            name = request["name"]
            if names.count(name) > 1:
                results.append(_result(name, ErrorCode.INVALID_REQUEST, "Duplicate topic name."))
                continue
            try:
                new = _new_partitions(draft, request, live, counts)
            except AssignmentRefused as refused:
                results.append(_result(name, refused.code, refused.message))
                continue
            results.append(_result(name, ErrorCode.NONE, None))
            if validate_only:
                continue
            topic = draft.topics[name]
            before = len(topic.partitions)
            topic.partitions.extend(new)
            controller.commit()
            controller.log.info(
                "partitions_created",
                topic=name,
                partitions_before=before,
                partitions=len(topic.partitions),
                assignments=[p.replicas for p in new],
            )
    lost = {
        "results": [
            _result(
                name,
                ErrorCode.REQUEST_TIMED_OUT,
                f"broker {controller.broker_id} lost the controller role before the change "
                "committed; it may still commit: describe the topic before retrying",
            )
            for name in names
        ]
    }
    return controller._reply({"results": results}, lost)


def _new_partitions(
    md: ClusterMetadata, request: dict, live: list[int], counts: dict[int, int]
) -> list[PartitionState]:
    """The partitions ``request`` adds to its topic, validated (``AssignmentRefused`` naming the
    problem); ``counts`` takes their replicas, so the next topic of the request sees them."""
    name, count, assignments = request["name"], request["count"], request["assignments"]
    topic = md.topics.get(name)
    if topic is None:
        raise AssignmentRefused(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic '{name}' does not exist"
        )
    if name in INTERNAL_TOPICS:
        # Group (and health) placement hashes over the partition count: it never changes.
        raise AssignmentRefused(
            ErrorCode.INVALID_REQUEST,
            f"the number of partitions of the internal topic {name} cannot be changed",
        )
    current = len(topic.partitions)
    if count == current:
        raise AssignmentRefused(
            ErrorCode.INVALID_PARTITIONS, f"Topic already has {current} partition(s)."
        )
    if count < current:
        raise AssignmentRefused(
            ErrorCode.INVALID_PARTITIONS,
            f"The topic {name} currently has {current} partition(s); "
            f"{count} would not be an increase.",
        )
    additional = count - current
    rf = len(topic.partitions[0].replicas)
    if assignments is not None:
        if len(assignments) != additional:
            raise AssignmentRefused(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"Attempted to add {additional} additional partition(s), but only "
                f"{len(assignments)} assignment(s) were specified.",
            )
        placed = [list(r) for r in assignments]
        for index, replicas in enumerate(placed, start=current):
            _check_assignment(md, index, replicas, rf)
    else:
        if rf > len(live):
            raise AssignmentRefused(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"Unable to replicate the partition {rf} time(s): only {len(live)} "
                "broker(s) are live.",
            )
        placed = assign_replicas(live, additional, rf)
    if (problem := partition_cap_error(counts, additional, rf)) is not None:
        raise AssignmentRefused(ErrorCode.POLICY_VIOLATION, problem)
    for replicas in placed:
        for broker in replicas:
            if broker in counts:
                counts[broker] += 1
    new = []
    for replicas in placed:
        isr = [r for r in replicas if r in md.live]
        new.append(PartitionState(leader=isr[0], leader_epoch=0, replicas=replicas, isr=isr))
    return new


def _check_assignment(md: ClusterMetadata, index: int, replicas: list[int], rf: int) -> None:
    """Kafka's validateManualPartitionAssignment, then "some replica is live"."""
    if not replicas:
        raise AssignmentRefused(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "The manual partition assignment includes an empty replica list.",
        )
    for broker in sorted(replicas):
        if broker not in md.brokers:
            raise AssignmentRefused(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"The manual partition assignment includes broker {broker}, but no such "
                "broker is registered.",
            )
    if len(set(replicas)) != len(replicas):
        twice = next(b for b in replicas if replicas.count(b) > 1)
        raise AssignmentRefused(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"The manual partition assignment includes the broker {twice} more than once.",
        )
    if len(replicas) != rf:
        raise AssignmentRefused(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"The manual partition assignment includes a partition with {len(replicas)} "
            f"replica(s), but this is not consistent with previous partitions, which have "
            f"{rf} replica(s).",
        )
    if not any(r in md.live for r in replicas):
        raise AssignmentRefused(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"All brokers specified in the manual partition assignment for partition {index} "
            "are fenced or in controlled shutdown.",
        )


def assigned_partitions(md: ClusterMetadata, assignments: list[list[int]]) -> list[PartitionState]:
    """A new topic's partitions from its manual assignments (CreateTopics), checked as Kafka's
    createTopic does: every partition's list as CreatePartitions', all of the first's size."""
    if not assignments:
        raise AssignmentRefused(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment is empty."
        )
    rf = len(assignments[0])
    states = []
    for index, replicas in enumerate(assignments):
        _check_assignment(md, index, list(replicas), rf)
        isr = [r for r in replicas if r in md.live]
        states.append(PartitionState(isr[0], 0, list(replicas), isr))
    return states


def _result(name: str, code: ErrorCode, message: str | None) -> dict:
    return {"name": name, "error_code": int(code), "error_message": message}
