"""OffsetCommit, OffsetFetch, ListGroups, DescribeGroups and DeleteGroups over the groups a
GroupCoordinator serves (Kafka's GroupCoordinator.handleCommitOffsets and friends).

A commit is acknowledged only once its records are on every in-sync replica (acks=all
through the replica manager's produce purgatory); only then does it enter the cache
that OffsetFetch reads, so a fetch never shows an offset a failover could lose.
"""

from __future__ import annotations

from collections.abc import Callable

from minibroker.broker.coordinator.coordinator import (
    COMPLETING,
    DEAD,
    EMPTY,
    STABLE,
    GroupCoordinator,
)
from minibroker.broker.coordinator.group import GroupMetadata, GroupState
from minibroker.broker.coordinator.records import (
    Offset,
    group_key,
    offset_key,
    offset_value,
)
from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol.errors import ErrorCode

_NO_OFFSET = Offset(-1, "", -1)  # what OffsetFetch answers for a partition never committed


def partition_errors(topics: list[dict], code: Callable[[str, int], ErrorCode]) -> list[dict]:
    return [
        {
            "name": t["name"],
            "partitions": [
                {"partition": p["partition"], "error_code": int(code(t["name"], p["partition"]))}
                for p in t["partitions"]
            ],
        }
        for t in topics
    ]


def _commit_error(
    group: GroupMetadata | None, generation_id: int, member_id: str, instance_id: str | None
) -> ErrorCode:
    """Kafka's doCommitOffsets checks, in its order."""
    if group is None:
        return ErrorCode.NONE if generation_id < 0 else ErrorCode.ILLEGAL_GENERATION
    if group.is_in(DEAD):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if instance_id is not None and group.static_member_id(instance_id) not in (None, member_id):
        return ErrorCode.FENCED_INSTANCE_ID  # a restarted static member's zombie (KIP-345)
    if generation_id < 0 and group.is_in(EMPTY):
        return ErrorCode.NONE  # from outside the group: an admin, or a consumer that assigns
    if group.is_in(COMPLETING):
        return ErrorCode.REBALANCE_IN_PROGRESS
    if not group.has(member_id):
        return ErrorCode.UNKNOWN_MEMBER_ID
    if generation_id != group.generation_id:
        return ErrorCode.ILLEGAL_GENERATION
    return ErrorCode.NONE


