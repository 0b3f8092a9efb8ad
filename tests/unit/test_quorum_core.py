"""KafkaRaftClient state transitions, one at a time, on a manual clock (no network at all)."""

from __future__ import annotations

import random

import pytest

from minibroker.broker.common.clock import ManualClock
from minibroker.broker.raft import (
    DURABLE,
    AppendLog,
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    Entry,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    HighWatermarkUpdated,
    KafkaRaftClient,
    LeaderChanged,
    OffsetAndEpoch,
    PersistQuorumState,
    QuorumConfig,
    QuorumStateData,
    RaftLog,
    Send,
    Snapshot,
    StoreSnapshot,
    TruncateLog,
    VoteRequest,
    VoteResponse,
)
from minibroker.protocol.errors import ErrorCode, NotLeaderOrFollower

CONFIG = QuorumConfig()
T = CONFIG.election_timeout_ms


def make(node_id=0, voters=(0, 1, 2), clock=None, **kw) -> KafkaRaftClient:
    return KafkaRaftClient(
        node_id, voters, clock or ManualClock(), random.Random(7), config=CONFIG, **kw
    )


def sends(effects, kind=None) -> list[Send]:
    return [
        e for e in effects if isinstance(e, Send) and (kind is None or isinstance(e.message, kind))
    ]


def of(effects, kind) -> list:
    return [e for e in effects if isinstance(e, kind)]


def win_pre_vote(core: KafkaRaftClient, voter: int) -> list:
    """One pre-vote grant (of voters 0,1,2 one is a majority with our own): now a candidate."""
    assert core.role == "prospective"
    epoch = core.epoch
    effects = core.handle(voter, VoteResponse(ErrorCode.NONE, epoch, None, True, pre_vote=True))
    assert core.role == "candidate" and core.epoch == epoch + 1
    return effects


def elect(core: KafkaRaftClient) -> list:
    """Drive ``core`` (voters 0,1,2) to leader with votes from everyone; return its effects."""
    core.clock.advance(2 * T)
    core.poll()
    assert core.role == "prospective"
    for voter in sorted(core.voters - {core.node_id}):  # the pre-vote round (KIP-996)
        core.handle(voter, VoteResponse(ErrorCode.NONE, core.epoch, None, True, pre_vote=True))
    assert core.role == "candidate"
    effects = []
    for voter in sorted(core.voters - {core.node_id}):
        effects += core.handle(voter, VoteResponse(ErrorCode.NONE, core.epoch, None, True))
    return effects


def test_unattached_voter_stands_for_election_within_a_randomized_timeout():
    core = make(node_id=1)
    assert core.role == "unattached" and core.epoch == 0
    assert T <= core.next_deadline_ms() < 2 * T
    core.clock.advance(core.next_deadline_ms() - 1)
    assert core.poll() == [LeaderChanged("unattached", 0, None)]  # the start is announced
    assert core.poll() == []
    core.clock.advance(1)
    effects = core.poll()
    # KIP-996: first a pre-vote in the current epoch, with nothing made durable
    assert core.role == "prospective" and core.epoch == 0
    assert not of(effects, PersistQuorumState)
    pre = sends(effects, VoteRequest)
    assert {s.destination for s in pre} == {0, 2}
    assert all(s.message.pre_vote and s.message.candidate_epoch == 0 for s in pre)
    effects = win_pre_vote(core, 2)
    # its own vote is durable before any VoteRequest leaves
    first_send = next(i for i, e in enumerate(effects) if isinstance(e, Send))
    assert effects[0] == PersistQuorumState(QuorumStateData(1, None, 1))
    assert first_send > 0
    votes = sends(effects, VoteRequest)
    assert {s.destination for s in votes} == {0, 2}
    assert not any(s.message.pre_vote for s in votes)


