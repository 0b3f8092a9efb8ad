"""The nemesis' schedule with every fault kind, the controller switch, and the checker's
report and kept history (a failed run must be explainable and judged again)."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from minibroker.deploy.chaos import CONTROLLER, FAULT_KINDS, plan_nemesis, victims_for
from minibroker.deploy.chaos_check import check, load_history, plant, save_history
from minibroker.deploy.chaos_cli import fault_kinds

from .test_chaos_checker import clean_history


def test_every_fault_kind_is_planned_one_at_a_time():
    seen = Counter()
    for seed in range(30):
        plan = plan_nemesis(seed, 40, [1, 2], FAULT_KINDS, brokers=3)
        assert plan == plan_nemesis(seed, 40, [1, 2], FAULT_KINDS, brokers=3)
        for before, after in itertools.pairwise(plan):
            assert before.end_s < after.start_s
        seen.update(f.kind for f in plan)
    assert set(seen) == set(FAULT_KINDS) and min(seen.values()) > 20


def test_an_isolate_cuts_off_all_others_or_a_proper_part_of_them():
    plans = [plan_nemesis(s, 60, [0, 1, 2, 3, 4], ("isolate",), brokers=5) for s in range(20)]
    isolates = [f for plan in plans for f in plan]
    partial = [f for f in isolates if f.peers is not None]
    assert partial and len(partial) < len(isolates)  # both kinds occur
    for f in partial:
        # Never itself, never everyone: the victim keeps some peers, a majority stays whole.
        assert f.broker not in f.peers and 1 <= len(f.peers) <= 3
        assert set(f.peers) <= {0, 1, 2, 3, 4}


def test_the_controller_is_spared_unless_targeted():
    assert victims_for(3, 0, target_controller=False) == [1, 2]
    assert victims_for(3, 0, target_controller=True) == [0, 1, 2, CONTROLLER]
    spared = [f for s in range(20) for f in plan_nemesis(s, 40, victims_for(3, 0, False))]
    assert spared and all(f.broker in (1, 2) for f in spared)
    targeted = [
        f
        for s in range(20)
        for f in plan_nemesis(s, 40, victims_for(3, 0, True), FAULT_KINDS, brokers=3)
    ]
    assert {f.broker for f in targeted} == {0, 1, 2, CONTROLLER}
    # "The active controller" is resolved when the fault starts: never a partial isolate.
    assert all(f.peers is None for f in targeted if f.broker == CONTROLLER)


def test_every_violation_is_reported_under_the_rule_that_fired():
    history = clean_history()
    plant(history, "diverge")
    plant(history, "silent")
    lines = check(history).lines()
    assert lines and all(line.startswith(("[divergent] ", "[unresolved] ")) for line in lines)
    assert {line.split("]")[0][1:] for line in lines} == {"divergent", "unresolved"}


@pytest.mark.parametrize("name", ["history.json", "history.json.gz"])
def test_a_kept_history_is_judged_the_same_when_loaded(tmp_path, name):
    history = clean_history()
    history.events = [(0.5, "nemesis: kill broker 1")]
    history.workload_s = 2.0
    plant(history, "hw-regress")
    save_history(history, tmp_path / name)
    loaded = load_history(tmp_path / name)
    assert loaded == history
    assert check(loaded).violations == check(history).violations
    assert check(loaded).counts["acked_per_s"] == 3  # 6 acknowledged in 2 s


def test_fault_kinds_are_parsed_and_checked():
    assert fault_kinds("kill, isolate") == ("kill", "isolate")
    with pytest.raises(Exception, match="expected some of pause,kill,isolate"):
        fault_kinds("kill,flood")
