"""The quorum's RPCs (KIP-595, KIP-630) and the log's value types, as plain slotted records.

Field names follow Kafka's message specs (VoteRequest.json, FetchRequest.json, ...), cut to
what a single-partition metadata quorum needs. Every request carries the sender's view of the
epoch so a receiver can fence stale senders; every response carries the responder's
(leader_epoch, leader_id) so a stale receiver learns the new leader from any answer.

Fetch and FetchSnapshot carry a ``correlation_id`` the responder echoes: a follower has one
fetch outstanding and acts only on the answer to it, so a delayed or duplicated answer (the
simulated network makes both; a reconnect can too) never appends records twice or out of place.
"""

from __future__ import annotations

from dataclasses import dataclass

from minibroker.protocol.errors import ErrorCode


@dataclass(slots=True, frozen=True, order=True)
class OffsetAndEpoch:
    """Kafka's OffsetAndEpoch: an end offset (exclusive) and the epoch of the entry before it."""

    offset: int
    epoch: int


@dataclass(slots=True, frozen=True)
class Entry:
    """One log entry. ``control`` marks KRaft's control records (LeaderChange): not state."""

    offset: int
    epoch: int
    data: bytes
    control: bool = False


@dataclass(slots=True, frozen=True)
class Snapshot:
    """The state machine at ``snapshot_id.offset`` (exclusive), made from committed entries."""

    snapshot_id: OffsetAndEpoch
    data: bytes


@dataclass(slots=True, frozen=True)
class VoteRequest:
    """A standard vote, or with ``pre_vote`` (KIP-996) the question "would you vote for me?".

    A pre-vote carries the sender's current epoch (as Kafka's Vote v2 ReplicaEpoch does):
    the prospective candidate has not bumped it, and the answer changes nothing durable.
    """

    candidate_epoch: int
    candidate_id: int
    last_offset_epoch: int
    last_offset: int
    pre_vote: bool = False


@dataclass(slots=True, frozen=True)
class VoteResponse:
    """``pre_vote`` echoes the request's, so a grant is never counted for the other kind."""

    error: ErrorCode
    leader_epoch: int
    leader_id: int | None
    vote_granted: bool
    pre_vote: bool = False


@dataclass(slots=True, frozen=True)
class BeginQuorumEpochRequest:
    leader_epoch: int
    leader_id: int


@dataclass(slots=True, frozen=True)
class BeginQuorumEpochResponse:
    error: ErrorCode
    leader_epoch: int
    leader_id: int | None


@dataclass(slots=True, frozen=True)
class EndQuorumEpochRequest:
    leader_epoch: int
    leader_id: int
    preferred_successors: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class EndQuorumEpochResponse:
    error: ErrorCode
    leader_epoch: int
    leader_id: int | None


@dataclass(slots=True, frozen=True)
class FetchRequest:
    correlation_id: int
    replica_id: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    max_wait_ms: int


@dataclass(slots=True, frozen=True)
class FetchResponse:
    correlation_id: int
    error: ErrorCode
    leader_epoch: int
    leader_id: int | None
    high_watermark: int | None = None
    records: tuple[Entry, ...] = ()
    diverging_epoch: OffsetAndEpoch | None = None
    snapshot_id: OffsetAndEpoch | None = None


@dataclass(slots=True, frozen=True)
class FetchSnapshotRequest:
    correlation_id: int
    replica_id: int
    current_leader_epoch: int
    snapshot_id: OffsetAndEpoch


@dataclass(slots=True, frozen=True)
class FetchSnapshotResponse:
    """The whole snapshot in one answer: metadata snapshots are small (Kafka chunks by position)."""

    correlation_id: int
    error: ErrorCode
    leader_epoch: int
    leader_id: int | None
    snapshot: Snapshot | None = None


Request = (
    VoteRequest
    | BeginQuorumEpochRequest
    | EndQuorumEpochRequest
    | FetchRequest
    | FetchSnapshotRequest
)
Response = (
    VoteResponse
    | BeginQuorumEpochResponse
    | EndQuorumEpochResponse
    | FetchResponse
    | FetchSnapshotResponse
)
Message = Request | Response
