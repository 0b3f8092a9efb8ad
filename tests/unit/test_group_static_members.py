"""Static membership (KIP-345, ``group.instance.id``) on a manual clock: a restarted static
member takes its old member over without a rebalance, the old id is fenced, a static member
that does not rejoin stays until its session expires, LeaveGroup by instance id, and the
instance ids survive a coordinator move (Kafka's GroupCoordinatorTest static cases).
"""

from __future__ import annotations

import pytest
import trio

import minibroker.protocol as p
from minibroker.broker.coordinator import OFFSETS_TOPIC, GroupState
from minibroker.broker.metadata.image import PartitionState
from minibroker.protocol.errors import ErrorCode
from tests.unit.test_group_coordinator import SESSION, Harness, _body, _done, make

E = ErrorCode
STABLE = GroupState.STABLE


@pytest.fixture
def h(tmp_path):
    harness = make(tmp_path)
    yield harness
    harness.rm.close()


def join(
    h: Harness, instance: str | None, member_id: str = "", protocols=(("range", b"sub"),), **kw
):
    return h.call(
        p.ApiKey.JOIN_GROUP,
        {
            "group_id": "g",
            "member_id": member_id,
            "group_instance_id": instance,
            "session_timeout_ms": kw.get("session", SESSION),
            "rebalance_timeout_ms": kw.get("rebalance", 30_000),
            "protocol_type": "consumer",
            "protocols": [{"name": n, "metadata": m} for n, m in protocols],
        },
    )


def sync(h: Harness, member_id: str, generation: int, instance=None, assignments=None):
    return h.call(
        p.ApiKey.SYNC_GROUP,
        {
            "group_id": "g",
            "generation_id": generation,
            "member_id": member_id,
            "group_instance_id": instance,
            "assignments": [
                {"member_id": m, "assignment": a} for m, a in (assignments or {}).items()
            ],
        },
    )


def heartbeat(h: Harness, member_id: str, generation: int, instance=None) -> int:
    body = {"group_id": "g", "generation_id": generation, "member_id": member_id}
    body["group_instance_id"] = instance
    return h.call(p.ApiKey.HEARTBEAT, body)["error_code"]


def leave(h: Harness, *members: tuple[str, str | None]) -> list[dict]:
    body = {
        "group_id": "g",
        "members": [{"member_id": m, "group_instance_id": i} for m, i in members],
    }
    return h.call(p.ApiKey.LEAVE_GROUP, body)["members"]


def commit_code(h: Harness, member_id: str, generation: int, instance=None) -> int:
    answer = h.call(
        p.ApiKey.OFFSET_COMMIT,
        {
            "group_id": "g",
            "generation_id": generation,
            "member_id": member_id,
            "group_instance_id": instance,
            "topics": [{"name": "t", "partitions": [{"partition": 0, "committed_offset": 1}]}],
        },
    )
    return _body(answer)["topics"][0]["partitions"][0]["error_code"]


def static_and_dynamic(h: Harness, static_leads: bool = True, rebalance: int = 30_000):
    """A Stable group of static member "s1" and a dynamic member, the first to join leading;
    returns (static id, dynamic id, generation, leader). Each member's assignment is its
    own id, so a test can tell whose partitions a member got."""
    if static_leads:
        first = _body(join(h, "s1", rebalance=rebalance))  # generation 1, alone
        s = first["member_id"]
        d, d_join = h.new_member(rebalance=rebalance)  # a rebalance: s rejoins
        s_join = join(h, "s1", s, rebalance=rebalance)
    else:
        d, _ = h.new_member(rebalance=rebalance)
        s_join = join(h, "s1", rebalance=rebalance)  # a new static member: no id round
        d_join = h.join(d, rebalance=rebalance)
        s = _body(s_join)["member_id"]
    assert s.startswith("s1-")  # Kafka's id for a static member: instance id, a uuid
    gen = _body(s_join)["generation_id"]
    leader = _body(s_join)["leader"]
    assert _body(d_join)["generation_id"] == gen
    instance = {s: "s1", d: None}
    follower = d if leader == s else s
    pending = sync(h, follower, gen, instance[follower])
    plan = {s: s.encode(), d: d.encode()}
    assert _body(sync(h, leader, gen, instance[leader], plan))["error_code"] == 0
    assert _body(pending)["assignment"] == follower.encode()
    assert h.state() is STABLE
    return s, d, gen, leader


def test_a_static_member_joins_without_the_member_id_round(h):
    answer = _body(join(h, "s1"))
    assert answer["error_code"] == 0  # no MEMBER_ID_REQUIRED: its instance id identifies it
    assert answer["member_id"].startswith("s1-")
    assert answer["generation_id"] == 1
    assert h.groups["g"].static_members == {"s1": answer["member_id"]}