def commit_offsets(
    coordinator: GroupCoordinator, body: dict, exists: Callable[[str, int], bool]
) -> dict | PendingResponse:
    """Kafka's handleOffsetCommitRequest: a partition that does not ``exist`` is answered
    UNKNOWN_TOPIC_OR_PARTITION and nothing is stored for it; the rest are committed as the
    group allows. With none left, the group is not even looked at (nor created)."""
    group_id = body["group_id"]
    topics = body["topics"]
    unknown = {
        (t["name"], p["partition"])
        for t in topics
        for p in t["partitions"]
        if not exists(t["name"], p["partition"])
    }
    if unknown and len(unknown) == sum(len(t["partitions"]) for t in topics):
        return {
            "topics": partition_errors(topics, lambda t, p: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
            "throttle_time_ms": 0,
        }
    error = coordinator.group_error(group_id)
    group = coordinator.groups.get(group_id) if error is None else None
    if error is None:
        error = _commit_error(
            group, body["generation_id"], body["member_id"], body.get("group_instance_id")
        )
    if error is not ErrorCode.NONE:
        return {
            "topics": partition_errors(
                topics,
                lambda t, p: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if (t, p) in unknown else error,
            ),
            "throttle_time_ms": 0,
        }
    if group is None:
        group = coordinator.groups[group_id] = GroupMetadata(
            group_id, coordinator.manager.partition_for(group_id), coordinator.now_ms()
        )
    elif group.has(body["member_id"]):
        coordinator.complete_and_schedule_heartbeat(group, group.get(body["member_id"]))
    return store_commits(coordinator, group, topics, unknown, group.offsets.update)


def store_commits(
    coordinator: GroupCoordinator,
    group: GroupMetadata,
    topics: list[dict],
    unknown: set[tuple[str, int]],
    settle: Callable[[dict[tuple[str, int], Offset]], None],
    **append_options: int,
) -> dict | PendingResponse:
    """The write half of OffsetCommit and TxnOffsetCommit: each partition's offset is
    checked (``offset.metadata.max.bytes``), the accepted ones are appended acks=all to the
    group's partition, and only once they are stored does ``settle`` take them (into the
    committed offsets, or a transaction's pending ones) and each partition get its answer."""
    limit = coordinator.config["offset.metadata.max.bytes"]
    now = coordinator.manager.now_ms_wall()
    accepted: dict[tuple[str, int], Offset] = {}
    too_large: set[tuple[str, int]] = set()
    for t in topics:
        for p in t["partitions"]:
            tp = (t["name"], p["partition"])
            metadata = p["committed_metadata"]
            if tp in unknown:
                continue
            if metadata is not None and len(metadata.encode()) > limit:
                too_large.add(tp)
            else:
                epoch = p.get("committed_leader_epoch", -1)  # v2+; older versions: unknown
                accepted[tp] = Offset(p["committed_offset"], metadata, now, epoch)
    response = PendingResponse()

    def answer(stored: ErrorCode) -> None:
        if stored is ErrorCode.NONE and not group.is_in(DEAD):
            settle(accepted)
        response.set(
            {
                "topics": partition_errors(
                    topics,
                    lambda t, p: (
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                        if (t, p) in unknown
                        else ErrorCode.OFFSET_METADATA_TOO_LARGE
                        if (t, p) in too_large
                        else stored
                    ),
                ),
                "throttle_time_ms": 0,
            }
        )

    if not accepted:
        answer(ErrorCode.NONE)
    else:
        entries = [
            (offset_key(group.group_id, t, p), offset_value(value))
            for (t, p), value in accepted.items()
        ]
        coordinator.manager.append(group.partition, entries, answer, **append_options)
    return response.body if response.body is not None else response


def fetch_offsets(coordinator: GroupCoordinator, body: dict) -> dict:
    group_id = body["group_id"]
    error = coordinator.group_error(group_id)
    if error is not None:
        return {"error_code": int(error), "topics": [], "throttle_time_ms": 0}
    group = coordinator.groups.get(group_id)
    offsets = group.offsets if group is not None else {}
    wanted = body["topics"]
    if wanted is None:
        pairs = sorted(offsets)
    else:
        pairs = [(t["name"], p) for t in wanted for p in t["partition_indexes"]]
    # KIP-447 (Kafka's getOffsets with requireStable): a partition an open transaction
    # has offsets for is unstable; the consumer retries rather than start from an offset
    # the commit is about to move.
    unstable: set[tuple[str, int]] = set()
    if body.get("require_stable") and group is not None:
        for pending in group.pending_txn_offsets.values():
            unstable.update(pending)
    topics: dict[str, list] = {}
    for tp in pairs:
        if tp in unstable:
            commit, code = _NO_OFFSET, ErrorCode.UNSTABLE_OFFSET_COMMIT
        else:
            commit, code = offsets.get(tp, _NO_OFFSET), ErrorCode.NONE
        topics.setdefault(tp[0], []).append(
            {
                "partition": tp[1],
                "committed_offset": commit.offset,
                "committed_leader_epoch": commit.leader_epoch,
                "metadata": commit.metadata,
                "error_code": int(code),
            }
        )
    return {
        "error_code": 0,
        "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()],
        "throttle_time_ms": 0,
    }


def list_groups(coordinator: GroupCoordinator, body: dict) -> dict:
    wanted = {s.lower() for s in body["states_filter"]}
    groups = [
        {
            "group_id": g.group_id,
            "protocol_type": g.protocol_type or "",
            "group_state": g.state.value,
        }
        for g in coordinator.groups.values()
        if not wanted or g.state.value.lower() in wanted
    ]
    # Kafka answers what it has, flagged, while a partition is still loading.
    loading = coordinator.manager.loading
    error = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if loading else ErrorCode.NONE
    return {"error_code": int(error), "groups": groups, "throttle_time_ms": 0}


def describe_groups(coordinator: GroupCoordinator, body: dict) -> dict:
    out = []
    for group_id in body["groups"]:
        entry = {
            "error_code": 0,
            "group_id": group_id,
            "group_state": GroupState.DEAD.value,
            "protocol_type": "",
            "protocol_data": "",
            "members": [],
        }
        error = coordinator.group_error(group_id)
        group = coordinator.groups.get(group_id)
        if error is not None:
            entry["error_code"] = int(error)
            entry["group_state"] = ""
        elif group is not None:
            stable = group.is_in(STABLE)
            protocol = group.protocol_name if stable else None
            entry.update(
                group_state=group.state.value,
                protocol_type=group.protocol_type or "",
                protocol_data=protocol or "",
                members=[
                    {
                        "member_id": m.member_id,
                        "group_instance_id": m.group_instance_id,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        # Kafka shows metadata and assignment only once they are settled.
                        "member_metadata": m.metadata(protocol) if protocol else b"",
                        "member_assignment": m.assignment if stable else b"",
                    }
                    for m in group.members.values()
                ],
            )
        out.append(entry)
    return {"groups": out, "throttle_time_ms": 0}


def delete_groups(coordinator: GroupCoordinator, body: dict) -> dict | PendingResponse:
    """Only an Empty group can go; its metadata and offsets become tombstones (acks=all)."""
    results: dict[str, ErrorCode] = {}
    writes: dict[int, list[tuple[bytes, None]]] = {}
    for group_id in body["groups_names"]:
        error = coordinator.group_error(group_id)
        group = coordinator.groups.get(group_id) if error is None else None
        if error is None and (group is None or group.is_in(DEAD)):
            error = ErrorCode.GROUP_ID_NOT_FOUND
        elif error is None and not group.is_in(EMPTY):
            error = ErrorCode.NON_EMPTY_GROUP
        if error is not None:
            results[group_id] = error
            continue
        group.transition_to(DEAD, coordinator.now_ms())
        del coordinator.groups[group_id]
        results[group_id] = ErrorCode.NONE
        entries = writes.setdefault(group.partition, [])
        entries.append((group_key(group_id), None))
        entries += [(offset_key(group_id, t, p), None) for t, p in group.offsets]
    response = PendingResponse()
    waiting = [len(writes)]

    def finish() -> None:
        response.set(
            {
                "results": [{"group_id": g, "error_code": int(c)} for g, c in results.items()],
                "throttle_time_ms": 0,
            }
        )

    def written(partition: int) -> Callable[[ErrorCode], None]:
        def done(error: ErrorCode) -> None:
            if error is not ErrorCode.NONE:
                for key, _ in writes[partition]:
                    for group_id, code in results.items():
                        if code is ErrorCode.NONE and key == group_key(group_id):
                            results[group_id] = error
            waiting[0] -= 1
            if waiting[0] == 0:
                finish()

        return done

    if not writes:
        finish()
    for partition, entries in writes.items():
        coordinator.manager.append(partition, entries, written(partition))
    return response.body if response.body is not None else response
