"""Body schemas of the consumer-group APIs (Kafka's classic group protocol).

Kafka's field names, cut to what the classic protocol needs, and no transactional commits.
Static membership (KIP-345: ``group_instance_id``, optional, None for a dynamic member) is
version 1 of each API whose request or response names it (JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit, DescribeGroups), as in Kafka: version 0 keeps the shape it had
before, so a client from before static membership, whose schemas reject unknown keys,
still reads the answers (the broker narrows them to the version asked). The ``_V1``
schemas are version 0's plus the instance id. KIP-320's committed leader epoch is, the
same way, OffsetCommit v2 (in) and OffsetFetch v1 (out). Assignments and subscriptions are
opaque bytes: the broker stores and forwards them and never looks inside (the group's
leader assigns). api.py registers these under Kafka's api keys.

Every answer carries ``throttle_time_ms`` (always 0 here), as Kafka's do; that also keeps
an answer with only an error code from reading as a bare error body, so the client reads
group errors as data (protocol.connection's rule) while a refusal still raises.
"""

from __future__ import annotations

from minibroker.protocol.schema import (
    BOOL,
    BYTES,
    INT16,
    INT32,
    INT64,
    STRING,
    Validator,
    array,
    integer,
    nullable,
    string,
    struct,
)

GROUP_ID = string(max_len=255)
MEMBER_ID = string(max_len=512)
GENERATION = INT32
_TOPIC = string(max_len=249)
_PARTITION = integer("int32", min=0)
_ERROR = INT16
_MESSAGE = (nullable(STRING), None)
_THROTTLE = {"throttle_time_ms": (INT32, 0)}
_NAME = string(max_len=255)  # protocol type and protocol names
# KIP-345's group.instance.id: None (the default) for a dynamic member. Version 1 only.
_INSTANCE = {"group_instance_id": (nullable(string(max_len=255)), None)}


def _with_instance(schema: Validator) -> Validator:
    """Version 1 of a request that names its member's instance at top level."""
    return struct(schema.fields, {**schema.optional, **_INSTANCE})


# --- FindCoordinator (10) ------------------------------------------------------------------

# key_type 0: a group id; 1: a transactional id (its transaction coordinator), as Kafka's.
FIND_COORDINATOR_REQ = struct(
    {"key": string(max_len=32767)}, {"key_type": (integer("int8", min=0, max=1), 0)}
)
FIND_COORDINATOR_RESP = struct(
    {
        "error_code": _ERROR,
        "node_id": integer("int32", min=-1),
        "host": STRING,
        "port": integer("int32", min=-1, max=65535),
    },
    {"error_message": _MESSAGE, **_THROTTLE},
)

# --- JoinGroup (11) --------------------------------------------------------------------------

JOIN_GROUP_REQ = struct(
    {
        "group_id": GROUP_ID,
        # Any int32: the coordinator answers INVALID_SESSION_TIMEOUT outside its bounds
        # (group.min/max.session.timeout.ms), -1 included, as Kafka does.
        "session_timeout_ms": INT32,
        "member_id": MEMBER_ID,
        "protocol_type": _NAME,
        "protocols": array(struct({"name": _NAME, "metadata": BYTES}), max_len=64),
    },
    # -1: as long as the session timeout (JoinGroup v0 had no rebalance timeout).
    {
        "rebalance_timeout_ms": (integer("int32", min=-1), -1),
        "reason": (nullable(STRING), None),
    },
)
JOIN_GROUP_REQ_V1 = _with_instance(JOIN_GROUP_REQ)


def _join_group_resp(member: dict) -> Validator:
    return struct(
        {
            "error_code": _ERROR,
            "generation_id": GENERATION,
            "protocol_name": nullable(_NAME),
            "leader": MEMBER_ID,
            "member_id": MEMBER_ID,
            "members": array(struct({"member_id": MEMBER_ID, "metadata": BYTES}, member)),
        },
        {"protocol_type": (nullable(_NAME), None), "error_message": _MESSAGE, **_THROTTLE},
    )


