"""The epoch states of one voter (Kafka's EpochState family), with the timers each one owns.

Every state is one epoch's view: the core replaces the object on each transition, so nothing
from an old epoch (votes counted, follower offsets, parked fetches) can leak into a new one.
Deadlines are absolute milliseconds on the core's clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minibroker.broker.raft.messages import FetchRequest, OffsetAndEpoch


class IllegalStateError(Exception):
    """A Raft invariant broke (Kafka's IllegalStateException): a bug, or a misconfigured peer."""


@dataclass(slots=True)
class UnattachedState:
    """No leader known in ``epoch``; ``voted_id`` set once we granted our vote (Kafka's Voted)."""

    epoch: int
    election_deadline: int
    voted_id: int | None = None
    name = "unattached"


@dataclass(slots=True)
class ProspectiveState:
    """KIP-996: a voter asking whether it could win (a pre-vote) before it bumps the epoch.

    Nothing durable changes on entering it: the epoch, the vote already cast in it
    (``voted_id``) and the quorum-state stay, so a voter cut off from a healthy leader (a
    paused process, a one-way partition) cannot depose it. ``leader_id`` is the leader it
    followed in this epoch, kept (as Kafka's ProspectiveState keeps it) so that a lost
    pre-vote sends it back to that leader instead of into an election.
    """

    epoch: int
    election_deadline: int
    leader_id: int | None = None
    voted_id: int | None = None
    granting: set[int] = field(default_factory=set)
    rejecting: set[int] = field(default_factory=set)
    # voter -> when to resend our pre-vote if it has not answered
    resend_at: dict[int, int] = field(default_factory=dict)
    name = "prospective"


@dataclass(slots=True)
class CandidateState:
    epoch: int
    election_deadline: int
    granting: set[int] = field(default_factory=set)
    rejecting: set[int] = field(default_factory=set)
    # voter -> when to resend our VoteRequest if it has not answered
    resend_at: dict[int, int] = field(default_factory=dict)
    name = "candidate"


@dataclass(slots=True)
class FollowerState:
    epoch: int
    leader_id: int
    fetch_deadline: int  # no successful fetch until then: start an election
    voted_id: int | None = None
    high_watermark: int | None = None  # the leader's, as its last Fetch answer said
    correlation_id: int = 0
    in_flight_until: int | None = None  # the outstanding Fetch/FetchSnapshot expires then
    next_fetch_at: int = 0  # when to send the next one (a backoff after an error)
    pending_snapshot: OffsetAndEpoch | None = None  # behind the log start: FetchSnapshot this
    # Check-quorum (KIP-996): when the leader last answered a fetch of ours. While that is
    # within the fetch timeout the leader is live and we refuse pre-votes; None (not yet in
    # this state, or the leader announced its resignation) grants them, as Kafka's
    # FollowerState does before its first successful fetch.
    fetched_at: int | None = None
    name = "follower"


@dataclass(slots=True)
class ReplicaState:
    """What the leader knows of one voter: Kafka's LeaderState.ReplicaState."""

    end_offset: int | None = None
    last_fetch_ms: int = 0
    acknowledged: bool = False  # answered BeginQuorumEpoch or fetched in this epoch
    begin_resend_at: int = 0
    # The high watermark our last Fetch answer told this voter: a fetch from a voter that
    # has not heard of the current one is answered at once, not parked (KIP-1166's rule).
    sent_high_watermark: int | None = None


@dataclass(slots=True)
class LeaderState:
    epoch: int
    epoch_start_offset: int
    voters: dict[int, ReplicaState]  # the other voters
    high_watermark: int | None = None
    # replica -> (deadline, request) of a long-poll Fetch with nothing to return yet
    parked: dict[int, tuple[int, FetchRequest]] = field(default_factory=dict)
    name = "leader"


@dataclass(slots=True)
class ResignedState:
    """An ex-leader of ``epoch``: appends nothing, votes for nobody in it, waits to elect anew."""

    epoch: int
    election_deadline: int
    name = "resigned"


EpochState = (
    UnattachedState
    | ProspectiveState
    | CandidateState
    | FollowerState
    | LeaderState
    | ResignedState
)
Election = ProspectiveState | CandidateState  # the two that count votes