def test_a_new_quorums_lowest_voter_and_a_lone_voter_stand_at_once():
    fresh = make(node_id=0)
    assert fresh.next_deadline_ms() == fresh.now()
    fresh.poll()
    assert fresh.role == "prospective" and fresh.epoch == 0
    # the other fresh voters grant at once: no timeout anywhere on the way to candidate
    peer = make(node_id=1)
    (answer,) = sends(peer.handle(0, VoteRequest(0, 0, 0, 0, pre_vote=True)), VoteResponse)
    assert answer.message == VoteResponse(ErrorCode.NONE, 0, None, True, pre_vote=True)
    fresh.handle(1, answer.message)
    assert fresh.role == "candidate" and fresh.epoch == 1
    lone = make(node_id=4, voters=(4,), quorum_state=QuorumStateData(7, 4, 4))
    lone.poll()
    assert lone.role == "leader" and lone.epoch == 8


def test_a_restarted_lowest_voter_waits_so_it_cannot_depose_a_running_leader():
    core = make(node_id=0, quorum_state=QuorumStateData(3, None, None))
    assert core.role == "unattached"
    assert T <= core.next_deadline_ms() - core.now() < 2 * T


def test_the_timeout_is_seeded_so_runs_reproduce():
    a, b = make(), make()
    assert a.next_deadline_ms() == b.next_deadline_ms()


def test_vote_is_persisted_before_it_is_granted_and_given_once_per_epoch():
    core = make(node_id=1)
    effects = core.handle(
        0, VoteRequest(candidate_epoch=3, candidate_id=0, last_offset_epoch=0, last_offset=0)
    )
    persists = of(effects, PersistQuorumState)
    assert persists[-1].state == QuorumStateData(3, None, 0)
    reply = sends(effects, VoteResponse)[0]
    assert effects.index(persists[-1]) < effects.index(reply)
    assert reply.message.vote_granted and reply.message.leader_epoch == 3
    again = core.handle(2, VoteRequest(3, 2, 0, 0))
    assert not sends(again, VoteResponse)[0].message.vote_granted
    dup = core.handle(0, VoteRequest(3, 0, 0, 0))
    assert sends(dup, VoteResponse)[0].message.vote_granted  # the same candidate asking again


def test_vote_refused_to_a_candidate_whose_log_is_behind():
    log = RaftLog(entries=[Entry(0, 2, b"a"), Entry(1, 2, b"b")])
    core = make(node_id=1, log=log, quorum_state=QuorumStateData(2, None, None))
    shorter = core.handle(0, VoteRequest(3, 0, last_offset_epoch=2, last_offset=1))
    assert not sends(shorter, VoteResponse)[0].message.vote_granted
    older_epoch = core.handle(2, VoteRequest(4, 2, last_offset_epoch=1, last_offset=9))
    assert not sends(older_epoch, VoteResponse)[0].message.vote_granted
    equal = core.handle(0, VoteRequest(5, 0, last_offset_epoch=2, last_offset=2))
    assert sends(equal, VoteResponse)[0].message.vote_granted


def test_stale_candidate_is_fenced():
    core = make(node_id=1, quorum_state=QuorumStateData(5, None, None))
    reply = sends(core.handle(0, VoteRequest(4, 0, 0, 0)))[0].message
    assert reply.error == ErrorCode.FENCED_LEADER_EPOCH and reply.leader_epoch == 5
    assert core.epoch == 5


def test_majority_makes_a_leader_that_writes_leader_change_and_begins_the_epoch():
    core = make()
    core.clock.advance(2 * T)
    core.poll()
    win_pre_vote(core, 1)
    assert core.handle(1, VoteResponse(ErrorCode.NONE, 1, None, False)) == []
    effects = core.handle(2, VoteResponse(ErrorCode.NONE, 1, None, True))
    assert core.role == "leader"
    assert of(effects, LeaderChanged)[-1] == LeaderChanged("leader", 1, 0)
    (append,) = of(effects, AppendLog)
    assert append.entries[0].control and append.entries[0].offset == 0
    assert {s.destination for s in sends(effects, BeginQuorumEpochRequest)} == {1, 2}


