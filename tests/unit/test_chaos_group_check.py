"""The chaos checker's consumer-group rules on a hand-made history: a clean one (with a
redelivery inside a lost uncommitted window) passes, and each planted violation is
caught by the rule meant to catch it; the members' pause schedule is seeded."""

from __future__ import annotations

import struct
from itertools import pairwise

import pytest

from minibroker.deploy.chaos import BOUNCE_S
from minibroker.deploy.chaos_check import PLANTS, check, load_history, plant, save_history
from minibroker.deploy.chaos_group_check import PLANTS as GROUP_PLANTS
from minibroker.deploy.chaos_group_check import GroupHistory
from minibroker.deploy.chaos_groups import plan_member_faults
from minibroker.deploy.chaos_txn_check import PLANTS as TXN_PLANTS
from minibroker.deploy.nemesis import (
    CONTROLLER,
    COORDINATOR,
    GROUP_FAULT_KINDS,
    plan_nemesis,
    victims_for,
)

from .test_chaos_checker import RULE_OF, clean_history
from .test_chaos_txn_check import TXN_RULE_OF

GROUP_RULE_OF = {
    "double-owner": "double_owner",
    "commit-regress": "commit_regression",
    "ownerless": "ownerless",
    "group-dup": "duplicate_outside_window",
}


def event(t: float, member: str, ev: str, gen: int, **fields) -> dict:
    return {"t": t, "m": member, "ev": ev, "gen": gen, "mid": f"{member}-id", **fields}


def clean_group() -> GroupHistory:
    """m0 owns both partitions in generation 1 and loses partition 1 with offset 1 read but
    not committed; m1 reads it again in generation 2: a duplicate inside the window."""
    g = GroupHistory(2, settle_s=1.0, settle_bound_s=12.0, drained=True)
    g.events = [
        event(1.0, "m0", "assigned", 1, tps=[0, 1]),
        event(2.0, "m0", "consumed", 1, recs=[[0, 0, "p0-0"], [1, 0, "p0-1"], [0, 1, "p0-2"]]),
        event(2.1, "m0", "committed", 1, offsets={"0": 2, "1": 1}),
        event(3.0, "m0", "consumed", 1, recs=[[1, 1, "p0-3"]]),
        event(4.0, "m0", "revoked", 1, tps=[0, 1]),
        event(5.0, "m0", "assigned", 2, tps=[0]),
        event(5.0, "m1", "assigned", 2, tps=[1]),
        event(6.0, "m1", "consumed", 2, recs=[[1, 1, "p0-3"], [1, 2, "p0-5"]]),
        event(6.1, "m1", "committed", 2, offsets={"1": 3}),
        event(6.5, "m0", "consumed", 2, recs=[[0, 2, "p0-4"]]),
        event(6.6, "m0", "committed", 2, offsets={"0": 3}),
    ]
    g.committed = [(2.2, 0, 2), (2.2, 1, 1), (6.2, 1, 3), (6.7, 0, 3)]
    return g


def history_with_group():
    history = clean_history()
    history.group = clean_group()
    return history


def test_a_clean_group_history_passes_with_its_counts():
    verdict = check(history_with_group())
    assert verdict.ok, verdict.lines()
    counts = verdict.counts
    assert counts["group_consumed"] == 7 and counts["group_redelivered"] == 1
    assert counts["group_generations"] == 2 and counts["group_commits"] == 3


def test_every_plant_has_a_rule():
    assert set(PLANTS) == set(RULE_OF) | set(GROUP_RULE_OF) | set(TXN_RULE_OF)
    assert set(PLANTS) == set(RULE_OF) | set(GROUP_PLANTS) | set(TXN_PLANTS)


@pytest.mark.parametrize("kind", list(GROUP_RULE_OF))
def test_each_planted_group_violation_is_caught_by_its_rule(kind):
    history = history_with_group()
    plant(history, kind)
    verdict = check(history)
    fired = {rule for rule, items in verdict.violations.items() if items}
    assert fired == {GROUP_RULE_OF[kind]}, verdict.lines()


def test_an_acknowledged_record_no_member_read_is_caught_once_the_group_drained():
    history = history_with_group()
    history.group.events[1]["recs"].pop(0)  # nobody read p0-0
    assert check(history).violations["group_unconsumed"] == [
        "p0-0 was acknowledged but no member consumed it"
    ]
    history.group.drained = False  # then only the drain itself is reported
    violations = check(history).violations
    assert not violations["group_unconsumed"]
    assert violations["group_not_settled"] == [
        "the group's committed offsets never reached the end of the log"
    ]


def test_a_group_that_settles_too_late_or_never_fails():
    history = history_with_group()
    history.group.settle_s = 12.5
    assert "more than session timeout + rebalance timeout (12.0s)" in " ".join(
        check(history).violations["group_not_settled"]
    )
    history.group.settle_s = None
    assert check(history).violations["group_not_settled"] == [
        "the group never became Stable with every partition owned after the faults"
    ]


def test_one_member_reassigned_without_a_revoke_is_not_two_owners():
    history = history_with_group()
    history.group.events.insert(5, event(4.5, "m0", "assigned", 2, tps=[0]))
    del history.group.events[4]  # no revoke before the new generation's assignment
    assert check(history).ok


