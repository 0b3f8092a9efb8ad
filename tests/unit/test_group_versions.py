"""Static membership as version 1 of the native group APIs: version 0 keeps the shape it
had before group.instance.id, an answer is narrowed to the version asked, and the client
asks for the newest version both sides have (a static member refuses a v0-only broker)."""

from __future__ import annotations

import pytest

import minibroker.protocol as p
from minibroker.client.connection import negotiated_versions
from minibroker.client.group import GroupMembership
from minibroker.protocol.api import NEWEST_VERSIONS, SCHEMAS
from minibroker.protocol.errors import UnsupportedVersion
from minibroker.protocol.schema import narrow

K = p.ApiKey
INSTANCE = "group_instance_id"
# Where v1 names the instance: (request paths, response paths), "" the top level.
GAINED = {
    K.JOIN_GROUP: ({""}, {"members[]"}),
    K.SYNC_GROUP: ({""}, set()),
    K.HEARTBEAT: ({""}, set()),
    K.LEAVE_GROUP: ({"members[]"}, {"members[]"}),
    K.OFFSET_COMMIT: ({""}, set()),
    K.DESCRIBE_GROUPS: (set(), {"groups[].members[]"}),
}


def instance_paths(schema, path: str = "") -> set[str]:
    """Every struct path in ``schema`` that knows group_instance_id."""
    out = set()
    if hasattr(schema, "fields"):
        if INSTANCE in schema.optional:
            out.add(path)
        for name, validator in {
            **schema.fields,
            **{n: v for n, (v, _) in schema.optional.items()},
        }.items():
            out |= instance_paths(validator, f"{path}.{name}" if path else name)
    elif hasattr(schema, "item"):
        out |= instance_paths(schema.item, f"{path}[]")
    elif hasattr(schema, "inner"):
        out |= instance_paths(schema.inner, path)
    return out


@pytest.mark.parametrize("api", list(GAINED))
def test_v1_adds_the_instance_id_where_kafka_has_it_and_v0_has_none(api):
    assert {0, 1} <= set(SCHEMAS[api])
    request0, response0 = SCHEMAS[api][0]
    request1, response1 = SCHEMAS[api][1]
    assert instance_paths(request0) == instance_paths(response0) == set()
    assert (instance_paths(request1), instance_paths(response1)) == GAINED[api]


def test_apis_without_the_instance_id_stay_at_version_0():
    for api in (K.FIND_COORDINATOR, K.LIST_GROUPS, K.DELETE_GROUPS):
        assert NEWEST_VERSIONS[api] == 0


def test_the_committed_leader_epoch_is_offset_commit_v2_and_offset_fetch_v1():
    """KIP-320's epoch: in the versions after the ones that lack it, which are unchanged (a
    commit without it keeps the instance id; an older client's answer is narrowed)."""
    epoch = "committed_leader_epoch"
    commit = {"group_id": "g", "generation_id": -1, "member_id": "", "group_instance_id": "i",
              "topics": [{"name": "t", "partitions": [{"partition": 0, "committed_offset": 5,
                                                        epoch: 3}]}]}  # fmt: skip
    v2 = p.validate_request(p.RequestHeader(K.OFFSET_COMMIT, 2, 1, "c"), commit)
    assert v2["topics"][0]["partitions"][0][epoch] == 3
    with pytest.raises(p.ProtocolError, match=epoch):
        p.validate_request(p.RequestHeader(K.OFFSET_COMMIT, 1, 1, "c"), commit)
    partition = {"partition": 0, "committed_offset": 5, "metadata": None, "error_code": 0}
    fetched = {"error_code": 0, "topics": [{"name": "t", "partitions": [{**partition, epoch: 3}]}]}
    v1 = p.validate_response(K.OFFSET_FETCH, 1, fetched)
    v0 = p.validate_response(K.OFFSET_FETCH, 0, narrow(SCHEMAS[K.OFFSET_FETCH][0][1], v1))
    assert v0["topics"][0]["partitions"] == [partition]


def test_a_v1_answer_narrowed_to_v0_is_a_valid_v0_answer():
    member = {"member_id": "m", "client_id": "c", "client_host": "h", "member_metadata": b"",
              "member_assignment": b"", INSTANCE: "i"}  # fmt: skip
    group = {"error_code": 0, "group_id": "g", "group_state": "Stable", "protocol_type": "consumer",
             "protocol_data": "range", "members": [member], "error_message": None}  # fmt: skip
    v1 = p.validate_response(K.DESCRIBE_GROUPS, 1, {"groups": [group]})
    with pytest.raises(p.ProtocolError, match=INSTANCE):
        p.validate_response(K.DESCRIBE_GROUPS, 0, v1)
    v0 = p.validate_response(K.DESCRIBE_GROUPS, 0, narrow(SCHEMAS[K.DESCRIBE_GROUPS][0][1], v1))
    assert v0["groups"][0]["members"] == [{k: v for k, v in member.items() if k != INSTANCE}]
    assert v0["groups"][0]["group_state"] == "Stable"


def test_the_client_asks_for_the_newest_version_both_sides_have():
    advertised = [[int(K.JOIN_GROUP), 0, 5], [int(K.HEARTBEAT), 0, 0], [int(K.SYNC_GROUP), 2, 3]]
    advertised += [[999, 0, 1], [int(K.FETCH), 0, 0]]
    assert negotiated_versions(advertised) == {K.JOIN_GROUP: 1, K.HEARTBEAT: 0, K.FETCH: 0}


def membership(instance: str | None) -> GroupMembership:
    config = {"group.id": "g", "group.instance.id": instance, "retry.backoff.ms": 100}
    return GroupMembership(None, config, lambda *a, **k: None)  # type: ignore[arg-type]


def test_a_dynamic_member_speaks_v0_without_the_key_and_a_static_one_refuses_it():
    body = {"group_id": "g", "generation_id": 1, "member_id": "m", INSTANCE: None}
    dynamic = membership(None)
    assert dynamic._in_version(K.HEARTBEAT, 1, body) == body
    assert dynamic._in_version(K.HEARTBEAT, 0, body) == {k: body[k] for k in body if k != INSTANCE}
    static = membership("i")
    body[INSTANCE] = "i"
    assert static._in_version(K.HEARTBEAT, 1, body) == body
    with pytest.raises(
        UnsupportedVersion, match=r"group\.instance\.id needs a broker with static membership"
    ):
        static._in_version(K.HEARTBEAT, 0, body)
