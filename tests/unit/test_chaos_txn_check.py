"""The chaos checker's transactional rules on a hand-made history: a clean one (an
aborted transaction in the log, an unknown one that committed whole) passes, and each
planted violation is caught by its rule alone; a partial or aborted read of any outcome
is flagged; the nemesis can aim at transaction coordinators and leaders."""

from __future__ import annotations

import pytest

from minibroker.deploy.chaos_check import check, load_history, plant, save_history
from minibroker.deploy.chaos_txn_check import Txn, TxnHistory
from minibroker.deploy.nemesis import (
    TXN_COORDINATOR,
    TXN_FAULT_KINDS,
    TXN_LEADER,
    plan_nemesis,
    victims_for,
)

from .test_chaos_checker import clean_history

TXN_RULE_OF = {
    "txn-aborted-read": "txn_aborted_read",
    "txn-partial": "txn_partial",
    "txn-lost": "txn_lost",
    "txn-duplicate": "txn_duplicate",
}


def records(*pairs: tuple[int, str]) -> list[tuple[int, bytes]]:
    return [(p, v.encode()) for p, v in pairs]


def clean_txns() -> TxnHistory:
    """t0.0 committed over partitions 0 and 1; t0.1 aborted (its records in the log, with
    an abort marker after each); t0.2 unknown (commit raised) but committed whole; t1.0
    committed. Offsets skip the markers, as a read_committed reader's do."""
    h = TxnHistory(
        "chaos-txn", clients={"chaos-txn-0": "bundled", "chaos-txn-1": "confluent-kafka"}
    )
    t0, t1 = "chaos-txn-0", "chaos-txn-1"
    h.txns = [
        Txn("t0.0", records((0, "t0-0"), (1, "t0-1")), "committed", producer=t0),
        Txn("t0.1", records((1, "t0-2"), (0, "t0-3")), "aborted", producer=t0),
        Txn("t0.2", records((0, "t0-4"), (1, "t0-5")), "unknown", "REQUEST_TIMED_OUT", t0),
        Txn("t1.0", records((1, "t1-0"), (0, "t1-1"), (1, "t1-2")), "committed", producer=t1),
    ]
    committed = {
        (0, 0): "t0-0", (1, 0): "t0-1",  # markers at 0/1 and 1/1
        (0, 4): "t0-4", (1, 4): "t0-5",  # t0.1's records at 0/2, 1/2, markers at 3
        (1, 6): "t1-0", (0, 6): "t1-1", (1, 7): "t1-2",
    }  # fmt: skip
    h.committed = {k: v.encode() for k, v in committed.items()}
    h.uncommitted = {**h.committed, (1, 2): b"t0-2", (0, 2): b"t0-3"}
    h.live = [(0, 0, b"t0-0"), (1, 0, b"t0-1"), (0, 4, b"t0-4"), (1, 4, b"t0-5"), (1, 6, b"t1-0")]
    return h


def with_txns():
    history = clean_history()
    history.txn = clean_txns()
    return history


def fired(history) -> set[str]:
    return {rule for rule, items in check(history).violations.items() if items}


def test_a_clean_transactional_history_passes_with_its_counts():
    verdict = check(with_txns())
    assert verdict.ok, verdict.lines()
    c = verdict.counts
    assert (c["txns"], c["txn_committed"], c["txn_aborted"], c["txn_unknown"]) == (4, 2, 1, 1)
    assert c["txn_unknown_committed"] == 1 and c["txn_aborted_records_written"] == 2
    assert c["txn_records_visible"] == 7 and c["txn_live_read"] == 5
    assert c["txn_by_client"] == {"bundled": 1, "confluent-kafka": 1}


@pytest.mark.parametrize("kind", list(TXN_RULE_OF))
def test_each_planted_transactional_violation_is_caught_by_its_rule(kind):
    history = with_txns()
    plant(history, kind)
    assert fired(history) == {TXN_RULE_OF[kind]}, check(history).lines()


def test_an_aborted_record_in_the_final_read_committed_read_is_caught():
    history = with_txns()
    history.txn.committed[(1, 2)] = b"t0-2"
    history.txn.committed[(0, 2)] = b"t0-3"
    assert fired(history) == {"txn_aborted_read"}
    assert "a record of aborted transaction t0.1" in check(history).lines()[0]


def test_an_unknown_transaction_seen_in_part_is_caught():
    history = with_txns()
    del history.txn.committed[(1, 4)]  # t0.2: t0-4 visible, t0-5 not
    history.txn.live.remove((1, 4, b"t0-5"))
    violations = check(history).violations
    assert violations["txn_partial"] == [
        "unknown transaction t0.2: 1 of its 2 records visible, missing t0-5"
    ]
    assert fired(history) == {"txn_partial"}


def test_an_unknown_transaction_not_seen_at_all_is_allowed_a_committed_one_is_not():
    history = with_txns()
    for key in ((0, 4), (1, 4)):
        del history.txn.committed[key]
    history.txn.live = [r for r in history.txn.live if r[1] != 4]
    assert check(history).ok  # unknown: it may have aborted
    history.txn.txns[2].outcome = "committed"
    assert fired(history) == {"txn_lost"}


def test_the_live_reader_going_back_or_seeing_what_is_not_there_is_caught():
    history = with_txns()
    history.txn.live.append((0, 0, b"t0-0"))  # partition 0 read again from the start
    assert fired(history) == {"txn_reader"}
    history = with_txns()
    history.txn.live.append((0, 9, b"t9-9"))
    assert fired(history) == {"txn_reader"}


def test_reordered_transactions_and_undecided_ones_are_caught():
    history = with_txns()
    c = history.txn.committed
    c[(0, 0)], c[(0, 4)] = c[(0, 4)], c[(0, 0)]  # t0-4 before t0-0 in partition 0
    history.txn.live = []
    assert fired(history) == {"txn_order"}
    history = with_txns()
    history.txn.txns.append(Txn("t1.1", records((0, "t1-3"), (1, "t1-4"))))  # never answered
    history.txn.complete = False
    assert fired(history) == {"txn_unresolved", "txn_undecided"}


def test_a_kept_transactional_history_is_judged_the_same_when_loaded(tmp_path):
    history = with_txns()
    plant(history, "txn-partial")
    save_history(history, tmp_path / "h.json.gz")
    loaded = load_history(tmp_path / "h.json.gz")
    assert loaded == history
    assert check(loaded).violations == check(history).violations


def test_a_transactional_plant_needs_the_transactional_workload():
    with pytest.raises(ValueError, match="--workload transactions"):
        plant(clean_history(), "txn-partial")


def test_the_nemesis_aims_at_transaction_coordinators_and_leaders_only_when_asked():
    assert TXN_COORDINATOR not in victims_for(3, -1, True)
    victims = victims_for(3, -1, True, transactions=True)
    assert victims.count(TXN_COORDINATOR) == 2 and victims.count(TXN_LEADER) == 1


def test_slow_commits_are_aimed_at_a_transaction_coordinator_and_outlast_other_faults():
    victims = victims_for(3, -1, True, transactions=True)
    plans = [plan_nemesis(s, 60, victims, TXN_FAULT_KINDS, brokers=3) for s in range(10)]
    slow = [f for plan in plans for f in plan if f.kind == "slow-commits"]
    assert slow and all(f.broker == TXN_COORDINATOR for f in slow)
    assert all(2.0 <= f.end_s - f.start_s <= 7.5 or f.end_s == 60 for f in slow)
    assert max(f.end_s - f.start_s for f in slow) > 3.5  # longer than any other fault