def test_a_kept_group_history_is_judged_the_same_when_loaded(tmp_path):
    history = history_with_group()
    plant(history, "group-dup")
    save_history(history, tmp_path / "h.json.gz")
    loaded = load_history(tmp_path / "h.json.gz")
    assert loaded == history
    assert check(loaded).violations == check(history).violations


def test_a_group_plant_needs_the_group_workload():
    with pytest.raises(ValueError, match="--workload groups"):
        plant(clean_history(), "ownerless")


def test_member_faults_are_seeded_one_at_a_time_and_bounded():
    schedule = plan_member_faults(4, 60, 3)
    assert schedule == plan_member_faults(4, 60, 3) and schedule != plan_member_faults(5, 60, 3)
    assert all(1.0 <= p.end_s - p.start_s <= 6.0 or p.end_s == 60 for p in schedule)
    assert all(a.end_s < b.start_s for a, b in pairwise(schedule))
    assert {p.member for p in schedule} == {0, 1, 2}
    assert any(p.end_s - p.start_s > 4.0 for p in schedule)  # past the session timeout
    kinds = {f.kind for s in range(10) for f in plan_member_faults(s, 60, 3)}
    assert kinds == {"pause", "kill"}


def test_the_group_coordinator_is_a_victim_only_with_the_group_workload():
    assert COORDINATOR not in victims_for(3, 0, True)
    assert victims_for(3, 0, True, coordinator=True) == [0, 1, 2, CONTROLLER] + [COORDINATOR] * 2
    assert victims_for(3, 0, False, coordinator=True) == [1, 2, COORDINATOR, COORDINATOR]


def test_a_zombie_reading_past_a_newer_commit_is_its_own_window_but_an_owner_is_not():
    # Partition 0 offset 2 was committed (offset 3) in generation 2. A member that lost its
    # generation without knowing (its session expired while it stalled) or still holds
    # generation 1 may read it again: Kafka allows that, and fences the zombie's commit.
    # A member of generation 2 may not: its position came from that commit.
    history = history_with_group()
    events = history.group.events
    events.append(event(7.0, "m1", "consumed", -1, recs=[[0, 2, "p0-4"]]))
    events.append(event(7.1, "m1", "consumed", 1, recs=[[0, 2, "p0-4"]]))
    assert check(history).ok, check(history).lines()
    events.append(event(7.2, "m1", "consumed", 2, recs=[[0, 2, "p0-4"]]))
    [line] = check(history).violations["duplicate_outside_window"]
    assert "consumed again by m1 in generation 2" in line and "in generation 2 at 6.600" in line


def test_heartbeat_faults_aim_at_the_coordinator_long_enough_for_rebalances():
    plans = [
        plan_nemesis(s, 60, [0, 1, 2, COORDINATOR], GROUP_FAULT_KINDS, brokers=3) for s in range(20)
    ]
    slow = [f for plan in plans for f in plan if f.kind == "slow-heartbeats"]
    failing = [f for plan in plans for f in plan if f.kind == "fail-heartbeats"]
    assert len(slow) > 20 and len(failing) > 20
    assert {f.broker for f in slow + failing} == {COORDINATOR}
    # A slow coordinator lasts 3-8.5 s: one bounce (BOUNCE_S) at least, two in the longest
    # (the first is never cut short).
    assert all(3.0 <= f.end_s - f.start_s <= 8.5 or f.end_s == 60 for f in slow)
    assert max(f.end_s - f.start_s for f in slow) > BOUNCE_S


def test_counts_say_how_much_each_kind_of_client_consumed():
    history = history_with_group()
    history.group.clients = {"m0": "bundled", "m1": "confluent-kafka"}
    counts = check(history).counts
    assert counts["group_consumed_by"] == {"bundled": 5, "confluent-kafka": 2}


def test_the_generation_is_read_from_librdkafka_s_group_metadata():
    pytest.importorskip("confluent_kafka")
    from minibroker.deploy.chaos_member_rdkafka import generation

    class Stub:  # what consumer_group_metadata() hands out: CGMDv2:, native int32, ids
        def __init__(self, raw: bytes) -> None:
            self.raw = raw

        def consumer_group_metadata(self) -> bytes:
            return self.raw

    assert generation(Stub(b"CGMDv2:" + struct.pack("=i", 7) + b"g\x00m-1\x00\x00")) == 7
    assert generation(Stub(b"CGMDv2:\xff\xff\xff\xffg\x00\x00\x01")) == -1
    with pytest.raises(ValueError, match="unexpected consumer group metadata"):
        generation(Stub(b"CGMDv9:...."))


def test_the_generation_parse_matches_a_real_confluent_kafka_consumer():
    # Not joined: librdkafka's own bytes say generation -1.
    ck = pytest.importorskip("confluent_kafka")
    from minibroker.deploy.chaos_member_rdkafka import generation

    consumer = ck.Consumer({"group.id": "g", "bootstrap.servers": "127.0.0.1:9"})
    try:
        assert generation(consumer) == -1
    finally:
        consumer.close()