def test_a_restarted_static_leader_gets_its_assignment_back_without_a_rebalance(h):
    old, dyn, gen, leader = static_and_dynamic(h, static_leads=True)
    assert leader == old
    # The process restarts: it knows its instance id, not its member id.
    answer = join(h, "s1")
    assert _done(answer)  # the new id was stored: one acks=all append on a one-replica log
    body = _body(answer)
    new = body["member_id"]
    assert new != old and new.startswith("s1-")
    assert body["error_code"] == 0
    assert body["generation_id"] == gen  # the same generation: no rebalance
    # It is told the old leader id, so it does not assign (a Stable group would not
    # hand out a new plan); the group's leader is now its new id.
    assert body["leader"] == old
    assert body["members"] == []
    group = h.groups["g"]
    assert group.state is STABLE and group.generation_id == gen
    assert group.leader_id == new
    assert set(group.members) == {new, dyn}
    # Its sync gets the partitions its old id had; the other member saw nothing happen.
    assert _body(sync(h, new, gen, "s1"))["assignment"] == old.encode()
    assert heartbeat(h, dyn, gen) == E.NONE
    assert h.groups["g"].members[dyn].assignment == dyn.encode()
    assert h.state() is STABLE and h.groups["g"].generation_id == gen
    # The old id is a zombie now: every group API fences it by its instance id.
    assert heartbeat(h, old, gen, "s1") == E.FENCED_INSTANCE_ID
    assert _body(sync(h, old, gen, "s1"))["error_code"] == E.FENCED_INSTANCE_ID
    assert _body(join(h, "s1", old))["error_code"] == E.FENCED_INSTANCE_ID
    assert commit_code(h, old, gen, "s1") == E.FENCED_INSTANCE_ID
    assert leave(h, (old, "s1")) == [
        {"member_id": old, "group_instance_id": "s1", "error_code": E.FENCED_INSTANCE_ID}
    ]
    # ... and without its instance id it is simply no member any more.
    assert heartbeat(h, old, gen) == E.UNKNOWN_MEMBER_ID
    assert heartbeat(h, new, gen, "s1") == E.NONE
    assert commit_code(h, new, gen, "s1") == E.NONE
    assert h.state() is STABLE