def test_candidate_that_times_out_asks_for_pre_votes_again_then_a_new_epoch():
    core = make()
    core.clock.advance(2 * T)
    core.poll()
    win_pre_vote(core, 1)
    core.clock.advance(2 * T)
    core.poll()
    assert core.role == "prospective" and core.epoch == 1  # Kafka: back to pre-votes
    assert core.state.voted_id == 0  # its own vote in epoch 1 stays cast
    win_pre_vote(core, 2)
    assert core.epoch == 2


def test_follower_fetches_and_starts_an_election_after_the_fetch_timeout():
    core = make(node_id=1)
    effects = core.handle(0, BeginQuorumEpochRequest(leader_epoch=2, leader_id=0))
    assert core.role == "follower" and core.leader_id == 0
    assert of(effects, PersistQuorumState)[-1].state == QuorumStateData(2, 0, None)
    fetch = sends(effects, FetchRequest)[0].message
    assert (fetch.fetch_offset, fetch.last_fetched_epoch, fetch.current_leader_epoch) == (0, 0, 2)
    core.clock.advance(CONFIG.fetch_timeout_ms - 1)
    core.poll()
    assert core.role == "follower"
    # The timeout is jittered by up to a quarter of itself (no split votes between
    # followers that last heard the leader at the same moment).
    core.clock.advance(CONFIG.fetch_timeout_ms // 4 + 1)
    core.poll()
    assert core.role == "prospective" and core.epoch == 2 and core.leader_id == 0
    win_pre_vote(core, 2)
    assert core.epoch == 3


def test_follower_appends_fetched_records_and_learns_the_high_watermark():
    core = make(node_id=1)
    fetch = sends(core.handle(0, BeginQuorumEpochRequest(1, 0)), FetchRequest)[0].message
    records = (Entry(0, 1, b"lc", True), Entry(1, 1, b"a"))
    answer = FetchResponse(fetch.correlation_id, ErrorCode.NONE, 1, 0, 1, records)
    effects = core.handle(0, answer)
    assert of(effects, AppendLog)[0].entries == records
    assert of(effects, HighWatermarkUpdated) == [HighWatermarkUpdated(1, 1)]
    # the append precedes the next fetch, which acknowledges it
    assert effects.index(of(effects, AppendLog)[0]) < effects.index(sends(effects, FetchRequest)[0])
    assert sends(effects, FetchRequest)[0].message.fetch_offset == 2
    assert core.handle(0, answer) == []  # a duplicate of an answered fetch is ignored


def test_follower_truncates_on_a_diverging_epoch():
    log = RaftLog(entries=[Entry(0, 1, b"a"), Entry(1, 1, b"b"), Entry(2, 1, b"c")])
    core = make(node_id=1, log=log, quorum_state=QuorumStateData(1, None, None))
    fetch = sends(core.handle(0, BeginQuorumEpochRequest(3, 0)), FetchRequest)[0].message
    diverging = FetchResponse(
        fetch.correlation_id, ErrorCode.NONE, 3, 0, None, diverging_epoch=OffsetAndEpoch(1, 1)
    )
    effects = core.handle(0, diverging)
    assert of(effects, TruncateLog) == [TruncateLog(1)]
    assert core.log.end_offset == 1
    assert sends(effects, FetchRequest)[0].message.fetch_offset == 1


def test_follower_behind_the_log_start_fetches_and_installs_the_snapshot():
    core = make(node_id=1)
    fetch = sends(core.handle(0, BeginQuorumEpochRequest(2, 0)), FetchRequest)[0].message
    sid = OffsetAndEpoch(5, 2)
    effects = core.handle(
        0, FetchResponse(fetch.correlation_id, ErrorCode.NONE, 2, 0, 5, snapshot_id=sid)
    )
    ask = sends(effects, FetchSnapshotRequest)[0].message
    assert ask.snapshot_id == sid
    snap = Snapshot(sid, b"state")
    effects = core.handle(0, FetchSnapshotResponse(ask.correlation_id, ErrorCode.NONE, 2, 0, snap))
    assert of(effects, StoreSnapshot) == [StoreSnapshot(snap)]
    assert core.log.start_offset == 5 and core.high_watermark == 5
    assert sends(effects, FetchRequest)[0].message.fetch_offset == 5


def leader_with_log() -> KafkaRaftClient:
    core = make()
    elect(core)
    assert core.role == "leader" and core.log.end_offset == 1
    return core


def fetch_from(core, voter, offset, epoch, corr=1, wait=500):
    return core.handle(voter, FetchRequest(corr, voter, core.epoch, offset, epoch, wait))


def test_high_watermark_needs_a_majority_and_an_entry_of_the_leaders_epoch():
    core = leader_with_log()
    assert of(fetch_from(core, 1, 0, 0), HighWatermarkUpdated) == []
    effects = fetch_from(core, 1, 1, 1)
    assert of(effects, HighWatermarkUpdated) == [HighWatermarkUpdated(1, 1)]


def test_old_epoch_entries_do_not_commit_by_counting_alone():
    log = RaftLog(entries=[Entry(0, 1, b"old")])
    core = make(log=log, quorum_state=QuorumStateData(1, None, None))
    elect(core)  # epoch 2 starts at offset 1 with its LeaderChange record
    effects = fetch_from(core, 1, 1, 1)  # a majority has the old entry, not ours
    assert of(effects, HighWatermarkUpdated) == []
    assert of(fetch_from(core, 1, 2, 2, corr=2), HighWatermarkUpdated) == [
        HighWatermarkUpdated(2, 2)
    ]


def test_caught_up_fetch_parks_until_an_append_or_its_max_wait():
    core = leader_with_log()
    # Follower 1's fetch moves the high watermark: answered at once, so it learns it.
    (moved,) = sends(fetch_from(core, 1, 1, 1, corr=1), FetchResponse)
    assert moved.message.high_watermark == 1 and moved.message.records == ()
    # Follower 2 has not heard of high watermark 1 (follower 1's fetch moved it): it is
    # answered at once too, else it would learn of the commit only at max wait.
    (news,) = sends(fetch_from(core, 2, 1, 1, corr=8), FetchResponse)
    assert news.message.high_watermark == 1 and news.message.records == ()
    parked = fetch_from(core, 2, 1, 1, corr=9)
    assert sends(parked, FetchResponse) == []  # parked: nothing to say yet
    assert core.next_deadline_ms() == core.clock.now_ms() + 500
    fetch_from(core, 1, 1, 1, corr=2)  # caught up and nothing moves: parks too
    last, effects = core.append([b"x"])
    assert last == 1
    answers = {s.destination: s.message for s in sends(effects, FetchResponse)}
    assert set(answers) == {1, 2}  # both caught-up followers were parked
    answer = answers[2]
    assert answer.correlation_id == 9
    assert [e.data for e in answer.records] == [b"x"]
    (hw_news,) = sends(fetch_from(core, 2, 2, 1, corr=10), FetchResponse)  # HW 1 -> 2
    assert hw_news.message.high_watermark == 2
    fetch_from(core, 2, 2, 1, corr=11)
    core.clock.advance(499)
    assert sends(core.poll(), FetchResponse) == []
    core.clock.advance(1)
    (expired,) = sends(core.poll(), FetchResponse)
    assert expired.message.correlation_id == 11 and expired.message.records == ()


def test_leader_answers_a_diverging_fetch_with_the_epoch_end():
    log = RaftLog(entries=[Entry(0, 1, b"a")])
    core = make(log=log, quorum_state=QuorumStateData(1, None, None))
    elect(core)
    effects = fetch_from(core, 1, 3, 1)  # follower has 3 entries of epoch 1, we have 1
    answer = sends(effects, FetchResponse)[0].message
    assert answer.diverging_epoch == OffsetAndEpoch(1, 1)


def test_only_the_leader_answers_fetches_and_stale_epochs_are_fenced():
    follower = make(node_id=1)
    follower.handle(0, BeginQuorumEpochRequest(2, 0))
    reply = sends(follower.handle(2, FetchRequest(1, 2, 2, 0, 0, 500)))[0].message
    assert reply.error == ErrorCode.NOT_LEADER_OR_FOLLOWER and reply.leader_id == 0
    core = leader_with_log()
    reply = sends(core.handle(1, FetchRequest(1, 1, 0, 0, 0, 500)))[0].message
    assert reply.error == ErrorCode.FENCED_LEADER_EPOCH


def test_leader_without_a_majority_fetching_resigns_and_stops_appending():
    core = leader_with_log()
    timeout = CONFIG.check_quorum_timeout_ms
    core.clock.advance(timeout - 1)
    fetch_from(core, 1, 1, 1)  # one follower keeps fetching: with us, a majority of 3
    core.clock.advance(timeout - 1)
    core.poll()
    assert core.role == "leader"
    core.clock.advance(timeout)  # nobody fetched for the whole timeout
    effects = core.poll()
    assert core.role == "resigned"
    assert {s.destination for s in sends(effects, EndQuorumEpochRequest)} == {1, 2}
    with pytest.raises(NotLeaderOrFollower):
        core.append([b"late"])
    # and a resigned leader votes for nobody in its epoch
    assert not sends(core.handle(1, VoteRequest(core.epoch, 1, 9, 99)))[0].message.vote_granted


def test_end_quorum_epoch_hurries_the_most_caught_up_successor():
    core = make(node_id=1)
    core.handle(0, BeginQuorumEpochRequest(2, 0))
    core.handle(0, EndQuorumEpochRequest(2, 0, preferred_successors=(1, 2)))
    assert core.next_deadline_ms() < CONFIG.election_backoff_max_ms // 3
    core.clock.advance(CONFIG.election_backoff_max_ms)
    core.poll()
    assert core.role == "prospective"
    # the other follower heard the same EndQuorumEpoch, so it grants the pre-vote at once
    other = make(node_id=2)
    other.handle(0, BeginQuorumEpochRequest(2, 0))
    other.handle(0, FetchResponse(other.state.correlation_id, ErrorCode.NONE, 2, 0, None))
    assert other.state.fetched_at is not None
    ask = VoteRequest(2, 1, 0, 0, pre_vote=True)
    assert not sends(other.handle(1, ask))[0].message.vote_granted  # its leader is live
    other.handle(0, EndQuorumEpochRequest(2, 0, preferred_successors=(1, 2)))
    (answer,) = sends(other.handle(1, ask), VoteResponse)
    assert answer.message.vote_granted
    core.handle(2, answer.message)
    assert core.role == "candidate" and core.epoch == 3


def test_restart_from_persisted_state():
    leader = make(quorum_state=QuorumStateData(4, 0, 0))
    assert leader.role == "resigned" and leader.epoch == 4  # never resumes as leader
    follower = make(quorum_state=QuorumStateData(4, 2, None))
    assert follower.role == "follower" and follower.leader_id == 2
    voted = make(quorum_state=QuorumStateData(4, None, 1))
    assert not sends(voted.handle(2, VoteRequest(4, 2, 9, 99)))[0].message.vote_granted
    behind = make(
        quorum_state=QuorumStateData(1, None, None), log=RaftLog(entries=[Entry(0, 3, b"a")])
    )
    assert behind.epoch == 3  # the log knows a later epoch than the quorum-state


def test_snapshot_only_of_committed_state_and_it_drops_the_prefix():
    core = leader_with_log()
    core.append([b"a", b"b"])
    with pytest.raises(ValueError, match="beyond the high watermark"):
        core.create_snapshot(2, b"s")
    fetch_from(core, 1, 3, 1)
    effects = core.create_snapshot(2, b"s")
    assert of(effects, StoreSnapshot)[0].snapshot.snapshot_id == OffsetAndEpoch(2, 1)
    assert core.log.start_offset == 2
    answer = sends(fetch_from(core, 2, 1, 1, corr=5), FetchResponse)[0].message
    assert answer.snapshot_id == OffsetAndEpoch(2, 1)


def test_single_voter_quorum_leads_and_commits_alone():
    core = make(voters=(0,))
    core.clock.advance(2 * T)
    effects = core.poll()
    assert core.role == "leader"
    assert of(effects, HighWatermarkUpdated) == [HighWatermarkUpdated(1, 1)]


def test_every_durable_effect_precedes_the_sends_after_it_in_an_election():
    core = make()
    effects = elect(core)
    kinds = [isinstance(e, DURABLE) for e in effects]
    assert kinds.index(True) < [isinstance(e, Send) for e in effects].index(True)


def test_a_node_not_among_the_voters_is_refused():
    with pytest.raises(ValueError, match="not one of the voters"):
        make(node_id=9)


def test_graceful_resign_hands_over_to_the_most_caught_up_voter_first():
    core = leader_with_log()
    fetch_from(core, 2, 1, 1)  # voter 2 is caught up, voter 1 has fetched nothing
    effects = core.resign()
    assert core.role == "resigned"
    ends = sends(effects, EndQuorumEpochRequest)
    assert [s.destination for s in ends] == [2, 1]
    assert ends[0].message.preferred_successors == (2, 1)
    assert of(effects, LeaderChanged)[-1] == LeaderChanged("resigned", core.epoch, 0)
    core.clock.advance(2 * T)
    core.poll()
    assert core.role == "prospective" and core.leader_id is None  # not itself again
    win_pre_vote(core, 2)
    assert core.epoch == 2


# ---------------------------------------------------------------- pre-vote (KIP-996)


def following(node_id=1, leader=0, epoch=2) -> KafkaRaftClient:
    """A follower of ``leader`` in ``epoch`` whose first fetch was answered just now."""
    core = make(node_id=node_id)
    core.handle(leader, BeginQuorumEpochRequest(epoch, leader))
    core.handle(leader, FetchResponse(core.state.correlation_id, ErrorCode.NONE, epoch, leader))
    return core


def pre_vote_answer(core: KafkaRaftClient, source: int, epoch: int) -> VoteResponse:
    (reply,) = sends(core.handle(source, VoteRequest(epoch, source, 0, 0, pre_vote=True)))
    return reply.message


def test_check_quorum_a_follower_hearing_its_leader_and_the_leader_refuse_pre_votes():
    follower = following()
    answer = pre_vote_answer(follower, 2, 2)
    assert answer == VoteResponse(ErrorCode.NONE, 2, 0, False, pre_vote=True)
    follower.clock.advance(CONFIG.fetch_timeout_ms - 1)
    assert not pre_vote_answer(follower, 2, 2).vote_granted
    follower.clock.advance(1)  # a whole fetch timeout without an answer: the leader may be gone
    assert pre_vote_answer(follower, 2, 2).vote_granted
    assert follower.role == "follower" and follower.epoch == 2  # a pre-vote changes nothing
    leader = make()
    elect(leader)
    assert not pre_vote_answer(leader, 1, leader.epoch).vote_granted
    assert leader.role == "leader"


def test_granting_a_pre_vote_persists_nothing_and_casts_no_vote():
    core = make(node_id=1, quorum_state=QuorumStateData(4, None, None))
    effects = core.handle(2, VoteRequest(4, 2, 0, 0, pre_vote=True))
    assert sends(effects)[0].message.vote_granted and not of(effects, PersistQuorumState)
    assert core.state.voted_id is None and core.epoch == 4
    # the standard vote of this epoch is still free for another candidate
    assert sends(core.handle(0, VoteRequest(4, 0, 0, 0)))[0].message.vote_granted
    # a pre-vote is still refused to a candidate whose log is behind
    behind = make(node_id=1, log=RaftLog(entries=[Entry(0, 3, b"a")]))
    assert not pre_vote_answer(behind, 2, 3).vote_granted


def test_a_pre_vote_from_a_later_epoch_moves_the_receiver_up_to_it():
    """As in Kafka's Vote v2: else a voter that missed an epoch could never be elected."""
    core = make(node_id=1, quorum_state=QuorumStateData(1, None, None))
    assert pre_vote_answer(core, 2, 3).vote_granted
    assert core.epoch == 3 and core.role == "unattached" and core.state.voted_id is None
    stale = pre_vote_answer(core, 0, 2)
    assert stale.error == ErrorCode.FENCED_LEADER_EPOCH and not stale.vote_granted


def test_a_resumed_follower_goes_back_to_its_leader_when_a_majority_refuses():
    """The paused-broker case: its fetch timeout ran out while it was stopped."""
    core = following()
    core.clock.advance(10 * CONFIG.fetch_timeout_ms)  # paused: no ticks, no messages
    effects = core.poll()
    assert core.role == "prospective" and core.epoch == 2 and core.leader_id == 0
    assert not of(effects, PersistQuorumState)  # nothing durable: epoch and vote unchanged
    assert of(effects, LeaderChanged)[-1] == LeaderChanged("prospective", 2, 0)
    assert {s.destination for s in sends(effects, VoteRequest)} == {0, 2}
    # the leader refuses and names itself: our own leader, so we wait for the majority
    assert not core.handle(0, VoteResponse(ErrorCode.NONE, 2, 0, False, pre_vote=True))
    assert core.role == "prospective"
    effects = core.handle(2, VoteResponse(ErrorCode.NONE, 2, 0, False, pre_vote=True))
    assert core.role == "follower" and core.epoch == 2 and core.leader_id == 0
    assert sends(effects, FetchRequest)[0].destination == 0


def test_a_prospective_whose_round_times_out_follows_its_leader_again():
    core = following()
    core.clock.advance(2 * CONFIG.fetch_timeout_ms)
    core.poll()
    assert core.role == "prospective"
    core.clock.advance(core.next_deadline_ms() - core.now())  # nobody answered
    core.poll()
    assert core.role == "follower" and core.epoch == 2 and core.leader_id == 0


def test_a_grant_of_the_other_kind_is_not_counted():
    core = make()
    core.clock.advance(2 * T)
    core.poll()
    assert not core.handle(1, VoteResponse(ErrorCode.NONE, 0, None, True))  # not a pre-vote
    assert core.role == "prospective"
    win_pre_vote(core, 2)
    core.handle(1, VoteResponse(ErrorCode.NONE, 1, None, True, pre_vote=True))
    assert core.role == "candidate"  # a late pre-vote grant is no vote


def test_a_prospective_without_a_leader_votes_for_a_candidate_of_its_epoch():
    core = make(node_id=1, quorum_state=QuorumStateData(3, None, None))
    core.clock.advance(2 * T)
    core.poll()
    assert core.role == "prospective" and core.epoch == 3
    effects = core.handle(2, VoteRequest(3, 2, 0, 0))
    assert sends(effects, VoteResponse)[0].message.vote_granted
    assert of(effects, PersistQuorumState)[-1].state == QuorumStateData(3, None, 2)
    assert core.role == "unattached" and core.state.voted_id == 2
    # a prospective that voted (its own candidacy timed out) never votes twice in the epoch
    again = make()
    again.clock.advance(2 * T)
    again.poll()
    win_pre_vote(again, 1)
    again.clock.advance(2 * T)
    again.poll()
    assert again.role == "prospective" and again.state.voted_id == 0
    assert not sends(again.handle(2, VoteRequest(1, 2, 0, 0)))[0].message.vote_granted
