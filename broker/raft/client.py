"""KafkaRaftClient, sans-IO: one voter's Raft core. Messages and clock ticks in, effects out.

Every public call returns the effects it produced, in order (see effects.py for the contract).
The core reads time from an injected clock (``now_ms()``) and randomness from an injected
``random.Random``, so a seeded simulation replays exactly. It keeps the log in memory
(RaftLog); the driver mirrors it durably by applying the same effects.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

from minibroker.broker.common.clock import Clock
from minibroker.broker.raft import follower as following
from minibroker.broker.raft import leader as leading
from minibroker.broker.raft.config import QuorumConfig
from minibroker.broker.raft.effects import (
    AppendLog,
    Effect,
    HighWatermarkUpdated,
    LeaderChanged,
    PersistQuorumState,
    QuorumStateData,
    Send,
    StoreSnapshot,
)
from minibroker.broker.raft.log import RaftLog
from minibroker.broker.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    OffsetAndEpoch,
    Snapshot,
    VoteRequest,
    VoteResponse,
)
from minibroker.broker.raft.state import (
    CandidateState,
    Election,
    EpochState,
    FollowerState,
    IllegalStateError,
    LeaderState,
    ProspectiveState,
    ReplicaState,
    ResignedState,
    UnattachedState,
)
from minibroker.protocol.errors import ErrorCode, NotLeaderOrFollower


class KafkaRaftClient:
    def __init__(
        self,
        node_id: int,
        voters: Iterable[int],
        clock: Clock,
        rng: random.Random,
        *,
        config: QuorumConfig | None = None,
        quorum_state: QuorumStateData | None = None,
        log: RaftLog | None = None,
    ) -> None:
        self.node_id = node_id
        self.voters = frozenset(voters)
        if node_id not in self.voters:
            raise ValueError(f"node {node_id} is not one of the voters {sorted(self.voters)}")
        self.majority = len(self.voters) // 2 + 1
        self.config = config or QuorumConfig()
        self.clock = clock
        self.rng = rng
        self.log = log if log is not None else RaftLog()
        self.high_watermark = self.log.start_offset  # a snapshot holds committed state only
        self._out: list[Effect] = []
        self._correlation = rng.randrange(1 << 30)  # never mistake a past life's answers
        self.state: EpochState = self._initial_state(quorum_state or QuorumStateData())
        if self.voters == {node_id} and isinstance(self.state, UnattachedState | ResignedState):
            self.state.election_deadline = self.now()  # a lone voter needs nobody's vote
        self._announce()

    # ------------------------------------------------------------------ public API

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def role(self) -> str:
        return self.state.name

    @property
    def leader_id(self) -> int | None:
        s = self.state
        if isinstance(s, LeaderState | ResignedState):
            return self.node_id
        return s.leader_id if isinstance(s, FollowerState | ProspectiveState) else None

    def start(self) -> list[Effect]:
        """The effects construction produced (the first LeaderChanged, a restored state's
        fix-up): the driver applies them before anything else."""
        return self._drain()

    @property
    def is_active_leader(self) -> bool:
        """Leader of an epoch whose first entry has committed: KRaft's active controller."""
        s = self.state
        return isinstance(s, LeaderState) and self.high_watermark > s.epoch_start_offset

    @property
    def follower_high_watermark(self) -> int | None:
        """As a follower, the high watermark its leader last reported (None before the
        first answer, and in any other role)."""
        s = self.state
        return s.high_watermark if isinstance(s, FollowerState) else None

    def voter_lag(self) -> dict[int, int] | None:
        """As leader, each voter's entries behind the log end (-1: not heard from yet)."""
        s = self.state
        if not isinstance(s, LeaderState):
            return None
        end = self.log.end_offset
        lag = {
            v: (end - r.end_offset if r.end_offset is not None else -1) for v, r in s.voters.items()
        }
        return lag | {self.node_id: 0}

    def voter_fetch_age_ms(self) -> dict[int, int] | None:
        """As leader, ms since each other voter last fetched (Kafka's DescribeQuorum
        LastFetchTimestamp, as an age): what check-quorum counts."""
        s = self.state
        if not isinstance(s, LeaderState):
            return None
        now = self.now()
        return {v: now - r.last_fetch_ms for v, r in s.voters.items()}

    @property
    def is_follower(self) -> bool:
        return isinstance(self.state, FollowerState)

    def poll(self) -> list[Effect]:
        """Run whatever is due on the clock (timeouts, resends, expired parked fetches)."""
        now = self.clock.now_ms()
        s = self.state
        if isinstance(s, FollowerState):
            following.poll(self, s, now)
        elif isinstance(s, LeaderState):
            leading.poll(self, s, now)
        elif isinstance(s, CandidateState | ProspectiveState):
            if now >= s.election_deadline:
                self._election_over(s)
            else:
                for voter, at in list(s.resend_at.items()):
                    if now >= at:
                        self._send_vote_request(voter, s)
        elif now >= s.election_deadline:
            self.to_prospective()
        return self._drain()

    def next_deadline_ms(self) -> int:
        """When ``poll`` next has work: the driver's timer should fire then."""
        s = self.state
        if isinstance(s, FollowerState):
            fetch_at = s.in_flight_until if s.in_flight_until is not None else s.next_fetch_at
            return min(s.fetch_deadline, fetch_at)
        if isinstance(s, LeaderState):
            return leading.next_deadline(self, s)
        if isinstance(s, CandidateState | ProspectiveState) and s.resend_at:
            return min(s.election_deadline, *s.resend_at.values())
        return s.election_deadline

    def handle(self, source: int, message: Message) -> list[Effect]:
        """Process one message from voter ``source``."""
        if source not in self.voters or source == self.node_id:
            return []  # observers are not modelled; a stray sender is ignored
        handler = _HANDLERS[type(message)]
        handler(self, source, message)
        return self._drain()

    def request_failed(self, destination: int, message: Message) -> list[Effect]:
        """Our request to ``destination`` failed in transit (refused, reset, timed out).

        Kafka's RequestManager backs off ``retry.backoff.ms`` and asks again, rather than
        waiting out the request timeout: a voter that restarted since we last spoke to it
        must get our VoteRequest now, not two seconds later, or the election splits.
        """
        s = self.state
        retry_at = self.now() + self.config.retry_backoff_ms
        if isinstance(s, CandidateState | ProspectiveState) and isinstance(message, VoteRequest):
            ours = message.pre_vote == isinstance(s, ProspectiveState)
            if ours and message.candidate_epoch == s.epoch and destination in s.resend_at:
                s.resend_at[destination] = retry_at
        elif isinstance(s, FollowerState) and destination == s.leader_id:
            if getattr(message, "correlation_id", None) == s.correlation_id:
                s.in_flight_until = None
                s.next_fetch_at = retry_at
        elif isinstance(s, LeaderState) and isinstance(message, BeginQuorumEpochRequest):
            replica = s.voters.get(destination)
            if replica is not None and message.leader_epoch == s.epoch:
                replica.begin_resend_at = min(replica.begin_resend_at, retry_at)
        return self._drain()

    def append(
        self, records: Sequence[bytes], epoch: int | None = None
    ) -> tuple[int, list[Effect]]:
        """Append records as leader (Kafka's scheduleAppend); returns the last offset."""
        s = self.state
        if not isinstance(s, LeaderState) or (epoch is not None and epoch != s.epoch):
            raise NotLeaderOrFollower(
                f"node {self.node_id} is {self.role} in epoch {self.epoch}, not leader"
            )
        last = leading.append(self, s, records, control=False)
        return last, self._drain()

    def create_snapshot(self, end_offset: int, data: bytes) -> list[Effect]:
        """Keep the state machine's snapshot at committed ``end_offset``; the log before it goes."""
        if end_offset > self.high_watermark:
            raise ValueError(
                f"snapshot at {end_offset} beyond the high watermark {self.high_watermark}"
            )
        if end_offset <= self.log.start_offset:
            return []
        snapshot = Snapshot(OffsetAndEpoch(end_offset, self.log.epoch_at(end_offset)), data)
        self.store_snapshot(snapshot)
        return self._drain()

    def resign(self) -> list[Effect]:
        """Graceful shutdown of a leader: EndQuorumEpoch lets the others elect at once."""
        if isinstance(self.state, LeaderState):
            self.to_resigned()
        return self._drain()

    # ------------------------------------------------------------------ plumbing

    def now(self) -> int:
        return self.clock.now_ms()

    def emit(self, effect: Effect) -> None:
        self._out.append(effect)

    def send(self, destination: int, message: Message) -> None:
        self._out.append(Send(destination, message))

    def _drain(self) -> list[Effect]:
        out, self._out = self._out, []
        return out

    def next_correlation_id(self) -> int:
        self._correlation += 1
        return self._correlation

    def random_election_deadline(self) -> int:
        timeout = self.config.election_timeout_ms
        return self.now() + timeout + self.rng.randrange(timeout)

    def fetch_deadline(self) -> int:
        """When a follower that hears nothing more from its leader starts an election.

        Kafka's fetch timeout, plus a random quarter of it: followers that last heard the
        leader in the same moment (it answers their parked fetches together) would
        otherwise stand in the same millisecond, each vote for itself, and split the
        vote, which then costs a whole randomized election timeout.
        """
        timeout = self.config.fetch_timeout_ms
        return self.now() + timeout + self.rng.randrange(max(1, timeout // 4))

    def advance_high_watermark(self, offset: int) -> None:
        if offset > self.high_watermark:
            self.high_watermark = offset
            self.emit(HighWatermarkUpdated(offset, self.epoch))

    def append_entries(self, entries: tuple) -> None:
        self.emit(AppendLog(entries))
        self.log.append(entries)

    def store_snapshot(self, snapshot: Snapshot) -> None:
        self.emit(StoreSnapshot(snapshot))
        self.log.store_snapshot(snapshot)

    # ------------------------------------------------------------------ transitions

    def _initial_state(self, stored: QuorumStateData) -> EpochState:
        """Kafka's QuorumState.initialize: resume the stored epoch, never as its leader."""
        now = self.now()
        epoch = stored.leader_epoch
        if self.log.last_epoch > epoch:  # the quorum-state is behind the log: start from it
            self._persist(self.log.last_epoch, None, None)
            return UnattachedState(self.log.last_epoch, self.random_election_deadline())
        if stored.leader_id == self.node_id:
            return ResignedState(epoch, self.random_election_deadline())
        if stored.leader_id is not None:
            return FollowerState(
                epoch, stored.leader_id, self.fetch_deadline(), voted_id=stored.voted_id
            )
        if epoch == 0 and self.log.end_offset == 0 and self.stands_first():
            # A brand-new quorum: its lowest voter stands at once (a pre-vote round the
            # fresh voters grant straight away) instead of every voter waiting out an
            # election timeout; a lone voter elects itself right away. Only liveness
            # depends on who stands first (the simulation has seeds where two do); a
            # restarted voter (epoch > 0) waits, so it cannot depose a running leader.
            return UnattachedState(epoch, now)
        return UnattachedState(epoch, self.random_election_deadline(), stored.voted_id)

    def stands_first(self) -> bool:
        """Whether this voter of a brand-new quorum stands without waiting."""
        return self.node_id == min(self.voters)

    def _persist(self, epoch: int, leader_id: int | None, voted_id: int | None) -> None:
        self.emit(PersistQuorumState(QuorumStateData(epoch, leader_id, voted_id)))

    def _announce(self) -> None:
        self.emit(LeaderChanged(self.role, self.epoch, self.leader_id))

    def _set_state(self, new: EpochState) -> None:
        old, self.state = self.state, new
        if isinstance(old, LeaderState):
            leading.answer_parked(self, old, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self._announce()

    def _voted_in(self, epoch: int) -> int | None:
        """The vote this voter cast (and made durable) in ``epoch``, if it is the current one."""
        s = self.state
        if s.epoch != epoch:
            return None
        if isinstance(s, CandidateState | LeaderState | ResignedState):
            return self.node_id
        return s.voted_id

    def _to_unattached(self, epoch: int) -> None:
        self._persist(epoch, None, None)
        # Raft's rule: only a leader's word or a granted vote resets the election timer, not a
        # higher epoch seen. Else a candidate whose stale log loses every vote, retrying after
        # its short backoff, would keep every other voter's timer from ever firing.
        s = self.state
        keep = isinstance(s, UnattachedState | ProspectiveState | CandidateState | ResignedState)
        deadline = s.election_deadline if keep else self.random_election_deadline()
        self._set_state(UnattachedState(epoch, deadline))

    def _to_follower(self, epoch: int, leader_id: int) -> None:
        voted = self._voted_in(epoch)
        self._persist(epoch, leader_id, voted)
        now = self.now()
        self._set_state(FollowerState(epoch, leader_id, self.fetch_deadline(), voted_id=voted))
        following.send_fetch(self, self.state, now)

    def to_prospective(self) -> None:
        """KIP-996: ask for pre-votes in the current epoch; bump it only once a majority grants.

        Entered on every timeout that used to start an election (fetch, election, a lost or
        timed-out candidacy, a resigned leader's). Nothing is persisted: the epoch and the
        vote already cast in it stay, and the leader we followed (if any) is kept.
        """
        s = self.state
        leader = s.leader_id if isinstance(s, FollowerState | ProspectiveState) else None
        p = ProspectiveState(
            s.epoch,
            self.random_election_deadline(),
            leader,
            self._voted_in(s.epoch),
            granting={self.node_id},
        )
        self._set_state(p)
        for voter in sorted(self.voters - {self.node_id}):
            self._send_vote_request(voter, p)
        self._maybe_win(p)

    def to_candidate(self) -> None:
        epoch = self.epoch + 1
        self._persist(epoch, None, self.node_id)  # our own vote, durable before we ask for any
        s = CandidateState(epoch, self.random_election_deadline(), granting={self.node_id})
        self._set_state(s)
        for voter in sorted(self.voters - {self.node_id}):
            self._send_vote_request(voter, s)
        self._maybe_win(s)

    def _send_vote_request(self, voter: int, s: Election) -> None:
        end = self.log.end_offset_and_epoch()
        pre_vote = isinstance(s, ProspectiveState)
        self.send(voter, VoteRequest(s.epoch, self.node_id, end.epoch, end.offset, pre_vote))
        s.resend_at[voter] = self.now() + self.config.request_timeout_ms

    def _maybe_win(self, s: Election) -> None:
        if len(s.granting) >= self.majority:
            if isinstance(s, ProspectiveState):
                self.to_candidate()  # a majority would vote for us: now the epoch may move
            else:
                self._to_leader(s.epoch)

    def _election_lost(self, s: Election) -> None:
        """A majority said no: a prospective with a leader goes back to it (it is alive, the
        others hear it); otherwise back off, then ask again (_election_over)."""
        if isinstance(s, ProspectiveState) and s.leader_id is not None:
            self._to_follower(s.epoch, s.leader_id)
            return
        backoff = self.rng.randrange(self.config.election_backoff_max_ms)
        s.election_deadline = min(s.election_deadline, self.now() + backoff)

    def _election_over(self, s: Election) -> None:
        """The election timer ran out (no majority either way, or a lost one backed off)."""
        if isinstance(s, ProspectiveState) and s.leader_id is not None:
            self._to_follower(s.epoch, s.leader_id)
        else:
            self.to_prospective()  # Kafka: even a timed-out candidate asks again with pre-votes

    def _to_leader(self, epoch: int) -> None:
        self._persist(epoch, self.node_id, self.node_id)
        now = self.now()
        others = {v: ReplicaState(last_fetch_ms=now) for v in sorted(self.voters - {self.node_id})}
        s = LeaderState(epoch, self.log.end_offset, others)
        self._set_state(s)
        leading.begin_epoch(self, s)

    def to_resigned(self) -> None:
        s = self.state
        assert isinstance(s, LeaderState)
        successors = leading.preferred_successors(s)
        self._set_state(ResignedState(s.epoch, self.random_election_deadline()))
        for voter in successors:
            self.send(voter, EndQuorumEpochRequest(s.epoch, self.node_id, successors))

    def maybe_transition(self, epoch: int, leader_id: int | None) -> None:
        """Follow what a peer says about a newer epoch or this epoch's leader."""
        if epoch > self.epoch:
            if leader_id is not None and leader_id != self.node_id:
                self._to_follower(epoch, leader_id)
            else:
                self._to_unattached(epoch)
            return
        if epoch < self.epoch or leader_id is None or leader_id == self.node_id:
            return
        s = self.state
        if isinstance(s, FollowerState):
            if s.leader_id != leader_id:
                raise IllegalStateError(f"epoch {epoch} has leaders {s.leader_id} and {leader_id}")
        elif isinstance(s, LeaderState | ResignedState):
            raise IllegalStateError(
                f"node {leader_id} claims epoch {epoch}, which {self.node_id} led"
            )
        elif isinstance(s, ProspectiveState) and s.leader_id is not None:
            if s.leader_id != leader_id:
                raise IllegalStateError(f"epoch {epoch} has leaders {s.leader_id} and {leader_id}")
            # Our own leader, still claiming the epoch: the pre-vote round decides whether we
            # follow it again (a majority rejecting) or stand (a majority not hearing it).
        else:
            self._to_follower(epoch, leader_id)

    # ------------------------------------------------------------------ votes

    def log_is_up_to_date(self, req: VoteRequest) -> bool:
        """Raft's election restriction: the candidate's log is at least as long as ours."""
        ours = self.log.end_offset_and_epoch()
        return (req.last_offset_epoch, req.last_offset) >= (ours.epoch, ours.offset)

    def _on_vote_request(self, source: int, req: VoteRequest) -> None:
        if req.candidate_epoch < self.epoch:
            error, granted = ErrorCode.FENCED_LEADER_EPOCH, False
        else:
            if req.candidate_epoch > self.epoch:
                # A pre-vote's epoch exists already (its sender has not bumped it), so we
                # move up to it as for a standard vote: Kafka's Vote v2 handling does too,
                # and a voter that lags an epoch behind could not be elected otherwise.
                self._to_unattached(req.candidate_epoch)
            error = ErrorCode.NONE
            granted = self._grants_pre_vote(req) if req.pre_vote else self._grants_vote(source, req)
        self.send(source, VoteResponse(error, self.epoch, self.leader_id, granted, req.pre_vote))

    def _grants_vote(self, source: int, req: VoteRequest) -> bool:
        """A standard vote: once per epoch, to a candidate whose log is up to date."""
        s = self.state
        if (
            isinstance(s, ProspectiveState)
            and s.leader_id is None
            and s.voted_id is None
            and self.log_is_up_to_date(req)
        ):
            # Another voter stands in our epoch first: drop our own bid and vote for it.
            s = UnattachedState(s.epoch, s.election_deadline)
            self._set_state(s)
        if isinstance(s, UnattachedState):
            if s.voted_id is None and self.log_is_up_to_date(req):
                s.voted_id = source
                self._persist(s.epoch, None, source)  # durable before the answer goes out
                s.election_deadline = self.random_election_deadline()
            return s.voted_id == source
        return isinstance(s, ProspectiveState) and s.voted_id == source

    def _grants_pre_vote(self, req: VoteRequest) -> bool:
        """KIP-996 with check-quorum: yes if the log is up to date and no live leader is heard.

        A leader (or one that just resigned) refuses; a follower refuses while its leader
        answered a fetch within the fetch timeout, so a voter that was paused or cut off
        cannot start an election against a leader the rest of the quorum still follows.
        Nothing changes here: the vote a pre-vote asks about is not cast.
        """
        s = self.state
        if not self.log_is_up_to_date(req) or isinstance(s, LeaderState | ResignedState):
            return False
        if isinstance(s, FollowerState) and s.fetched_at is not None:
            return self.now() - s.fetched_at >= self.config.fetch_timeout_ms
        return True

    def _on_vote_response(self, source: int, resp: VoteResponse) -> None:
        self.maybe_transition(resp.leader_epoch, resp.leader_id)
        s = self.state
        if (
            not isinstance(s, CandidateState | ProspectiveState)
            or resp.leader_epoch != s.epoch
            or resp.pre_vote != isinstance(s, ProspectiveState)
        ):
            return
        s.resend_at.pop(source, None)
        if resp.vote_granted:
            s.granting.add(source)
            self._maybe_win(s)
        elif resp.error == ErrorCode.NONE:
            s.rejecting.add(source)
            if len(s.rejecting) >= self.majority:
                self._election_lost(s)

    # ------------------------------------------------------------------ epoch announcements

    def _on_begin_epoch(self, source: int, req: BeginQuorumEpochRequest) -> None:
        if req.leader_epoch >= self.epoch:
            self.maybe_transition(req.leader_epoch, req.leader_id)
        error = ErrorCode.NONE if req.leader_epoch == self.epoch else ErrorCode.FENCED_LEADER_EPOCH
        self.send(source, BeginQuorumEpochResponse(error, self.epoch, self.leader_id))

    def _on_begin_epoch_response(self, source: int, resp: BeginQuorumEpochResponse) -> None:
        self.maybe_transition(resp.leader_epoch, resp.leader_id)
        s = self.state
        if isinstance(s, LeaderState) and resp.leader_epoch == s.epoch and source in s.voters:
            s.voters[source].acknowledged = True

    def _on_end_epoch(self, source: int, req: EndQuorumEpochRequest) -> None:
        if req.leader_epoch >= self.epoch:
            self.maybe_transition(req.leader_epoch, req.leader_id)
        s = self.state
        if isinstance(s, FollowerState) and s.epoch == req.leader_epoch and s.leader_id == source:
            s.fetched_at = None  # our leader says it is gone: grant pre-votes from now on
            # Kafka's strict exponential backoff by rank: the most caught-up voter goes first.
            rank = (
                req.preferred_successors.index(self.node_id)
                if self.node_id in req.preferred_successors
                else len(self.voters)
            )
            step = self.config.election_backoff_max_ms // max(1, len(self.voters))
            backoff = rank * step + self.rng.randrange(max(1, step))
            s.fetch_deadline = min(s.fetch_deadline, self.now() + backoff)
        error = ErrorCode.NONE if req.leader_epoch == self.epoch else ErrorCode.FENCED_LEADER_EPOCH
        self.send(source, EndQuorumEpochResponse(error, self.epoch, self.leader_id))

    def _on_end_epoch_response(self, source: int, resp: EndQuorumEpochResponse) -> None:
        self.maybe_transition(resp.leader_epoch, resp.leader_id)


_HANDLERS = {
    VoteRequest: KafkaRaftClient._on_vote_request,
    VoteResponse: KafkaRaftClient._on_vote_response,
    BeginQuorumEpochRequest: KafkaRaftClient._on_begin_epoch,
    BeginQuorumEpochResponse: KafkaRaftClient._on_begin_epoch_response,
    EndQuorumEpochRequest: KafkaRaftClient._on_end_epoch,
    EndQuorumEpochResponse: KafkaRaftClient._on_end_epoch_response,
    FetchRequest: leading.on_fetch,
    FetchResponse: following.on_fetch_response,
    FetchSnapshotRequest: leading.on_fetch_snapshot,
    FetchSnapshotResponse: following.on_fetch_snapshot_response,
}
