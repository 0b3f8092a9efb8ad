"""A group's membership and state (Kafka's GroupMetadata and MemberMetadata), no I/O.

Everything that affects the state machine lives here: the states and which may follow
which, members and their protocols, the generation, the leader, the protocol the group
agrees on. The coordinator (coordinator.py) decides *when* to move; this module refuses
a move Kafka would refuse, so a coordinator bug is an error, not a silently odd group.

State machine (Kafka's classic protocol)::

    Empty --join--> PreparingRebalance --all joined / rebalance timeout--> CompletingRebalance
      ^                  ^      |                                              |
      |                  |      +--nobody left--> Empty      leader's SyncGroup stored
      |                  +--member joins/leaves/expires--+                     v
      +------------------------------------------------- Stable <--------------+
    any state --group deleted / partition unloaded--> Dead

Assignments and subscriptions are opaque bytes: the leader's, never the broker's, to read.
"""

from __future__ import annotations

from collections import Counter
from enum import Enum
from typing import TYPE_CHECKING, Any

from minibroker.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from minibroker.broker.coordinator.records import Offset
    from minibroker.broker.network.pending import PendingResponse


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    GroupState.DEAD: frozenset(GroupState),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY}
    ),
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
}


class IllegalStateTransition(RuntimeError):
    """A move Kafka's GroupMetadata.assertValidTransition refuses: a coordinator bug."""


