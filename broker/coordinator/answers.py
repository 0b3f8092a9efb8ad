"""The JoinGroup and SyncGroup answers the coordinator builds, for its join and sync paths
and for static members' takeovers (static.py) alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

from minibroker.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from minibroker.broker.coordinator.group import GroupMetadata


def join_error(member_id: str, error: ErrorCode, message: str | None = None) -> dict:
    return {
        "error_code": int(error),
        "generation_id": -1,
        "protocol_type": None,
        "protocol_name": None,
        "leader": "",
        "member_id": member_id,
        "members": [],
        "error_message": message,
        "throttle_time_ms": 0,
    }


def sync_answer(
    error: ErrorCode, assignment: bytes = b"", group: GroupMetadata | None = None
) -> dict:
    return {
        "error_code": int(error),
        "assignment": assignment,
        "protocol_type": group.protocol_type if group is not None else None,
        "protocol_name": group.protocol_name if group is not None else None,
        "throttle_time_ms": 0,
    }
