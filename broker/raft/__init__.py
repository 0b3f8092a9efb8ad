"""The controller quorum: a sans-IO Raft core modelled on Kafka's KRaft (KIP-595, KIP-630,
KIP-996 pre-vote).

Pure state: messages and clock ticks in; messages to send, log appends/truncations,
snapshots, "high watermark is now N" and role changes out (effects.py has the driver's
contract). No sockets, trio, threads or wall clock, so tests drive voters over a simulated
network with a manual clock (tests/unit/quorum_sim.py).

Our names against Kafka's (org.apache.kafka.raft):

    KafkaRaftClient            KafkaRaftClient (poll/handle/append = poll/handle*/scheduleAppend)
    QuorumConfig               QuorumConfig (controller.quorum.* keys and defaults)
    QuorumStateData            QuorumStateData, the ``quorum-state`` file
    RaftLog                    ReplicatedLog / KafkaMetadataLog (in memory; driver mirrors it)
    RaftLog.validate_offset_and_epoch, end_offset_for_epoch, truncation_offset
                               ReplicatedLog.validateOffsetAndEpoch, endOffsetForEpoch,
                               truncateToEndOffset
    UnattachedState (voted_id) UnattachedState + VotedState (merged in Kafka 3.9 too)
    ProspectiveState, CandidateState, FollowerState, LeaderState, ResignedState,
    ReplicaState               same names
    VoteRequest.pre_vote       VoteRequest/VoteResponse PreVote (Vote v2; our VOTE v1)
    FollowerState.fetched_at   FollowerState's "has fetched from the leader" (check-quorum)
    leader.py                  LeaderState + the leader half of KafkaRaftClient
    LeaderState.parked         the fetch purgatory (ThresholdPurgatory) of parked Fetches
    Entry(control=True)        control records (LeaderChangeMessage at epoch start)
    Snapshot, OffsetAndEpoch   RawSnapshot / snapshot id (OffsetAndEpoch)
    VoteRequest ... FetchSnapshotResponse   Vote, BeginQuorumEpoch, EndQuorumEpoch, Fetch,
                               FetchSnapshot request/response data (fields cut down)
    HighWatermarkUpdated       RaftClient.Listener.handleCommit's upper bound
    LeaderChanged              RaftClient.Listener.handleLeaderChange
    IllegalStateError          IllegalStateException

Elections (KIP-996): every timeout that used to start an election (a follower's fetch
timeout, an unattached voter's election timeout, a lost candidacy, a resigned leader's)
makes the voter *prospective*: it asks for pre-votes in its current epoch, persisting
nothing, and bumps the epoch as a candidate only once a majority grants. Check-quorum on
both sides: a voter refuses pre-votes while it hears a live leader (a leader always; a
follower whose leader answered a fetch within the fetch timeout), and a leader that has
not heard fetches from a majority for 1.5 fetch timeouts resigns. So a paused or cut-off
voter cannot depose a healthy leader, and a partitioned leader steps down.

Not modelled: observers (non-voter brokers that follow the log), voter set changes
(KIP-853), chunked snapshot transfer, falling back to standard votes for peers without
VOTE v1 (every voter runs the same build).
"""

from minibroker.broker.raft.client import KafkaRaftClient
from minibroker.broker.raft.config import CHECK_QUORUM_TIMEOUT_FACTOR, QuorumConfig
from minibroker.broker.raft.effects import (
    DURABLE,
    AppendLog,
    Effect,
    HighWatermarkUpdated,
    LeaderChanged,
    PersistQuorumState,
    QuorumStateData,
    Send,
    StoreSnapshot,
    TruncateLog,
)
from minibroker.broker.raft.log import RaftLog, ValidOffsetAndEpoch
from minibroker.broker.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    Entry,
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
from minibroker.broker.raft.state import IllegalStateError

__all__ = [
    "CHECK_QUORUM_TIMEOUT_FACTOR",
    "DURABLE",
    "AppendLog",
    "BeginQuorumEpochRequest",
    "BeginQuorumEpochResponse",
    "Effect",
    "EndQuorumEpochRequest",
    "EndQuorumEpochResponse",
    "Entry",
    "FetchRequest",
    "FetchResponse",
    "FetchSnapshotRequest",
    "FetchSnapshotResponse",
    "HighWatermarkUpdated",
    "IllegalStateError",
    "KafkaRaftClient",
    "LeaderChanged",
    "Message",
    "OffsetAndEpoch",
    "PersistQuorumState",
    "QuorumConfig",
    "QuorumStateData",
    "RaftLog",
    "Send",
    "Snapshot",
    "StoreSnapshot",
    "TruncateLog",
    "ValidOffsetAndEpoch",
    "VoteRequest",
    "VoteResponse",
]
