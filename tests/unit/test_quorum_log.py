"""RaftLog: the fetch validation, truncation point and snapshot rules the quorum relies on."""

from __future__ import annotations

from minibroker.broker.raft import Entry, OffsetAndEpoch, RaftLog, Snapshot


def log_of(*epochs: int, snapshot: Snapshot | None = None) -> RaftLog:
    start = snapshot.snapshot_id.offset if snapshot else 0
    return RaftLog(snapshot, [Entry(start + i, e, b"x") for i, e in enumerate(epochs)])


def test_empty_log_accepts_a_fetch_from_zero():
    assert RaftLog().validate_offset_and_epoch(0, 0).kind == "valid"


def test_a_fetch_matching_the_log_is_valid():
    log = log_of(1, 1, 2, 2)
    assert log.validate_offset_and_epoch(3, 2).kind == "valid"
    assert log.validate_offset_and_epoch(2, 1).kind == "valid"


def test_a_fetch_ending_in_an_epoch_the_leader_ended_earlier_diverges():
    leader = log_of(1, 1, 3, 3)  # epoch 1 ends at 2 here
    result = leader.validate_offset_and_epoch(4, 1)  # follower has 4 entries of epoch 1
    assert result.kind == "diverging"
    assert result.offset_and_epoch == OffsetAndEpoch(2, 1)


def test_a_fetch_in_an_epoch_the_leader_never_had_diverges_to_the_epoch_before():
    leader = log_of(1, 1, 3)
    result = leader.validate_offset_and_epoch(3, 2)
    assert result == result.__class__("diverging", OffsetAndEpoch(2, 1))


def test_follower_truncates_to_the_smaller_end_of_the_diverging_epoch():
    follower = log_of(1, 1, 1, 1, 2)
    assert follower.truncation_offset(OffsetAndEpoch(2, 1)) == 2
    # an epoch the follower lacks: back to the end of its last epoch before it
    assert log_of(1, 1, 2).truncation_offset(OffsetAndEpoch(5, 3)) == 3
    assert log_of(1, 1, 4).truncation_offset(OffsetAndEpoch(5, 3)) == 2


def test_a_fetch_behind_the_log_start_is_sent_the_snapshot():
    snap = Snapshot(OffsetAndEpoch(10, 2), b"state")
    log = log_of(2, 3, snapshot=snap)
    assert log.validate_offset_and_epoch(5, 1).kind == "snapshot"
    assert log.validate_offset_and_epoch(10, 1).kind == "snapshot"  # epoch differs at start
    assert log.validate_offset_and_epoch(10, 2).kind == "valid"
    assert log.validate_offset_and_epoch(12, 3).kind == "valid"


def test_own_snapshot_keeps_the_suffix_and_moves_the_start():
    log = log_of(1, 1, 2, 2)
    log.store_snapshot(Snapshot(OffsetAndEpoch(3, 2), b"s"))
    assert (log.start_offset, log.end_offset, log.last_epoch) == (3, 4, 2)
    assert log.entry(2) is None and log.entry(3) is not None
    assert log.epoch_at(3) == 2


def test_a_fetched_snapshot_replaces_a_shorter_or_diverging_log():
    short = log_of(1, 1)
    short.store_snapshot(Snapshot(OffsetAndEpoch(5, 2), b"s"))
    assert (short.start_offset, short.end_offset, short.last_epoch) == (5, 5, 2)
    diverging = log_of(1, 1, 1, 1, 1, 1)  # entry at offset 4 has epoch 1, snapshot says 2
    diverging.store_snapshot(Snapshot(OffsetAndEpoch(5, 2), b"s"))
    assert diverging.end_offset == 5 and diverging.entries == []


def test_an_older_snapshot_changes_nothing():
    log = log_of(1, 1, snapshot=Snapshot(OffsetAndEpoch(4, 1), b"new"))
    log.store_snapshot(Snapshot(OffsetAndEpoch(2, 1), b"old"))
    assert log.snapshot.data == b"new" and log.end_offset == 6


def test_a_read_stops_at_its_entry_or_byte_limit_but_always_carries_one_whole_entry():
    log = RaftLog(entries=[Entry(i, 1, b"x" * size) for i, size in enumerate((10, 10, 5000, 10))])
    assert [e.offset for e in log.read(0, 500, 25)] == [0, 1]  # the third would pass 25 bytes
    assert [e.offset for e in log.read(0, 1, 1 << 20)] == [0]
    # A change larger than a whole fetch still goes, alone: never cut, never stuck.
    assert [e.offset for e in log.read(2, 500, 100)] == [2]
    assert log.read(4, 500, 100) == ()
