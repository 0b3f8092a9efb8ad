"""The group coordinator: JoinGroup, SyncGroup, Heartbeat, LeaveGroup and the rebalances
they drive (Kafka's GroupCoordinator, classic protocol).

Everything runs on the broker's trio thread, so a group needs no lock (Kafka's group
lock): a request handler and a purgatory's completion never interleave. A request that
must wait (a join until the rebalance completes, a follower's sync until the leader's
assignment is stored) answers through a PendingResponse that a delayed operation or an
append's completion sets. Offsets and the read-only APIs are in offsets.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from minibroker.broker.coordinator.answers import join_error, sync_answer
from minibroker.broker.coordinator.delayed import (
    DelayedHeartbeat,
    DelayedJoin,
    DelayedSync,
    InitialDelayedJoin,
)
from minibroker.broker.coordinator.group import GroupMetadata, GroupState, MemberMetadata
from minibroker.broker.coordinator.manager import GroupMetadataManager
from minibroker.broker.coordinator.records import PartitionContents, group_key, group_value
from minibroker.broker.coordinator.static import StaticMembership
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.purgatory import DeadlinePurgatory, Purgatory
from minibroker.protocol.errors import ErrorCode

EMPTY = GroupState.EMPTY
PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE
STABLE = GroupState.STABLE
DEAD = GroupState.DEAD

# A new member's first join may wait out a whole rebalance (or an initial delay) before it
# can heartbeat; its liveness is bounded by this instead (Kafka's NewMemberJoinTimeoutMs).
NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000


def error_only(error: ErrorCode, message: str | None = None) -> dict:
    return {"error_code": int(error), "error_message": message, "throttle_time_ms": 0}


# Heartbeat's two common answers, made once: every member gets one every
# heartbeat.interval.ms. Shared, so never changed: the network layer only reads bodies.
HEARTBEAT_OK = error_only(ErrorCode.NONE)
HEARTBEAT_REBALANCING = error_only(ErrorCode.REBALANCE_IN_PROGRESS)


class GroupCoordinator(StaticMembership):
    """Membership and rebalances of the groups whose partitions this broker leads (static
    members' takeovers in static.py)."""

    def __init__(
        self,
        broker_id: int,
        config: Any,
        logger: Any,
        manager: GroupMetadataManager,
        *,
        join_purgatory: Purgatory,
        heartbeat_purgatory: DeadlinePurgatory,
        sync_purgatory: Purgatory,
        now_ms: Callable[[], int],
    ) -> None:
        self.broker_id = broker_id
        self.config = config
        self.log = logger
        self.manager = manager
        self.groups = manager.groups
        self.join_purgatory = join_purgatory
        self.heartbeat_purgatory = heartbeat_purgatory
        self._extend_heartbeat = heartbeat_purgatory.extend_by
        self.sync_purgatory = sync_purgatory
        self.now_ms = now_ms

    # --- validation ---------------------------------------------------------------------

    def group_error(self, group_id: str) -> ErrorCode | None:
        """Kafka's validateGroupStatus: a group id, and this broker coordinating it now."""
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        return self.manager.ownership_error(group_id)

    # --- JoinGroup ------------------------------------------------------------------------

    def join_group(self, body: dict, client_id: str, client_host: str) -> dict | PendingResponse:
        group_id = body["group_id"]
        member_id = body["member_id"]
        error = self.group_error(group_id)
        if error is not None:
            return join_error(member_id, error)
        session_ms = body["session_timeout_ms"]
        low = self.config["group.min.session.timeout.ms"]
        high = self.config["group.max.session.timeout.ms"]
        if not low <= session_ms <= high:
            return join_error(
                member_id,
                ErrorCode.INVALID_SESSION_TIMEOUT,
                f"session.timeout.ms {session_ms} is outside [{low}, {high}] "
                "(group.min/max.session.timeout.ms)",
            )
        rebalance_ms = body["rebalance_timeout_ms"]
        if rebalance_ms < 0:
            rebalance_ms = session_ms
        protocols = [(p["name"], p["metadata"]) for p in body["protocols"]]
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return join_error(member_id, ErrorCode.UNKNOWN_MEMBER_ID)
            group = self.groups[group_id] = GroupMetadata(
                group_id, self.manager.partition_for(group_id), self.now_ms()
            )
        args = (client_id, client_host, rebalance_ms, session_ms, body["protocol_type"], protocols)
        instance_id = body.get("group_instance_id")
        if instance_id is not None:
            answer = self._join_static_member(group, member_id, instance_id, args)
        elif not member_id:
            answer = self._join_unknown_member(group, *args)
        else:
            answer = self._join_known_member(group, member_id, *args)
        if group.is_in(PREPARING):
            self.join_purgatory.check_and_complete(group_id)
        return answer

    def _join_unknown_member(
        self,
        group: GroupMetadata,
        client_id: str,
        client_host: str,
        rebalance_ms: int,
        session_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
    ) -> dict:
        """KIP-394: a member without an id is given one and must join again with it, so a
        client that retries a lost answer never leaves a ghost member behind."""
        refusal = group.join_refusal(protocol_type, protocols)
        if refusal is not None:
            return join_error("", refusal)
        if len(group.members) + len(group.pending_members) >= self.config["group.max.size"]:
            return join_error("", ErrorCode.GROUP_MAX_SIZE_REACHED)
        member_id = f"{client_id}-{uuid.uuid4()}"
        group.pending_members.add(member_id)
        # Watched like a member: a pending id that never joins expires after its session.
        placeholder = MemberMetadata(
            member_id, client_id, client_host, rebalance_ms, session_ms, protocol_type, []
        )
        self._schedule_heartbeat(group, placeholder)
        return join_error(member_id, ErrorCode.MEMBER_ID_REQUIRED)

    def _join_known_member(
        self,
        group: GroupMetadata,
        member_id: str,
        client_id: str,
        client_host: str,
        rebalance_ms: int,
        session_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
    ) -> dict | PendingResponse:
        refusal = group.join_refusal(protocol_type, protocols)
        if refusal is not None:
            return join_error(member_id, refusal)
        if member_id in group.pending_members:
            member = MemberMetadata(
                member_id,
                client_id,
                client_host,
                rebalance_ms,
                session_ms,
                protocol_type,
                protocols,
            )
            return self._add_member_and_rebalance(group, member)
        member = group.members.get(member_id)
        if member is None or group.is_in(EMPTY):
            return join_error(member_id, ErrorCode.UNKNOWN_MEMBER_ID)
        if group.is_in(COMPLETING) and member.matches(protocols):
            return self._join_answer(group, member)  # its answer was lost: send it again
        if group.is_in(STABLE) and not group.is_leader(member_id) and member.matches(protocols):
            return self._join_answer(group, member)  # a follower with nothing new
        response = PendingResponse()
        group.update(member, protocols, rebalance_ms, session_ms, response)
        self._maybe_prepare_rebalance(group, f"member {member_id} rejoined")
        return response

    def _add_member_and_rebalance(
        self, group: GroupMetadata, member: MemberMetadata
    ) -> PendingResponse:
        member.is_new = True
        if group.is_in(PREPARING) and group.generation_id == 0:
            group.new_member_added = True  # InitialDelayedJoin waits once more
        response = PendingResponse()
        group.add(member, response)
        self.complete_and_schedule_heartbeat(group, member, NEW_MEMBER_JOIN_TIMEOUT_MS)
        self._maybe_prepare_rebalance(group, f"member {member.member_id} joined")
        return response

    def _join_answer(self, group: GroupMetadata, member: MemberMetadata) -> dict:
        """This generation's JoinGroup answer for ``member``: the leader gets every member."""
        leader = group.is_leader(member.member_id)
        return {
            "error_code": 0,
            "generation_id": group.generation_id,
            "protocol_type": group.protocol_type,
            "protocol_name": group.protocol_name,
            "leader": group.leader_id or "",
            "member_id": member.member_id,
            "members": group.member_metadata() if leader else [],
            "error_message": None,
            "throttle_time_ms": 0,
        }

    # --- rebalance --------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        if group.can_rebalance():
            self.prepare_rebalance(group, reason)

    def prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        if group.is_in(COMPLETING):
            # The assignment being handed out is void: its followers must rejoin.
            self._propagate_assignment_error(group, ErrorCode.REBALANCE_IN_PROGRESS)
        if group.is_in(EMPTY):
            delay = self.config["group.initial.rebalance.delay.ms"]
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            op: DelayedJoin = InitialDelayedJoin(self, group, delay, delay, remaining)
        else:
            op = DelayedJoin(self, group, group.rebalance_timeout_ms())
        group.transition_to(PREPARING, self.now_ms())
        self.log.info(
            "group_rebalance_started",
            group=group.group_id,
            generation=group.generation_id,
            reason=reason,
        )
        self.watch_join(op)
        self.sync_purgatory.check_and_complete(group.group_id)  # a pending sync is moot now

    def watch_join(self, op: DelayedJoin) -> None:
        self.join_purgatory.try_complete_else_watch(op, (op.group.group_id,))

    def on_complete_join(self, group: GroupMetadata) -> None:
        """The join phase is over: drop who did not rejoin, start the next generation."""
        if group.is_in(DEAD):
            return  # unloaded or deleted meanwhile; its members were answered then
        for member in group.not_yet_rejoined_members():
            if member.is_static:
                continue  # KIP-345: kept (it may be restarting); its session decides
            group.remove(member.member_id)
            self._remove_heartbeat(group, member)
            self.log.info(
                "group_member_removed",
                group=group.group_id,
                member=member.member_id,
                reason="did not rejoin within the rebalance timeout",
            )
        if group.members and not group.maybe_elect_new_joined_leader():
            # Only static members that did not rejoin are left: wait another rebalance
            # timeout, until they rejoin or their sessions remove them (Kafka's).
            self.watch_join(DelayedJoin(self, group, group.rebalance_timeout_ms()))
            return
        group.init_next_generation(self.now_ms())
        self.log.info(
            "group_generation_started",
            group=group.group_id,
            generation=group.generation_id,
            state=group.state.value,
            members=len(group.members),
            protocol=group.protocol_name,
        )
        if group.is_in(EMPTY):
            self.manager.append(
                group.partition, [(group_key(group.group_id), group_value(group))], _ignore
            )
            return
        for member in group.members.values():
            response, member.join_response = member.join_response, None
            member.is_new = False
            if response is not None:
                response.set(self._join_answer(group, member))
            self.complete_and_schedule_heartbeat(group, member)
        self.sync_purgatory.try_complete_else_watch(
            DelayedSync(self, group, group.rebalance_timeout_ms()), (group.group_id,)
        )

    # --- SyncGroup --------------------------------------------------------------------------

    def sync_group(self, body: dict) -> dict | PendingResponse:
        group_id = body["group_id"]
        member_id = body["member_id"]
        error = self.group_error(group_id)
        if error is not None:
            return sync_answer(error)
        group = self.groups.get(group_id)
        if group is None:
            return sync_answer(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.is_in(DEAD):
            return sync_answer(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        static_error = group.static_member_error(member_id, body.get("group_instance_id"))
        if static_error is not None:
            return sync_answer(static_error)
        member = group.members.get(member_id)
        if member is None or group.is_in(EMPTY):
            return sync_answer(ErrorCode.UNKNOWN_MEMBER_ID)
        if body["generation_id"] != group.generation_id:
            return sync_answer(ErrorCode.ILLEGAL_GENERATION)
        if (body["protocol_type"] not in (None, group.protocol_type)) or (
            body["protocol_name"] not in (None, group.protocol_name)
        ):
            return sync_answer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if group.is_in(PREPARING):
            return sync_answer(ErrorCode.REBALANCE_IN_PROGRESS)
        group.pending_sync_members.discard(member_id)
        self.sync_purgatory.check_and_complete(group_id)
        if group.is_in(STABLE):
            self.complete_and_schedule_heartbeat(group, member)
            return sync_answer(ErrorCode.NONE, member.assignment, group)
        response = PendingResponse()
        member.sync_response = response
        if group.is_leader(member_id):
            self._store_assignment(
                group, {a["member_id"]: a["assignment"] for a in body["assignments"]}
            )
        return response

    def _store_assignment(self, group: GroupMetadata, assignments: dict[str, bytes]) -> None:
        """The leader's assignment is written (acks=all) before anyone gets it, so a new
        coordinator restores the same generation."""
        generation = group.generation_id
        assignments = {m: assignments.get(m, b"") for m in group.members}

        def stored(error: ErrorCode) -> None:
            if not group.is_in(COMPLETING) or group.generation_id != generation:
                return  # a rebalance or an unload overtook it; its members were answered
            if error is not ErrorCode.NONE:
                self._propagate_assignment_error(group, error)
                self._maybe_prepare_rebalance(group, f"storing the assignment failed: {error.name}")
                return
            for member in group.members.values():
                member.assignment = assignments[member.member_id]
            group.transition_to(STABLE, self.now_ms())
            for member in group.members.values():
                response, member.sync_response = member.sync_response, None
                if response is not None:
                    response.set(sync_answer(ErrorCode.NONE, member.assignment, group))
                    self.complete_and_schedule_heartbeat(group, member)
            self.log.info(
                "group_stable",
                group=group.group_id,
                generation=generation,
                members=len(assignments),
            )

        self.manager.append(
            group.partition,
            [(group_key(group.group_id), group_value(group, assignments))],
            stored,
        )

    def _propagate_assignment_error(self, group: GroupMetadata, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
            response, member.sync_response = member.sync_response, None
            if response is not None:
                response.set(sync_answer(error))

    def sync_settled(self, group: GroupMetadata, generation_id: int) -> bool:
        """DelayedSync's condition: everyone synced, or the generation is over anyway."""
        return (
            group.generation_id != generation_id
            or group.is_in(DEAD, EMPTY, PREPARING)
            or not group.pending_sync_members
        )

    def on_expire_sync(self, group: GroupMetadata, generation_id: int) -> None:
        if generation_id != group.generation_id or not group.is_in(COMPLETING, STABLE):
            return
        missing = sorted(group.pending_sync_members)
        if not missing:
            return
        for member_id in missing:
            member = group.remove(member_id)
            if member is not None:
                self._remove_heartbeat(group, member)
        self.prepare_rebalance(
            group, f"members {missing} sent no SyncGroup within the rebalance timeout"
        )

    # --- Heartbeat ------------------------------------------------------------------------

    def heartbeat(self, body: dict) -> dict:
        # The hot path of a coordinator (every member, every heartbeat.interval.ms): plain
        # state comparisons and a deadline store (extend_by), no operation made and no
        # call besides (complete_and_schedule_heartbeat's fast path, inlined), and a
        # shared answer.
        group_id = body["group_id"]
        group = self.groups.get(group_id)
        # A group held here is of a partition loaded here (resign drops its groups), so
        # while that partition is owned, group_error has nothing to say: skip it.
        if group is None or group.partition not in self.manager.owned:
            error = self.group_error(group_id)
            if error is not None:
                return error_only(error)
            if group is None:
                return error_only(ErrorCode.UNKNOWN_MEMBER_ID)
        state = group.state
        if state is DEAD:
            return error_only(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        member = group.members.get(body["member_id"])
        instance_id = body.get("group_instance_id")
        if instance_id is not None and (member is None or member.group_instance_id != instance_id):
            # A static member's zombie (its instance restarted under a new id): fenced.
            return error_only(
                group.static_member_error(body["member_id"], instance_id)
                or ErrorCode.UNKNOWN_MEMBER_ID
            )
        if member is None or state is EMPTY:
            return error_only(ErrorCode.UNKNOWN_MEMBER_ID)
        if body["generation_id"] != group.generation_id:
            return error_only(ErrorCode.ILLEGAL_GENERATION)
        op = member.heartbeat
        if op is None or not self._extend_heartbeat(op, member.session_timeout_ms):
            self.complete_and_schedule_heartbeat(group, member)
        return HEARTBEAT_REBALANCING if state is PREPARING else HEARTBEAT_OK

    def complete_and_schedule_heartbeat(
        self, group: GroupMetadata, member: MemberMetadata, timeout_ms: int | None = None
    ) -> None:
        """Kafka's completeAndScheduleNextHeartbeatExpiration, lazily: the member's live
        DelayedHeartbeat has its deadline moved on (one store, the common case); only when
        that cannot be done (the deadline comes earlier, or the op is over) does the
        current one complete, as it heartbeat in time, and a new one start."""
        delay = member.session_timeout_ms if timeout_ms is None else timeout_ms
        op = member.heartbeat
        if op is not None and self._extend_heartbeat(op, delay):
            return
        member.heartbeat_satisfied = True
        self.heartbeat_purgatory.check_and_complete((group.group_id, member.member_id))
        member.heartbeat_satisfied = False
        self._schedule_heartbeat(group, member, delay)

    def _schedule_heartbeat(
        self, group: GroupMetadata, member: MemberMetadata, timeout_ms: int | None = None
    ) -> None:
        delay = member.session_timeout_ms if timeout_ms is None else timeout_ms
        op = DelayedHeartbeat(self, group, member, delay)
        member.heartbeat = op
        self.heartbeat_purgatory.try_complete_else_watch(op, ((group.group_id, member.member_id),))

    def heartbeat_settled(self, group: GroupMetadata, member: MemberMetadata) -> bool:
        """DelayedHeartbeat's condition: no reason left to expire this member."""
        if group.is_in(DEAD) or member.is_leaving:
            return True
        if group.members.get(member.member_id) is not member:
            # A placeholder for a pending id: settled once that id joined or went away.
            return member.member_id not in group.pending_members
        return member.has_satisfied_heartbeat()

    def on_expire_heartbeat(self, group: GroupMetadata, member: MemberMetadata) -> None:
        member_id = member.member_id
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            if group.is_in(PREPARING):
                self.join_purgatory.check_and_complete(group.group_id)
            return
        if group.members.get(member_id) is member and not member.has_satisfied_heartbeat():
            self.log.info(
                "group_member_expired",
                group=group.group_id,
                member=member_id,
                session_timeout_ms=member.session_timeout_ms,
            )
            self.remove_member_and_update_group(group, member, "session timeout expired")

    def _remove_heartbeat(self, group: GroupMetadata, member: MemberMetadata) -> None:
        member.is_leaving = True
        self.heartbeat_purgatory.check_and_complete((group.group_id, member.member_id))

    # --- LeaveGroup -------------------------------------------------------------------------

    def leave_group(self, body: dict) -> dict:
        group_id = body["group_id"]
        error = self.group_error(group_id)
        if error is None:
            group = self.groups.get(group_id)
            if group is not None and group.is_in(DEAD):
                error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        if error is not None:
            return {"error_code": int(error), "members": [], "throttle_time_ms": 0}
        results = []
        for item in body["members"]:
            member_id = item["member_id"]
            instance_id = item.get("group_instance_id")
            code = ErrorCode.NONE
            if group is not None and instance_id is not None and not member_id:
                # KIP-345: an admin removes a static member by its instance id alone.
                member_id = group.static_member_id(instance_id) or ""
            if group is None:
                code = ErrorCode.UNKNOWN_MEMBER_ID
            elif member_id in group.pending_members and instance_id is None:
                group.pending_members.discard(member_id)
                if group.is_in(PREPARING):
                    self.join_purgatory.check_and_complete(group_id)
            else:
                code = group.static_member_error(member_id, instance_id) or (
                    ErrorCode.NONE if group.has(member_id) else ErrorCode.UNKNOWN_MEMBER_ID
                )
            if code is ErrorCode.NONE and group.has(member_id):
                self.log.info(
                    "group_member_left",
                    group=group_id,
                    member=member_id,
                    group_instance_id=instance_id,
                )
                member = group.get(member_id)
                self.remove_member_and_update_group(group, member, f"member {member_id} left")
            results.append(
                {
                    "member_id": item["member_id"],
                    "group_instance_id": instance_id,
                    "error_code": int(code),
                }
            )
        return {"error_code": 0, "members": results, "throttle_time_ms": 0}

    def remove_member_and_update_group(
        self, group: GroupMetadata, member: MemberMetadata, reason: str
    ) -> None:
        # Answer what it waits for: it is no longer a member.
        response, member.join_response = member.join_response, None
        if response is not None:
            response.set(join_error(member.member_id, ErrorCode.UNKNOWN_MEMBER_ID))
        response, member.sync_response = member.sync_response, None
        if response is not None:
            response.set(sync_answer(ErrorCode.UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)
        self._remove_heartbeat(group, member)
        if group.is_in(STABLE, COMPLETING):
            self._maybe_prepare_rebalance(group, reason)
        elif group.is_in(PREPARING):
            self.join_purgatory.check_and_complete(group.group_id)

    # --- coordinator partitions -------------------------------------------------------------

    def partition_loaded(self, partition: int, contents: PartitionContents) -> None:
        """A loaded partition's groups, as its log left them; members must heartbeat anew."""
        now = self.now_ms()
        for group_id, value in contents.groups.items():
            if value is None:
                continue
            group = GroupMetadata(group_id, partition, now)
            protocol = value.get("protocol")
            for m in value.get("members") or ():
                member = MemberMetadata(
                    m["member_id"],
                    m["client_id"],
                    m["client_host"],
                    m["rebalance_timeout"],
                    m["session_timeout"],
                    value.get("protocol_type") or "",
                    [(protocol, m["subscription"])] if protocol else [],
                    m.get("group_instance_id"),  # records written before KIP-345: dynamic
                )
                member.assignment = m["assignment"]
                group.add(member)
            group.protocol_type = value.get("protocol_type")
            group.protocol_name = protocol
            group.generation_id = value.get("generation", 0)
            group.leader_id = value.get("leader") if group.members else None
            # A restore, not a move: the state the log's last record implies.
            group.state = STABLE if group.members else EMPTY
            self.groups[group_id] = group
        for group_id, offsets in contents.offsets.items():
            live = {tp: o for tp, o in offsets.items() if o is not None}
            group = self.groups.get(group_id)
            if group is None:
                if not live:
                    continue
                group = self.groups[group_id] = GroupMetadata(group_id, partition, now)
            group.offsets = live
        for producer_id, by_group in contents.pending.items():
            for group_id, pending in by_group.items():
                group = self.groups.get(group_id)
                if group is None:
                    group = self.groups[group_id] = GroupMetadata(group_id, partition, now)
                group.pending_txn_offsets[producer_id] = pending
        for group in self.manager.groups_of(partition):
            for member in group.members.values():
                self.complete_and_schedule_heartbeat(group, member)

    def partition_unloaded(self, group: GroupMetadata) -> None:
        """Leadership moved: answer what waits here with NOT_COORDINATOR, stop the timers."""
        previous = group.state
        group.transition_to(DEAD, self.now_ms())
        for member in group.members.values():
            if previous is PREPARING and member.join_response is not None:
                response, member.join_response = member.join_response, None
                response.set(join_error(member.member_id, ErrorCode.NOT_COORDINATOR))
            if member.sync_response is not None:
                response, member.sync_response = member.sync_response, None
                response.set(sync_answer(ErrorCode.NOT_COORDINATOR))
            self.heartbeat_purgatory.cancel_for_key((group.group_id, member.member_id))
        for member_id in group.pending_members:
            self.heartbeat_purgatory.cancel_for_key((group.group_id, member_id))


def _ignore(error: ErrorCode) -> None:
    """An empty generation's record: best effort, as Kafka's."""