def test_a_restarted_static_follower_keeps_its_partitions_and_the_old_heartbeat_is_void(h):
    old, dyn, gen, leader = static_and_dynamic(h, static_leads=False)
    assert leader == dyn
    new = _body(join(h, "s1"))["member_id"]
    assert _body(sync(h, new, gen, "s1"))["assignment"] == old.encode()
    # The old id's session timer was stopped with it: only the new id's runs, and the
    # new one heartbeats, so one session later nobody is removed.
    for _ in range(3 * SESSION // 1000):
        h.clock.advance(1000)
        assert heartbeat(h, new, gen, "s1") == E.NONE
        assert heartbeat(h, dyn, gen) == E.NONE
    assert h.state() is STABLE and h.groups["g"].generation_id == gen
    assert set(h.groups["g"].members) == {new, dyn}


def test_a_restart_mid_rebalance_fences_what_the_old_id_waits_for_and_rebalances(h):
    old, dyn, gen, _leader = static_and_dynamic(h, static_leads=False)
    # A third member: everyone rejoins; the generation completes, nobody synced yet.
    third, third_join = h.new_member()
    rejoin_old = join(h, "s1", old)
    h.join(dyn)
    gen2 = _body(third_join)["generation_id"]
    assert gen2 == gen + 1 and h.state() is GroupState.COMPLETING_REBALANCE
    assert _body(rejoin_old)["leader"] == dyn
    waiting = sync(h, old, gen2, "s1")  # a follower waits for the leader's assignment
    assert not _done(waiting)
    # s1 restarts now: the leader may be assigning to the old id, so the group rebalances.
    restarted = join(h, "s1")
    assert not _done(restarted)
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert _body(waiting)["error_code"] == E.FENCED_INSTANCE_ID
    new = h.groups["g"].static_members["s1"]
    assert new != old and old not in h.groups["g"].members
    h.join(dyn)
    h.join(third)
    assert _body(restarted)["generation_id"] == gen2 + 1
    assert _body(restarted)["member_id"] == new


def test_a_changed_protocol_choice_makes_a_static_rejoin_rebalance(h):
    both = (("roundrobin", b"x"), ("range", b"y"))
    a = join(h, "a", protocols=both)
    b = join(h, "b", protocols=both)
    a_id, b_id = _body(a)["member_id"], _body(b)["member_id"] if _done(b) else None
    a2 = join(h, "a", a_id, protocols=both)
    b_id = _body(b)["member_id"] if b_id is None else b_id
    gen = _body(a2)["generation_id"]
    assert _body(a2)["protocol_name"] == "roundrobin"
    sync(h, b_id, gen, "b")
    sync(h, a_id, gen, "a", {a_id: b"A", b_id: b"B"})
    assert h.state() is STABLE
    # b restarts supporting only range: the group's next choice would differ.
    restarted = join(h, "b", protocols=(("range", b"y"),))
    assert not _done(restarted)
    assert h.state() is GroupState.PREPARING_REBALANCE
    answer = _body(join(h, "a", a_id, protocols=both))
    assert answer["generation_id"] == gen + 1
    assert answer["protocol_name"] == "range"


def test_a_static_member_that_does_not_rejoin_stays_until_its_session_expires(h):
    s, d, gen, _ = static_and_dynamic(h, rebalance=5000)
    e, e_join = h.new_member(rebalance=5000)  # a rebalance; neither s nor d rejoins
    for _ in range(5):  # both alive (heartbeating) for the whole rebalance timeout
        assert heartbeat(h, s, gen, "s1") == E.REBALANCE_IN_PROGRESS
        assert heartbeat(h, d, gen) == E.REBALANCE_IN_PROGRESS
        h.clock.advance(1000)
    # Timed out: the dynamic member that did not rejoin is out, the static one stays (it
    # may be restarting), and the leader is one that rejoined.
    group = h.groups["g"]
    answer = _body(e_join)
    gen2 = answer["generation_id"]
    assert gen2 == gen + 1 and answer["leader"] == e
    assert d not in group.members and s in group.members
    assert sorted(m["member_id"] for m in answer["members"]) == sorted([s, e])
    assert heartbeat(h, d, gen) == E.UNKNOWN_MEMBER_ID
    s_sync = sync(h, s, gen2, "s1")
    sync(h, e, gen2, None, {e: b"E", s: b"S"})
    assert _body(s_sync)["assignment"] == b"S"
    assert h.state() is STABLE
    # Then it goes quiet: one session later it is removed, and the group rebalances.
    for _ in range(SESSION // 1000 - 1):
        h.clock.advance(1000)
        assert heartbeat(h, e, gen2) == E.NONE
    assert s in group.members
    h.clock.advance(1000)
    assert s not in group.members and "s1" not in group.static_members
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert heartbeat(h, s, gen2, "s1") == E.UNKNOWN_MEMBER_ID


def test_leave_by_member_and_instance_id_and_by_instance_id_alone(h):
    s, d, _gen, _ = static_and_dynamic(h)
    assert leave(h, ("", "nobody")) == [
        {"member_id": "", "group_instance_id": "nobody", "error_code": E.UNKNOWN_MEMBER_ID}
    ]
    assert leave(h, (s, "s1")) == [{"member_id": s, "group_instance_id": "s1", "error_code": 0}]
    assert s not in h.groups["g"].members and h.groups["g"].static_members == {}
    assert h.state() is GroupState.PREPARING_REBALANCE
    gen2 = _body(h.join(d))["generation_id"]
    sync(h, d, gen2, None, {d: b""})
    # An admin removes a static member by its instance id alone (kafka-consumer-groups
    # --delete-member style): member_id "".
    s2_join = join(h, "s1")  # a new static member: a rebalance, d rejoins
    h.join(d)
    s2 = _body(s2_join)["member_id"]
    assert leave(h, ("", "s1")) == [{"member_id": "", "group_instance_id": "s1", "error_code": 0}]
    assert set(h.groups["g"].members) == {d} and s2 not in h.groups["g"].members


def test_describe_groups_shows_the_instance_id(h):
    s, d, _gen, _ = static_and_dynamic(h)
    described = h.call(p.ApiKey.DESCRIBE_GROUPS, {"groups": ["g"]})["groups"][0]
    assert {m["member_id"]: m["group_instance_id"] for m in described["members"]} == {
        s: "s1",
        d: None,
    }


async def test_static_members_survive_a_coordinator_move(tmp_path):
    h = make(tmp_path)
    s, d, gen, _ = static_and_dynamic(h)
    h.rm.close()
    async with trio.open_nursery() as nursery:
        fresh = Harness(tmp_path, tasks=nursery)
        fresh.service.manager.start_load(0, 2, fresh.service.coordinator.partition_loaded)
        with trio.fail_after(5):
            while 0 not in fresh.service.manager.owned:
                await trio.sleep(0)
    group = fresh.groups["g"]
    assert group.static_members == {"s1": s}
    assert group.members[s].group_instance_id == "s1" and group.members[d].group_instance_id is None
    # The restart lands on the new coordinator: it still knows the instance, no rebalance.
    body = _body(join(fresh, "s1"))
    assert body["generation_id"] == gen and body["member_id"] != s
    assert _body(sync(fresh, body["member_id"], gen, "s1"))["assignment"] == s.encode()
    assert group.state is STABLE and group.generation_id == gen
    assert heartbeat(fresh, s, gen, "s1") == E.FENCED_INSTANCE_ID
    fresh.rm.close()


def test_a_takeover_the_log_did_not_store_is_undone(h):
    old, dyn, gen, _ = static_and_dynamic(h)
    # The offsets partition's leadership moved, and the coordinator has not heard yet: the
    # new member id cannot be stored, so the group must not keep it (Kafka's revert).
    h.rm.host_partition(OFFSETS_TOPIC, 0, PartitionState(1, 2, [0, 1], [1]))
    answer = _body(join(h, "s1"))
    assert answer["error_code"] == E.NOT_COORDINATOR and answer["member_id"] == ""
    group = h.groups["g"]
    assert group.static_members == {"s1": old} and set(group.members) == {old, dyn}
    assert group.leader_id == old
    assert group.state is STABLE and group.generation_id == gen
    assert group.members[old].assignment == old.encode()
    assert heartbeat(h, old, gen, "s1") == E.NONE  # the old id is current again
