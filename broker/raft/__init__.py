"""The controller quorum: a sans-IO Raft core modelled on Kafka's KRaft (KIP-595, KIP-630).

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
    CandidateState, FollowerState, LeaderState, ResignedState, ReplicaState   same names
    leader.py                  LeaderState + the leader half of KafkaRaftClient
    LeaderState.parked         the fetch purgatory (ThresholdPurgatory) of parked Fetches
    Entry(control=True)        control records (LeaderChangeMessage at epoch start)
    Snapshot, OffsetAndEpoch   RawSnapshot / snapshot id (OffsetAndEpoch)
    VoteRequest ... FetchSnapshotResponse   Vote, BeginQuorumEpoch, EndQuorumEpoch, Fetch,
                               FetchSnapshot request/response data (fields cut down)
    HighWatermarkUpdated       RaftClient.Listener.handleCommit's upper bound
    LeaderChanged              RaftClient.Listener.handleLeaderChange
    IllegalStateError          IllegalStateException

Not modelled: observers (non-voter brokers that follow the log), voter set changes
(KIP-853), pre-vote (KIP-996), chunked snapshot transfer.
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
