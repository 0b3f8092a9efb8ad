"""Hypothesis on the group APIs' bodies, as test_protocol.py does for every API's shape:
here past the schema too, into the coordinator.

1. A well-formed body with one field replaced by junk is refused with InvalidRequest or
   accepted, and what is accepted is answered (nothing else raises).
2. Runs of well-typed requests on a few group and member ids (ids the coordinator hands
   out are reused, so requests hit real members, generations and states), with the clock
   moving between them: every answer, parked ones included, is valid by its response
   schema, and the groups stay consistent.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minibroker.protocol as p
from minibroker.broker.coordinator import GroupState
from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol.api import NEWEST_VERSIONS
from tests.unit.test_group_coordinator import Harness
from tests.unit.test_protocol import json_like

GROUP_APIS = [
    p.ApiKey.JOIN_GROUP,
    p.ApiKey.SYNC_GROUP,
    p.ApiKey.HEARTBEAT,
    p.ApiKey.LEAVE_GROUP,
    p.ApiKey.OFFSET_COMMIT,
    p.ApiKey.OFFSET_FETCH,
    p.ApiKey.LIST_GROUPS,
    p.ApiKey.DESCRIBE_GROUPS,
    p.ApiKey.DELETE_GROUPS,
]
FUZZ = settings(
    max_examples=150,
    deadline=None,
    # One coordinator for all examples: state left by one example is the next one's start.
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path, **{"group.min.session.timeout.ms": 10})
    harness.own()
    yield harness
    harness.rm.close()


# --- well-typed bodies over a small world of ids ----------------------------------------------

# Repeats weight the draw: mostly requests that can succeed, so groups get members,
# generations and rebalances for the odd ones to hit.
groups = st.sampled_from(["g", "g", "g", "h", ""])
ints = st.integers(-(2**31), 2**31 - 1)
names = st.sampled_from(["range", "roundrobin", "x"])


def member_ids(known: list[str]) -> st.SearchStrategy[str]:
    return st.sampled_from(["", "stranger", *known, *known[-3:] * 3])


def body_for(
    api: int, known: list[str], generations: tuple[int, ...] = ()
) -> st.SearchStrategy[dict]:
    members = member_ids(known)
    generation = st.one_of(st.sampled_from([-1, 0, *generations * 3]), ints)
    # What SyncGroup, Heartbeat and OffsetCommit name themselves by.
    member = {"group_id": groups, "generation_id": generation, "member_id": members}
    if api == p.ApiKey.JOIN_GROUP:
        return st.fixed_dictionaries(
            {
                "group_id": groups,
                "member_id": members,
                "session_timeout_ms": st.one_of(
                    st.sampled_from([10, 1000, 10_000]), st.integers(0, 2**31 - 1)
                ),
                "rebalance_timeout_ms": st.one_of(
                    st.sampled_from([-1, 100, 10_000]), st.integers(-1, 2**31 - 1)
                ),
                "protocol_type": st.sampled_from(["consumer", "consumer", "connect", ""]),
                "protocols": st.lists(
                    st.fixed_dictionaries({"name": names, "metadata": st.binary(max_size=8)}),
                    max_size=3,
                ),
            }
        )
    if api == p.ApiKey.SYNC_GROUP:
        return st.fixed_dictionaries(
            {
                **member,
                "assignments": st.lists(
                    st.fixed_dictionaries(
                        {"member_id": members, "assignment": st.binary(max_size=8)}
                    ),
                    max_size=4,
                ),
                "protocol_type": st.sampled_from([None, "consumer", "connect"]),
                "protocol_name": st.one_of(st.none(), names),
            }
        )
    if api == p.ApiKey.HEARTBEAT:
        return st.fixed_dictionaries(member)
    if api == p.ApiKey.LEAVE_GROUP:
        return st.fixed_dictionaries(
            {
                "group_id": groups,
                "members": st.lists(st.fixed_dictionaries({"member_id": members}), max_size=3),
            }
        )
    partitions = st.integers(0, 3)
    if api == p.ApiKey.OFFSET_COMMIT:
        return st.fixed_dictionaries(
            {
                **member,
                "topics": st.lists(
                    st.fixed_dictionaries(
                        {
                            "name": st.sampled_from(["t", "u"]),
                            "partitions": st.lists(
                                st.fixed_dictionaries(
                                    {
                                        "partition": partitions,
                                        "committed_offset": st.integers(-(2**63), 2**63 - 1),
                                        "committed_metadata": st.one_of(
                                            st.none(), st.text(max_size=4)
                                        ),
                                    }
                                ),
                                max_size=3,
                            ),
                        }
                    ),
                    max_size=2,
                ),
            }
        )
    if api == p.ApiKey.OFFSET_FETCH:
        return st.fixed_dictionaries(
            {
                "group_id": groups,
                "topics": st.one_of(
                    st.none(),
                    st.lists(
                        st.fixed_dictionaries(
                            {
                                "name": st.sampled_from(["t", "u"]),
                                "partition_indexes": st.lists(partitions, max_size=3),
                            }
                        ),
                        max_size=2,
                    ),
                ),
            }
        )
    if api == p.ApiKey.LIST_GROUPS:
        return st.fixed_dictionaries(
            {"states_filter": st.lists(st.sampled_from([s.value for s in GroupState]), max_size=2)}
        )
    if api == p.ApiKey.DESCRIBE_GROUPS:
        return st.fixed_dictionaries({"groups": st.lists(groups, max_size=3)})
    return st.fixed_dictionaries({"groups_names": st.lists(groups, max_size=3)})


def answered(h: Harness, api: int, raw: dict, parked: list) -> dict | None:
    """Call; check a direct answer against the response schema; remember a parked one."""
    answer = h.call(api, raw)
    if isinstance(answer, PendingResponse):
        parked.append((api, answer))
        return None
    p.validate_response(api, NEWEST_VERSIONS[api], answer)
    return answer


def learn(api: int, answer: dict, known: list[str], generations: set[int]) -> None:
    """A join's member id and generation are what the next requests should use."""
    if api == p.ApiKey.JOIN_GROUP:
        if answer["member_id"]:
            known.append(answer["member_id"])
        if answer["generation_id"] >= 0:
            generations.add(answer["generation_id"])


