"""TxnOffsetCommit and the markers that settle it (Kafka's GroupCoordinator
handleTxnCommitOffsets and handleTxnCompletion, KIP-98 and KIP-447).

A transactional producer's offsets are written to the group's ``__consumer_offsets``
partition in a batch stamped with its producer id and epoch (acks=all, as any commit),
and held per producer (``GroupMetadata.pending_txn_offsets``) out of OffsetFetch's sight.
When the transaction coordinator's marker for that producer lands on the partition (the
replica manager calls ``complete_txn``), they become the group's committed offsets
(commit) or are dropped (abort). A loaded partition settles them the same way from the
log (records.PartitionContents).
"""

from __future__ import annotations

from collections.abc import Callable

from minibroker.broker.coordinator.coordinator import DEAD, GroupCoordinator
from minibroker.broker.coordinator.group import GroupMetadata
from minibroker.broker.coordinator.offsets import partition_errors, store_commits
from minibroker.broker.coordinator.records import OFFSETS_TOPIC, Offset
from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol.errors import ErrorCode


def _results(topics: list[dict], code: Callable[[str, int], ErrorCode]) -> dict:
    return {"topics": partition_errors(topics, code), "throttle_time_ms": 0}


def _member_error(group: GroupMetadata, body: dict) -> ErrorCode:
    """KIP-447: a consumer's generation fences a zombie's commit (when it names one)."""
    member_id, generation = body["member_id"], body["generation_id"]
    instance_id = body.get("group_instance_id")
    if instance_id is not None and group.static_member_id(instance_id) not in (None, member_id):
        return ErrorCode.FENCED_INSTANCE_ID
    if member_id and not group.has(member_id):
        return ErrorCode.UNKNOWN_MEMBER_ID
    if generation >= 0 and generation != group.generation_id:
        return ErrorCode.ILLEGAL_GENERATION
    return ErrorCode.NONE


def txn_commit_offsets(
    coordinator: GroupCoordinator, body: dict, exists: Callable[[str, int], bool]
) -> dict | PendingResponse:
    topics = body["topics"]
    group_id = body["group_id"]
    unknown = {
        (t["name"], p["partition"])
        for t in topics
        for p in t["partitions"]
        if not exists(t["name"], p["partition"])
    }
    error = coordinator.group_error(group_id)
    group = coordinator.groups.get(group_id) if error is None else None
    if error is None and group is not None:
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE if group.is_in(DEAD) else None
        error = error or _member_error(group, body) or None
    if error is not None:
        return _results(topics, lambda t, p: error)
    if group is None:
        group = coordinator.groups[group_id] = GroupMetadata(
            group_id, coordinator.manager.partition_for(group_id), coordinator.now_ms()
        )
    producer_id = body["producer_id"]

    def settle(accepted: dict[tuple[str, int], Offset]) -> None:
        group.pending_txn_offsets.setdefault(producer_id, {}).update(accepted)

    return store_commits(
        coordinator,
        group,
        topics,
        unknown,
        settle,
        producer_id=producer_id,
        producer_epoch=body["producer_epoch"],
    )


def complete_txn(
    coordinator: GroupCoordinator, topic: str, partition: int, producer_id: int, commit: bool
) -> None:
    """A marker for ``producer_id`` is on offsets partition ``partition``: its pending
    offsets there become committed (or are dropped). Registered with the replica manager
    (``txn_marker_listeners``); other topics' markers are not ours."""
    if topic != OFFSETS_TOPIC:
        return
    settled = 0
    for group in coordinator.manager.groups_of(partition):
        pending = group.pending_txn_offsets.pop(producer_id, None)
        if pending is None:
            continue
        settled += len(pending)
        if commit and not group.is_in(DEAD):
            group.offsets.update(pending)
    if settled:
        coordinator.log.debug(
            "txn_offsets_settled",
            partition=partition,
            producer_id=producer_id,
            committed=commit,
            offsets=settled,
        )