class MemberMetadata:
    """One member: its protocols, timeouts, assignment, and the answers it waits for."""

    __slots__ = (
        "assignment",
        "client_host",
        "client_id",
        "group_instance_id",
        "heartbeat",
        "heartbeat_satisfied",
        "is_leaving",
        "is_new",
        "join_response",
        "member_id",
        "protocol_type",
        "protocols",
        "rebalance_timeout_ms",
        "session_timeout_ms",
        "sync_response",
    )

    def __init__(
        self,
        member_id: str,
        client_id: str,
        client_host: str,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        group_instance_id: str | None = None,
    ) -> None:
        self.member_id = member_id
        # KIP-345: a static member's identity across restarts (group.instance.id).
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.session_timeout_ms = session_timeout_ms
        self.protocol_type = protocol_type
        self.protocols = protocols
        self.assignment = b""
        # The answers it waits for (Kafka's awaitingJoinCallback / awaitingSyncCallback).
        self.join_response: PendingResponse | None = None
        self.sync_response: PendingResponse | None = None
        self.is_new = False
        self.heartbeat_satisfied = False
        self.is_leaving = False
        self.heartbeat: Any = None  # its DelayedHeartbeat, re-armed by each heartbeat

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def awaiting_join(self) -> bool:
        return self.join_response is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_response is not None

    def has_satisfied_heartbeat(self) -> bool:
        """Alive as far as its session goes (Kafka's hasSatisfiedHeartbeat): a member in the
        middle of a rebalance is bounded by the rebalance instead, except a new one, which
        can still vanish before its first join completes."""
        if self.is_new:
            return self.heartbeat_satisfied
        return self.awaiting_join or self.awaiting_sync or self.heartbeat_satisfied

    def metadata(self, protocol: str) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        raise KeyError(f"member {self.member_id} does not support protocol {protocol}")

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        """Its most preferred protocol among ``candidates``."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")


class GroupMetadata:
    """A group: state, generation, members, the agreed protocol, committed offsets."""

    # Every heartbeat reads it: slots keep its fields in the object, one cache line fewer.
    __slots__ = (
        "_protocol_votes",
        "generation_id",
        "group_id",
        "leader_id",
        "members",
        "new_member_added",
        "offsets",
        "partition",
        "pending_members",
        "pending_sync_members",
        "pending_txn_offsets",
        "protocol_name",
        "protocol_type",
        "state",
        "state_timestamp",
        "static_members",
    )

    def __init__(self, group_id: str, partition: int, now_ms: int = 0) -> None:
        self.group_id = group_id
        self.partition = partition  # its __consumer_offsets partition
        self.state = GroupState.EMPTY
        self.state_timestamp = now_ms
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, MemberMetadata] = {}
        # Members told their id (MEMBER_ID_REQUIRED) that have not joined with it yet.
        self.pending_members: set[str] = set()
        # group.instance.id -> the member id it holds now (KIP-345's staticMembers).
        self.static_members: dict[str, str] = {}
        # Members of this generation that have not sent SyncGroup yet.
        self.pending_sync_members: set[str] = set()
        self.new_member_added = False
        self._protocol_votes: Counter[str] = Counter()
        # (topic, partition) -> its committed offset
        self.offsets: dict[tuple[str, int], Offset] = {}
        # producer id -> offsets its open transaction committed (TxnOffsetCommit), which
        # become ``offsets`` when its commit marker arrives, or vanish at its abort.
        self.pending_txn_offsets: dict[int, dict[tuple[str, int], Offset]] = {}

    def __repr__(self) -> str:
        return f"Group({self.group_id!r}, {self.state.value}, gen={self.generation_id})"

    # --- state ----------------------------------------------------------------------------

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    def transition_to(self, state: GroupState, now_ms: int = 0) -> None:
        if self.state not in _VALID_PREVIOUS[state]:
            raise IllegalStateTransition(
                f"group {self.group_id}: {self.state.value} -> {state.value} is not allowed"
            )
        self.state = state
        self.state_timestamp = now_ms

    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS[GroupState.PREPARING_REBALANCE]

    # --- members --------------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        return not self.members

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def get(self, member_id: str) -> MemberMetadata:
        return self.members[member_id]

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def add(self, member: MemberMetadata, join_response: PendingResponse | None = None) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id  # the first to join leads
        self.members[member.member_id] = member
        self._protocol_votes.update(_names(member.protocols))
        member.join_response = join_response
        self.pending_members.discard(member.member_id)
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id

    def update(
        self,
        member: MemberMetadata,
        protocols: list[tuple[str, bytes]],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        join_response: PendingResponse | None,
    ) -> None:
        self._protocol_votes.subtract(_names(member.protocols))
        self._protocol_votes.update(_names(protocols))
        member.protocols = protocols
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        member.join_response = join_response

    def remove(self, member_id: str) -> MemberMetadata | None:
        member = self.members.pop(member_id, None)
        self.pending_sync_members.discard(member_id)
        if member is not None:
            self._protocol_votes.subtract(_names(member.protocols))
            self._protocol_votes += Counter()  # drop names nobody supports any more
            instance_id = member.group_instance_id
            if instance_id is not None and self.static_members.get(instance_id) == member_id:
                del self.static_members[instance_id]
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        return member

    # --- static members (KIP-345) -------------------------------------------------------------

    def static_member_id(self, instance_id: str) -> str | None:
        """The member id ``instance_id`` holds now (Kafka's currentStaticMemberId)."""
        return self.static_members.get(instance_id)

    def static_member_error(self, member_id: str, instance_id: str | None) -> ErrorCode | None:
        """Kafka's validateCurrentMember for a request carrying ``instance_id``: another
        member id holds that instance now (FENCED_INSTANCE_ID: a zombie of a restarted
        member), or nobody does (UNKNOWN_MEMBER_ID); None when the pair is current."""
        if instance_id is None:
            return None
        current = self.static_members.get(instance_id)
        if current is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if current != member_id:
            return ErrorCode.FENCED_INSTANCE_ID
        return None

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> MemberMetadata:
        """``instance_id`` restarted: its member, assignment and place in the generation
        pass to ``new_id`` (Kafka's replaceStaticMember). A new MemberMetadata, so the
        old one's DelayedHeartbeat and waiting answers stay with the fenced id."""
        old = self.members.pop(old_id)
        new = MemberMetadata(
            new_id,
            old.client_id,
            old.client_host,
            old.rebalance_timeout_ms,
            old.session_timeout_ms,
            old.protocol_type,
            old.protocols,
            instance_id,
        )
        new.assignment = old.assignment
        self.members[new_id] = new
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync_members:
            self.pending_sync_members.discard(old_id)
            self.pending_sync_members.add(new_id)
        self.static_members[instance_id] = new_id
        return old

    def maybe_elect_new_joined_leader(self) -> bool:
        """The leader must be a member that rejoined (a static member may not have, and
        stays): keep it, or pick one that did; False if nobody rejoined (Kafka's)."""
        leader = self.members.get(self.leader_id) if self.leader_id is not None else None
        if leader is not None and leader.awaiting_join:
            return True
        for member_id, member in self.members.items():
            if member.awaiting_join:
                self.leader_id = member_id
                return True
        return False

    def has_all_members_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def not_yet_rejoined_members(self) -> list[MemberMetadata]:
        return [m for m in self.members.values() if not m.awaiting_join]

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    # --- protocols ------------------------------------------------------------------------

    def join_refusal(
        self, protocol_type: str, protocols: list[tuple[str, bytes]]
    ) -> ErrorCode | None:
        """Why a JoinGroup cannot join this group at all, whoever sends it (Kafka's
        doJoinGroup checks these before telling new, known and static members apart)."""
        if self.is_in(GroupState.DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not self.supports_protocols(protocol_type, protocols):
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        return None

    def supports_protocols(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """A new member must speak the group's protocol type and one of its protocols."""
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        names = _names(protocols)
        shared = {
            name for name, votes in self._protocol_votes.items() if votes == len(self.members)
        }
        return protocol_type == self.protocol_type and bool(names & shared)

    def select_protocol(self) -> str:
        """The protocol every member supports that most members prefer (Kafka's vote)."""
        candidates = {n for n, votes in self._protocol_votes.items() if votes == len(self.members)}
        if not candidates:
            raise ValueError(f"group {self.group_id}: no protocol every member supports")
        ballots = Counter(m.vote(candidates) for m in self.members.values())
        return max(sorted(ballots), key=lambda name: ballots[name])

    def init_next_generation(self, now_ms: int = 0) -> None:
        """A new generation: CompletingRebalance with the chosen protocol, or Empty."""
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
            self.pending_sync_members = set(self.members)
        else:
            self.protocol_name = None
            self.transition_to(GroupState.EMPTY, now_ms)
            self.pending_sync_members = set()

    def member_metadata(self) -> list[dict]:
        """What the leader gets in its JoinGroup answer: each member's chosen-protocol bytes."""
        protocol = self.protocol_name or ""
        return [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "metadata": m.metadata(protocol),
            }
            for m in self.members.values()
        ]


def _names(protocols: list[tuple[str, bytes]]) -> set[str]:
    """A member's vote: each protocol it names once, however often it lists it (Kafka's
    MemberMetadata keeps the names as a set); counted twice, a name no longer matched the
    member count and a group of such members had no protocol in common."""
    return {name for name, _ in protocols}