JOIN_GROUP_RESP, JOIN_GROUP_RESP_V1 = _join_group_resp({}), _join_group_resp(_INSTANCE)

# --- Heartbeat (12) --------------------------------------------------------------------------

HEARTBEAT_REQ = struct({"group_id": GROUP_ID, "generation_id": GENERATION, "member_id": MEMBER_ID})
HEARTBEAT_REQ_V1 = _with_instance(HEARTBEAT_REQ)
HEARTBEAT_RESP = struct({"error_code": _ERROR}, {"error_message": _MESSAGE, **_THROTTLE})

# --- LeaveGroup (13), v3's shape: a batch of members ---------------------------------------


def _leave_group(member: dict) -> tuple[Validator, Validator]:
    request = struct(
        {
            "group_id": GROUP_ID,
            "members": array(struct({"member_id": MEMBER_ID}, member), max_len=10000),
        }
    )
    response = struct(
        {
            "error_code": _ERROR,
            "members": array(struct({"member_id": MEMBER_ID, "error_code": _ERROR}, member)),
        },
        {"error_message": _MESSAGE, **_THROTTLE},
    )
    return request, response


LEAVE_GROUP_REQ, LEAVE_GROUP_RESP = _leave_group({})
# v1: a static member may be named by its instance id alone (member_id ""): an admin's removal.
LEAVE_GROUP_REQ_V1, LEAVE_GROUP_RESP_V1 = _leave_group(_INSTANCE)

# --- SyncGroup (14) --------------------------------------------------------------------------

SYNC_GROUP_REQ = struct(
    {
        "group_id": GROUP_ID,
        "generation_id": GENERATION,
        "member_id": MEMBER_ID,
        "assignments": array(struct({"member_id": MEMBER_ID, "assignment": BYTES})),
    },
    {
        "protocol_type": (nullable(_NAME), None),
        "protocol_name": (nullable(_NAME), None),
    },
)
SYNC_GROUP_REQ_V1 = _with_instance(SYNC_GROUP_REQ)
SYNC_GROUP_RESP = struct(
    {"error_code": _ERROR, "assignment": BYTES},
    {
        "protocol_type": (nullable(_NAME), None),
        "protocol_name": (nullable(_NAME), None),
        "error_message": _MESSAGE,
        **_THROTTLE,
    },
)

# --- OffsetCommit (8) ------------------------------------------------------------------------


def _offset_commit_req(partition: dict, top: dict) -> Validator:
    return struct(
        {
            "group_id": GROUP_ID,
            # -1 and "": a commit from outside the group (an admin's, or a consumer that
            # assigns its own partitions), accepted only while the group has no members.
            "generation_id": GENERATION,
            "member_id": MEMBER_ID,
            "topics": array(
                struct(
                    {
                        "name": _TOPIC,
                        "partitions": array(
                            struct(
                                {"partition": _PARTITION, "committed_offset": INT64},
                                {"committed_metadata": (nullable(STRING), None), **partition},
                            )
                        ),
                    }
                )
            ),
        },
        top,
    )


# v2: each partition's committed_leader_epoch (Kafka's OffsetCommit v6+; -1: unknown), kept
# with the offset and returned by OffsetFetch v1, so that a consumer resuming from a commit
# can tell whether the log was truncated under it (KIP-320).
_LEADER_EPOCH = {"committed_leader_epoch": (integer("int32", min=-1), -1)}
OFFSET_COMMIT_REQ = _offset_commit_req({}, {})
OFFSET_COMMIT_REQ_V1 = _offset_commit_req({}, _INSTANCE)
OFFSET_COMMIT_REQ_V2 = _offset_commit_req(_LEADER_EPOCH, _INSTANCE)
_PARTITION_ERRORS = array(
    struct(
        {
            "name": _TOPIC,
            "partitions": array(struct({"partition": _PARTITION, "error_code": _ERROR})),
        }
    )
)
OFFSET_COMMIT_RESP = struct({"topics": _PARTITION_ERRORS}, _THROTTLE)

