"""The Kafka listener's consumer-group APIs: each a translation onto the native group API
of the same key, answered by the same coordinator (broker/coordinator) as our own client.

Member ids, group instance ids (static membership, KIP-345: JoinGroup v5+, SyncGroup,
Heartbeat and LeaveGroup v3+, OffsetCommit v7+, DescribeGroups v4+; absent in older
versions, so None: a dynamic member), generations, protocol type and names pass through;
subscriptions and
assignments are opaque bytes in both protocols and are passed through untouched (the
group's leader assigns, the broker never looks inside). What differs is only the shape of
old versions: JoinGroup before v4 has no MEMBER_ID_REQUIRED round (KIP-394), LeaveGroup
before v3 names one member, OffsetFetch before v2 has no top-level error code. The
committed leader epoch (OffsetCommit v6+, OffsetFetch v5+; -1 when a version lacks it)
is kept with the offset, so a consumer resuming after a restart can detect truncation.
"""

from __future__ import annotations

from typing import Any

from minibroker.broker.network.pending import then
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode
from minibroker.protocol.kafka.acl_operations import GROUP_OPERATIONS, authorized

_MEMBER_ID_REQUIRED = int(ErrorCode.MEMBER_ID_REQUIRED)


def _code(answer: dict) -> int:
    return answer.get("error_code", 0)


def native_commits(topics: list[dict]) -> list[dict]:
    """OffsetCommit's and TxnOffsetCommit's topics in the native API's shape."""
    return [
        {
            "name": t["name"],
            "partitions": [
                {
                    "partition": p["partition_index"],
                    "committed_offset": p["committed_offset"],
                    # OffsetCommit v6+ / TxnOffsetCommit v2+ (-1 before: unknown), kept for
                    # OffsetFetch v5+ (KIP-320)
                    "committed_leader_epoch": p.get("committed_leader_epoch", -1),
                    "committed_metadata": p["committed_metadata"],
                }
                for p in t["partitions"]
            ],
        }
        for t in topics
    ]