def check_parked(parked: list, known: list[str], generations: set[int]) -> None:
    """Answers set meanwhile are valid too."""
    for api, pending in list(parked):
        if pending.body is not None:
            p.validate_response(api, NEWEST_VERSIONS[api], pending.body)
            parked.remove((api, pending))
            learn(api, pending.body, known, generations)


def check_groups(h: Harness) -> None:
    for group in h.groups.values():
        members = set(group.members)
        assert group.pending_sync_members <= members
        assert group.leader_id is None or group.leader_id in members
        assert group.generation_id >= 0
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            assert members, group
        if group.state is GroupState.EMPTY:
            assert not members, group


# --- 1. one field of junk ---------------------------------------------------------------------


@FUZZ
@given(st.sampled_from(GROUP_APIS), st.data(), json_like)
def test_a_junk_field_is_refused_or_answered(h, api, data, junk):
    raw = data.draw(body_for(api, []))
    if raw:
        field = data.draw(st.sampled_from(sorted(raw)))
        raw[field] = junk
    try:
        p.validate_request(p.RequestHeader(api, NEWEST_VERSIONS[api], 1, "fuzz"), raw)
    except p.InvalidRequest:
        return
    answered(h, api, raw, [])


# --- 2. runs of requests against one coordinator --------------------------------------------


def repaired(h: Harness, raw: dict, member: tuple[str, str] | None) -> dict:
    """The body as a well-behaved member of ``member``'s group would send it: that
    group and id, its current generation, sane timeouts and protocols."""
    raw = dict(raw)
    group_id, member_id = member or ("g", "")
    group = h.groups.get(group_id)
    for key, value in (
        ("group_id", group_id),
        ("member_id", member_id),
        ("generation_id", group.generation_id if group is not None else -1),
        ("session_timeout_ms", 10_000),
        ("rebalance_timeout_ms", 10_000),
        ("protocol_type", "consumer"),
        ("protocols", [{"name": "range", "metadata": b"t"}]),
    ):
        if key in raw:
            raw[key] = value
    if "members" in raw:
        raw["members"] = [{"member_id": member_id}]
    return raw


def next_apis(h: Harness, member: tuple[str, str] | None) -> list[int]:
    """What a consumer in ``member``'s place would send next (None: a new member)."""
    group = h.groups.get(member[0]) if member is not None else None
    if group is None or member[1] not in group.members:
        return [p.ApiKey.JOIN_GROUP]
    if group.state is GroupState.PREPARING_REBALANCE:
        return [p.ApiKey.JOIN_GROUP, p.ApiKey.HEARTBEAT]
    if group.state is GroupState.COMPLETING_REBALANCE:
        return [p.ApiKey.SYNC_GROUP]
    return [p.ApiKey.HEARTBEAT, p.ApiKey.OFFSET_COMMIT, p.ApiKey.LEAVE_GROUP, p.ApiKey.JOIN_GROUP]


@FUZZ
@given(st.data())
def test_request_runs_get_valid_answers_and_keep_groups_consistent(data):
    """Half the requests come from well-behaved members (so groups form, rebalance and
    settle), half are any well-typed body; the clock jumps now and then. A coordinator
    of its own per run: what is drawn depends on its answers, so it must start alike."""
    with tempfile.TemporaryDirectory(prefix="minibroker-fuzz-") as tmp:
        h = Harness(Path(tmp), **{"group.min.session.timeout.ms": 10})
        h.own()
        try:
            request_run(h, data)
        finally:
            h.rm.close()


def request_run(h: Harness, data: st.DataObject) -> None:
    known: list[str] = []
    members: list[tuple[str, str]] = []  # (group, member id) the coordinator handed out
    generations: set[int] = set()
    parked: list = []
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        if data.draw(st.integers(0, 5), label="tick") == 0:
            h.clock.advance(data.draw(st.sampled_from([1, 10, 100, 5_000, 400_000]), label="ms"))
        else:
            behaved = data.draw(st.booleans(), label="well-behaved")
            member = data.draw(st.sampled_from([None, *members]), label="member")
            api = data.draw(
                st.sampled_from(next_apis(h, member) if behaved else GROUP_APIS), label="api"
            )
            raw = data.draw(body_for(api, known, tuple(sorted(generations))), label="body")
            if behaved:
                raw = repaired(h, raw, member)
            try:
                p.validate_request(p.RequestHeader(api, NEWEST_VERSIONS[api], 1, "fuzz"), raw)
            except p.InvalidRequest:
                continue  # a junk-free body can still break a bound (an empty group id)
            answer = answered(h, api, raw, parked)
            if answer is not None:
                learn(api, answer, known, generations)
                if api == p.ApiKey.JOIN_GROUP and answer["member_id"]:
                    members.append((raw["group_id"], answer["member_id"]))
        check_parked(parked, known, generations)
        check_groups(h)
