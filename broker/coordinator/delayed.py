"""The coordinator's waits, as delayed operations (Kafka's DelayedJoin, InitialDelayedJoin,
DelayedHeartbeat and DelayedSync): each lives in its own purgatory on the broker's one
timer, watched on the group (joins, syncs) or on (group, member) (heartbeats).

They hold only the coordinator and the group and call back into it: the decisions are
the coordinator's, the waiting is the purgatory's. Everything runs on the trio thread.
"""

from __future__ import annotations

from typing import Protocol

from minibroker.broker.coordinator.group import GroupMetadata, MemberMetadata
from minibroker.broker.purgatory import DeadlineOperation, DelayedOperation


class GroupCoordinator(Protocol):
    """What the operations call back (coordinator.py's GroupCoordinator)."""

    def on_complete_join(self, group: GroupMetadata) -> None: ...
    def watch_join(self, op: DelayedJoin) -> None: ...
    def heartbeat_settled(self, group: GroupMetadata, member: MemberMetadata) -> bool: ...
    def on_expire_heartbeat(self, group: GroupMetadata, member: MemberMetadata) -> None: ...
    def sync_settled(self, group: GroupMetadata, generation_id: int) -> bool: ...
    def on_expire_sync(self, group: GroupMetadata, generation_id: int) -> None: ...


class DelayedJoin(DelayedOperation):
    """Completes when every known member has rejoined, or at the rebalance timeout
    (then the members that did not rejoin are dropped)."""

    __slots__ = ("coordinator", "group")

    def __init__(self, coordinator: GroupCoordinator, group: GroupMetadata, delay_ms: int) -> None:
        super().__init__(delay_ms)
        self.coordinator = coordinator
        self.group = group

    def try_complete(self) -> bool:
        return self.group.has_all_members_joined() and self.force_complete()

    def on_complete(self) -> None:
        self.coordinator.on_complete_join(self.group)


class InitialDelayedJoin(DelayedJoin):
    """A new group's first join waits ``group.initial.rebalance.delay.ms`` for more members,
    again each time one arrives, at most the rebalance timeout in all; never early."""

    __slots__ = ("configured_delay_ms", "remaining_ms")

    def __init__(
        self,
        coordinator: GroupCoordinator,
        group: GroupMetadata,
        configured_delay_ms: int,
        delay_ms: int,
        remaining_ms: int,
    ) -> None:
        super().__init__(coordinator, group, delay_ms)
        self.configured_delay_ms = configured_delay_ms
        self.remaining_ms = remaining_ms

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        group = self.group
        if group.new_member_added and self.remaining_ms > 0:
            group.new_member_added = False
            delay = min(self.configured_delay_ms, self.remaining_ms)
            remaining = max(self.remaining_ms - delay, 0)
            self.coordinator.watch_join(
                InitialDelayedJoin(
                    self.coordinator, group, self.configured_delay_ms, delay, remaining
                )
            )
        else:
            self.coordinator.on_complete_join(group)


class DelayedHeartbeat(DeadlineOperation):
    """One per member; each heartbeat moves its deadline on (a lazy deadline: see
    purgatory/deadline.py), and expiring after the member's session timeout removes the
    member (unless a rebalance is vouching for it). Replaced only when its deadline must
    come earlier (a new member's first join done) or it completed."""

    __slots__ = ("coordinator", "group", "member")

    def __init__(
        self,
        coordinator: GroupCoordinator,
        group: GroupMetadata,
        member: MemberMetadata,
        delay_ms: int,
    ) -> None:
        super().__init__(delay_ms)
        self.coordinator = coordinator
        self.group = group
        self.member = member

    def try_complete(self) -> bool:
        return self.coordinator.heartbeat_settled(self.group, self.member) and self.force_complete()

    def on_expiration(self) -> None:
        self.coordinator.on_expire_heartbeat(self.group, self.member)


class DelayedSync(DelayedOperation):
    """After a join completes: every member must send SyncGroup within the rebalance
    timeout, or those that did not are removed and the group rebalances again."""

    __slots__ = ("coordinator", "generation_id", "group")

    def __init__(self, coordinator: GroupCoordinator, group: GroupMetadata, delay_ms: int) -> None:
        super().__init__(delay_ms)
        self.coordinator = coordinator
        self.group = group
        self.generation_id = group.generation_id

    def try_complete(self) -> bool:
        return (
            self.coordinator.sync_settled(self.group, self.generation_id) and self.force_complete()
        )

    def on_expiration(self) -> None:
        self.coordinator.on_expire_sync(self.group, self.generation_id)
