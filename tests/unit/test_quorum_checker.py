"""The simulation's safety checker fires on each kind of violation (so a pass means something)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from minibroker.broker.raft import (
    AppendLog,
    Entry,
    HighWatermarkUpdated,
    LeaderChanged,
    OffsetAndEpoch,
    RaftLog,
    Snapshot,
)
from tests.unit.quorum_checker import SafetyChecker, SafetyViolation, encode_snapshot


@dataclass
class FakeNode:
    id: int
    hw: int = 0
    log: RaftLog = field(default_factory=RaftLog)


def node_with(checker: SafetyChecker, node_id: int, *entries: tuple[int, bytes]) -> FakeNode:
    node = FakeNode(node_id)
    effect = AppendLog(tuple(Entry(i, e, d) for i, (e, d) in enumerate(entries)))
    checker.append(node, effect)
    node.log.append(effect.entries)
    return node


def test_two_leaders_in_one_epoch():
    checker = SafetyChecker(lambda: ())
    checker.leader_changed(FakeNode(0), LeaderChanged("leader", 3, 0))
    checker.leader_changed(FakeNode(2), LeaderChanged("follower", 3, 0))
    with pytest.raises(SafetyViolation, match="election safety"):
        checker.leader_changed(FakeNode(1), LeaderChanged("leader", 3, 1))


def test_same_offset_and_epoch_with_different_data_or_prefix():
    checker = SafetyChecker(lambda: ())
    node_with(checker, 0, (1, b"a"), (2, b"b"))
    with pytest.raises(SafetyViolation, match="log matching"):
        node_with(checker, 1, (1, b"a"), (2, b"X"))
    with pytest.raises(SafetyViolation, match="log matching"):
        node_with(checker, 2, (2, b"a"), (2, b"b"))  # same entry at 1, other predecessor


def test_committed_entry_changed_truncated_or_missing_from_a_later_leader():
    checker = SafetyChecker(lambda: ())
    a = node_with(checker, 0, (1, b"a"), (1, b"b"))
    checker.high_watermark(a, HighWatermarkUpdated(2, 1))
    b = node_with(checker, 1, (1, b"a"), (2, b"c"))
    with pytest.raises(SafetyViolation, match="committed entry changed"):
        checker.high_watermark(b, HighWatermarkUpdated(2, 2))
    with pytest.raises(SafetyViolation, match="below its high watermark"):
        checker.truncate(a, 1)
    a.hw = 0  # as after a restart: the commit is still known globally
    with pytest.raises(SafetyViolation, match="truncates committed offset 1"):
        checker.truncate(a, 1)
    with pytest.raises(SafetyViolation, match="leader completeness"):
        checker.leader_changed(b, LeaderChanged("leader", 2, 1))


def test_high_watermark_going_back_and_states_that_differ():
    checker = SafetyChecker(lambda: ())
    a = node_with(checker, 0, (1, b"a"))
    checker.high_watermark(a, HighWatermarkUpdated(1, 1))
    with pytest.raises(SafetyViolation, match="goes back"):
        checker.high_watermark(a, HighWatermarkUpdated(0, 1))
    checker.applied(0, 1, 111)
    with pytest.raises(SafetyViolation, match="differs"):
        checker.applied(1, 1, 222)
    with pytest.raises(SafetyViolation, match="snapshot"):
        checker.store_snapshot(a, Snapshot(OffsetAndEpoch(1, 1), encode_snapshot(1, 999)))
