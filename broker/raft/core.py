"""What the leader's and the follower's halves need of the voter they run in.

``KafkaRaftClient`` is the one implementation; leader.py and follower.py are written
against this protocol, so the core imports them and they never import the core back."""

from __future__ import annotations

from typing import Protocol

from minibroker.broker.raft.config import QuorumConfig
from minibroker.broker.raft.effects import Effect
from minibroker.broker.raft.log import RaftLog
from minibroker.broker.raft.messages import Message, Snapshot
from minibroker.broker.raft.state import EpochState


class RaftCore(Protocol):
    node_id: int
    voters: frozenset[int]
    majority: int
    config: QuorumConfig
    log: RaftLog
    high_watermark: int
    state: EpochState

    @property
    def epoch(self) -> int: ...

    @property
    def leader_id(self) -> int | None: ...

    def now(self) -> int: ...

    def emit(self, effect: Effect) -> None: ...

    def send(self, destination: int, message: Message) -> None: ...

    def next_correlation_id(self) -> int: ...

    def fetch_deadline(self) -> int: ...

    def advance_high_watermark(self, offset: int) -> None: ...

    def append_entries(self, entries: tuple) -> None: ...

    def store_snapshot(self, snapshot: Snapshot) -> None: ...

    def to_prospective(self) -> None: ...

    def to_resigned(self) -> None: ...

    def maybe_transition(self, epoch: int, leader_id: int | None) -> None: ...