# --- OffsetFetch (9) -------------------------------------------------------------------------

OFFSET_FETCH_REQ = struct(
    {
        "group_id": GROUP_ID,
        # None: every partition the group has committed.
        "topics": nullable(array(struct({"name": _TOPIC, "partition_indexes": array(_PARTITION)}))),
    },
    # KIP-447: a partition with offsets of an undecided transaction answers
    # UNSTABLE_OFFSET_COMMIT (retriable) instead of the offset it may be about to replace.
    {"require_stable": (BOOL, False)},
)


def _offset_fetch_resp(partition: dict) -> Validator:
    return struct(
        {
            "error_code": _ERROR,
            "topics": array(
                struct(
                    {
                        "name": _TOPIC,
                        "partitions": array(
                            struct(
                                {
                                    "partition": _PARTITION,
                                    "committed_offset": INT64,
                                    "metadata": nullable(STRING),
                                    "error_code": _ERROR,
                                },
                                partition,
                            )
                        ),
                    }
                )
            ),
        },
        {"error_message": _MESSAGE, **_THROTTLE},
    )


OFFSET_FETCH_RESP = _offset_fetch_resp({})
OFFSET_FETCH_RESP_V1 = _offset_fetch_resp(_LEADER_EPOCH)  # the commit's leader epoch

# --- DescribeGroups (15) ---------------------------------------------------------------------

DESCRIBE_GROUPS_REQ = struct({"groups": array(GROUP_ID, max_len=10000)})


def _describe_groups_resp(member: dict) -> Validator:
    description = struct(
        {
            "member_id": MEMBER_ID,
            "client_id": STRING,
            "client_host": STRING,
            "member_metadata": BYTES,
            "member_assignment": BYTES,
        },
        member,
    )
    return struct(
        {
            "groups": array(
                struct(
                    {
                        "error_code": _ERROR,
                        "group_id": GROUP_ID,
                        "group_state": STRING,
                        "protocol_type": STRING,
                        "protocol_data": STRING,
                        "members": array(description),
                    },
                    {"error_message": _MESSAGE},
                )
            )
        },
        _THROTTLE,
    )


DESCRIBE_GROUPS_RESP = _describe_groups_resp({})
DESCRIBE_GROUPS_RESP_V1 = _describe_groups_resp(_INSTANCE)

# --- ListGroups (16) -------------------------------------------------------------------------

LIST_GROUPS_REQ = struct({}, {"states_filter": (array(STRING, max_len=16), [])})
LIST_GROUPS_RESP = struct(
    {
        "error_code": _ERROR,
        "groups": array(
            struct({"group_id": GROUP_ID, "protocol_type": STRING, "group_state": STRING})
        ),
    },
    {"error_message": _MESSAGE, **_THROTTLE},
)

# --- DeleteGroups (42) -----------------------------------------------------------------------

DELETE_GROUPS_REQ = struct({"groups_names": array(GROUP_ID, max_len=10000)})
DELETE_GROUPS_RESP = struct(
    {"results": array(struct({"group_id": GROUP_ID, "error_code": _ERROR}))}, _THROTTLE
)

# OffsetDelete (KIP-496): Kafka's shape; a group-wide error is the top-level error_code.
OFFSET_DELETE_REQ = struct(
    {
        "group_id": GROUP_ID,
        "topics": array(
            struct(
                {
                    "name": _TOPIC,
                    "partitions": array(struct({"partition_index": _PARTITION})),
                }
            )
        ),
    }
)
OFFSET_DELETE_RESP = struct(
    {
        "error_code": _ERROR,
        "topics": array(
            struct(
                {
                    "name": _TOPIC,
                    "partitions": array(
                        struct({"partition_index": _PARTITION, "error_code": _ERROR})
                    ),
                }
            )
        ),
    },
    _THROTTLE,
)
