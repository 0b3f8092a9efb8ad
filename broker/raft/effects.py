"""What the core asks its driver to do: the outputs of every call, in the order to apply them.

The contract (Raft's durability rule): apply effects strictly in list order, and make every
durable effect (PersistQuorumState, AppendLog, TruncateLog, StoreSnapshot) durable before
carrying out any later ``Send``. A vote granted or a fetch offset acknowledged must survive a
crash, or two leaders could be elected in one epoch or a committed entry lost. The simulation
crashes voters between any two effects to hold the core to this.
"""

from __future__ import annotations

from dataclasses import dataclass

from minibroker.broker.raft.messages import Entry, Message, Snapshot


@dataclass(slots=True, frozen=True)
class QuorumStateData:
    """Kafka's ``quorum-state`` file: the epoch, the leader if known, and this voter's vote."""

    leader_epoch: int = 0
    leader_id: int | None = None
    voted_id: int | None = None


@dataclass(slots=True, frozen=True)
class PersistQuorumState:
    state: QuorumStateData


@dataclass(slots=True, frozen=True)
class AppendLog:
    """Entries to append at the log end (their offsets continue it)."""

    entries: tuple[Entry, ...]


@dataclass(slots=True, frozen=True)
class TruncateLog:
    """Drop every entry at or above ``offset`` (a follower whose log diverged)."""

    offset: int


@dataclass(slots=True, frozen=True)
class StoreSnapshot:
    """Keep ``snapshot``; drop the log below its end (RaftLog.store_snapshot has the rule)."""

    snapshot: Snapshot


@dataclass(slots=True, frozen=True)
class Send:
    destination: int
    message: Message


@dataclass(slots=True, frozen=True)
class HighWatermarkUpdated:
    """Entries below ``offset`` are committed: the state machine may apply them.

    ``epoch`` is the epoch in which this voter learnt it (the checker's commit epoch).
    """

    offset: int
    epoch: int


@dataclass(slots=True, frozen=True)
class LeaderChanged:
    """Kafka's handleLeaderChange: the role, epoch and leader (None while unknown) now."""

    role: str
    epoch: int
    leader_id: int | None


Effect = (
    PersistQuorumState
    | AppendLog
    | TruncateLog
    | StoreSnapshot
    | Send
    | HighWatermarkUpdated
    | LeaderChanged
)
DURABLE = (PersistQuorumState, AppendLog, TruncateLog, StoreSnapshot)
