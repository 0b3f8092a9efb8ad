"""The chaos checker's rules on hand-made histories: a clean one passes, and each planted
violation is caught by the rule meant to catch it."""

from __future__ import annotations

import itertools

import pytest

from minibroker.deploy.chaos import plan_nemesis
from minibroker.deploy.chaos_check import History, Send, check, plant

RULE_OF = {
    "lose-ack": "lost",
    "diverge": "divergent",
    "hw-regress": "hw_regressions",
    "consumer-gap": "consumer_gaps",
    "silent": "unresolved",
    "duplicate": "duplicate",
    "reorder": "nonmonotonic_send",
}


def clean_history() -> History:
    h = History("chaos")
    for i in range(6):
        partition, offset = i % 2, i // 2
        value = f"p0-{i}".encode()
        h.sends.append(Send(value, partition, "ok", offset))
        h.final[(partition, offset)] = value
        h.consumed.append((partition, offset, value))
    # a failed send that was written anyway (a timeout allows it): reported, not judged
    h.sends.append(Send(b"p0-6", 0, "error", -1, "REQUEST_TIMED_OUT"))
    h.final[(0, 3)] = b"p0-6"
    h.hw_samples = {(0, 100, 0): [0, 2, 2, 4], (1, 101, 0): [0, 4], (1, 102, 0): [1, 4]}
    batches = [(0, 1, 111), (2, 3, 222)]
    h.replicas = {0: {0: list(batches), 1: list(batches), 2: batches[:1]}, 1: {0: [], 1: []}}
    return h


def test_a_clean_history_passes_with_its_counts():
    verdict = check(clean_history())
    assert verdict.ok and verdict.counts["violations"] == 0
    assert verdict.counts["acknowledged"] == 6 and verdict.counts["failed"] == 1
    assert verdict.counts["failed_but_present"] == 1


@pytest.mark.parametrize("kind", list(RULE_OF))
def test_each_planted_violation_is_caught_by_its_rule(kind):
    history = clean_history()
    plant(history, kind)
    verdict = check(history)
    assert not verdict.ok
    fired = {rule for rule, items in verdict.violations.items() if items}
    # A lost record that the live consumer had read is also a consumer-side violation.
    also = {"consumer_gaps"} if kind == "lose-ack" else set()
    assert fired == {RULE_OF[kind]} | also


def test_a_shorter_replica_is_not_divergence_but_a_different_batch_is():
    history = clean_history()
    history.replicas[0][2] = [(0, 2, 999)]  # overlaps offsets 0-1 with other bounds
    assert check(history).violations["divergent"]


def test_a_restarted_broker_starts_a_new_hw_series():
    history = clean_history()
    history.hw_samples[(1, 103, 0)] = [0]  # new pid, lower HW: allowed
    assert check(history).ok


def test_the_nemesis_is_seeded_bounded_and_spares_the_controller():
    one = plan_nemesis(7, 30, [1, 2])
    assert one == plan_nemesis(7, 30, [1, 2]) and one != plan_nemesis(8, 30, [1, 2])
    assert one and all(f.broker in (1, 2) and f.kind in ("pause", "kill") for f in one)
    for before, after in itertools.pairwise(one):
        assert before.end_s < after.start_s  # one fault at a time
    assert all(0 < f.start_s < f.end_s <= 30 for f in one)


def test_duplicates_and_reordering_are_judged_only_for_idempotent_producers():
    history = clean_history()
    plant(history, "duplicate")
    history.idempotent = False  # Kafka without idempotence allows a retry stored twice
    verdict = check(history)
    assert verdict.ok and verdict.counts["duplicates"] == 1