class GroupApis:
    """Mixed into KafkaRequestHandler (``_native``, ``cache``)."""

    _native: Any
    cache: Any

    def group_handlers(self) -> dict[int, Any]:
        return {
            ApiKey.FIND_COORDINATOR: self.find_coordinator,
            ApiKey.JOIN_GROUP: self.join_group,
            ApiKey.SYNC_GROUP: self.sync_group,
            ApiKey.HEARTBEAT: self.heartbeat,
            ApiKey.LEAVE_GROUP: self.leave_group,
            ApiKey.OFFSET_COMMIT: self.offset_commit,
            ApiKey.OFFSET_FETCH: self.offset_fetch,
            ApiKey.LIST_GROUPS: self.list_groups,
            ApiKey.DESCRIBE_GROUPS: self.describe_groups,
            ApiKey.DELETE_GROUPS: self.delete_groups,
            ApiKey.OFFSET_DELETE: self.offset_delete,
        }

    def find_coordinator(self, header, body, session) -> Any:
        native = {"key": body["key"], "key_type": body.get("key_type", 0)}
        result = self._native(header, ApiKey.FIND_COORDINATOR, native, session)
        return then(result, self._coordinator_answer)

    def _coordinator_answer(self, answer: dict) -> dict:
        """The coordinator's Kafka listener, not its native one."""
        code = _code(answer)
        message = answer.get("error_message")
        broker = self.cache.metadata.brokers.get(answer.get("node_id", -1)) if not code else None
        if not code and (broker is None or not broker.kafka_port):
            code = int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
            message = "the coordinator has no Kafka listener"
        if code:
            return {"error_code": code, "error_message": message, "node_id": -1, "port": -1}
        return {
            "error_code": 0,
            "node_id": broker.node_id,
            "host": broker.kafka_host or broker.host,
            "port": broker.kafka_port,
        }

    def join_group(self, header, body, session) -> Any:
        native = {
            "group_id": body["group_id"],
            "session_timeout_ms": body["session_timeout_ms"],
            "rebalance_timeout_ms": body.get("rebalance_timeout_ms", -1),
            "member_id": body["member_id"],
            "group_instance_id": body.get("group_instance_id"),
            "protocol_type": body["protocol_type"],
            "protocols": [
                {"name": p["name"], "metadata": p["metadata"]} for p in body["protocols"]
            ],
        }
        result = self._native(header, ApiKey.JOIN_GROUP, native, session)
        if (
            header.api_version < 4
            and isinstance(result, dict)
            and result.get("error_code") == _MEMBER_ID_REQUIRED
        ):
            # Before v4 a client cannot be asked to come back with its id: join again with
            # it at once, as Kafka's coordinator does for these versions.
            native["member_id"] = result["member_id"]
            result = self._native(header, ApiKey.JOIN_GROUP, native, session)
        return then(
            result,
            lambda a: {
                "error_code": _code(a),
                "generation_id": a.get("generation_id", -1),
                "protocol_name": a.get("protocol_name") or "",
                "leader": a.get("leader", ""),
                "member_id": a.get("member_id", body["member_id"]),
                "members": [
                    {
                        "member_id": m["member_id"],
                        "group_instance_id": m.get("group_instance_id"),
                        "metadata": m["metadata"],
                    }
                    for m in a.get("members", ())
                ],
            },
        )

    def sync_group(self, header, body, session) -> Any:
        native = {
            "group_id": body["group_id"],
            "generation_id": body["generation_id"],
            "member_id": body["member_id"],
            "group_instance_id": body.get("group_instance_id"),
            "assignments": [
                {"member_id": a["member_id"], "assignment": a["assignment"]}
                for a in body["assignments"]
            ],
        }
        result = self._native(header, ApiKey.SYNC_GROUP, native, session)
        return then(
            result, lambda a: {"error_code": _code(a), "assignment": a.get("assignment", b"")}
        )

    def heartbeat(self, header, body, session) -> Any:
        native = {
            "group_id": body["group_id"],
            "generation_id": body["generation_id"],
            "member_id": body["member_id"],
            "group_instance_id": body.get("group_instance_id"),
        }
        result = self._native(header, ApiKey.HEARTBEAT, native, session)
        return then(result, lambda a: {"error_code": _code(a)})

    def leave_group(self, header, body, session) -> Any:
        batch = header.api_version >= 3  # KIP-345: a batch of members, by instance id too
        if batch:
            leaving = [
                {"member_id": m["member_id"], "group_instance_id": m.get("group_instance_id")}
                for m in body["members"]
            ]
        else:
            leaving = [{"member_id": body["member_id"], "group_instance_id": None}]
        native = {"group_id": body["group_id"], "members": leaving}
        result = self._native(header, ApiKey.LEAVE_GROUP, native, session)

        def answer(a: dict) -> dict:
            members = a.get("members") or []
            if batch:
                return {"error_code": _code(a), "members": members}
            return {"error_code": _code(a) or (members or [{}])[0].get("error_code", 0)}

        return then(result, answer)

    def offset_commit(self, header, body, session) -> Any:
        native = {
            "group_id": body["group_id"],
            # v0 has neither: a commit from outside the group, as the native API takes it.
            "generation_id": body.get("generation_id_or_member_epoch", -1),
            "member_id": body.get("member_id", ""),
            "group_instance_id": body.get("group_instance_id"),
            "topics": native_commits(body["topics"]),
        }
        result = self._native(header, ApiKey.OFFSET_COMMIT, native, session)

        def answer(a: dict) -> dict:
            code = _code(a)  # a bare error body: every partition fails with it
            topics = a.get("topics") if not code else native["topics"]
            return {
                "topics": [
                    {
                        "name": t["name"],
                        "partitions": [
                            {
                                "partition_index": p["partition"],
                                "error_code": code or p["error_code"],
                            }
                            for p in t["partitions"]
                        ],
                    }
                    for t in topics or ()
                ]
            }

        return then(result, answer)

    def offset_fetch(self, header, body, session) -> Any:
        topics = body["topics"]
        native = {
            "group_id": body["group_id"],
            "topics": None
            if topics is None
            else [{"name": t["name"], "partition_indexes": t["partition_indexes"]} for t in topics],
            "require_stable": bool(body.get("require_stable", False)),  # v7+
        }
        result = self._native(header, ApiKey.OFFSET_FETCH, native, session)

        def answer(a: dict) -> dict:
            code = _code(a)
            if code and header.api_version < 2:
                # No top-level error before v2: each asked partition carries it.
                found = [
                    {
                        "name": t["name"],
                        "partitions": [
                            {"partition": i, "committed_offset": -1, "error_code": code}
                            for i in t["partition_indexes"]
                        ],
                    }
                    for t in native["topics"] or ()
                ]
            else:
                found = a.get("topics") or ()
            return {
                "error_code": code,
                "topics": [
                    {
                        "name": t["name"],
                        "partitions": [
                            {
                                "partition_index": p["partition"],
                                "committed_offset": p["committed_offset"],
                                "committed_leader_epoch": p.get("committed_leader_epoch", -1),
                                "metadata": p.get("metadata"),
                                "error_code": p["error_code"],
                            }
                            for p in t["partitions"]
                        ],
                    }
                    for t in found
                ],
            }

        return then(result, answer)

    def list_groups(self, header, body, session) -> Any:
        result = self._native(header, ApiKey.LIST_GROUPS, {}, session)
        return then(
            result,
            lambda a: {
                "error_code": _code(a),
                "groups": [
                    {"group_id": g["group_id"], "protocol_type": g["protocol_type"]}
                    for g in a.get("groups", ())
                ],
            },
        )

    def describe_groups(self, header, body, session) -> Any:
        native = {"groups": body["groups"]}
        result = self._native(header, ApiKey.DESCRIBE_GROUPS, native, session)

        asked = body.get("include_authorized_operations", False)  # v3+

        def answer(a: dict) -> dict:
            code = _code(a)
            groups = a.get("groups") or [
                {"group_id": g, "error_code": code, "group_state": "", "members": []}
                for g in body["groups"]
            ]
            return {
                "groups": [
                    {
                        "error_code": g["error_code"],
                        "group_id": g["group_id"],
                        "group_state": g["group_state"],
                        "protocol_type": g.get("protocol_type", ""),
                        "protocol_data": g.get("protocol_data", ""),
                        # Kafka fills them in for a group described without error only
                        "authorized_operations": authorized(
                            GROUP_OPERATIONS, asked and g["error_code"] == 0
                        ),
                        "members": [
                            {
                                "member_id": m["member_id"],
                                "group_instance_id": m.get("group_instance_id"),
                                "client_id": m["client_id"],
                                "client_host": m["client_host"],
                                "member_metadata": m["member_metadata"],
                                "member_assignment": m["member_assignment"],
                            }
                            for m in g["members"]
                        ],
                    }
                    for g in groups
                ]
            }

        return then(result, answer)

    def delete_groups(self, header, body, session) -> Any:
        native = {"groups_names": body["groups_names"]}
        result = self._native(header, ApiKey.DELETE_GROUPS, native, session)

        def answer(a: dict) -> dict:
            code = _code(a)
            results = a.get("results") or [
                {"group_id": g, "error_code": code} for g in body["groups_names"]
            ]
            return {
                "results": [
                    {"group_id": r["group_id"], "error_code": r["error_code"]} for r in results
                ]
            }

        return then(result, answer)

    def offset_delete(self, header, body, session) -> Any:
        """Kafka's shape already (broker/coordinator/offset_delete.py decides)."""
        native = {
            "group_id": body["group_id"],
            "topics": [
                {
                    "name": t["name"],
                    "partitions": [
                        {"partition_index": p["partition_index"]} for p in t["partitions"]
                    ],
                }
                for t in body["topics"]
            ],
        }
        result = self._native(header, ApiKey.OFFSET_DELETE, native, session)

        def answer(a: dict) -> dict:
            return {
                "error_code": _code(a),
                "throttle_time_ms": 0,
                "topics": a.get("topics") or [],
            }

        return then(result, answer)
