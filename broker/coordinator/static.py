"""Static membership (KIP-345, ``group.instance.id``): the coordinator's half that lets a
restarted member take its old member over (Kafka's doStaticNewMemberJoin,
updateStaticMemberAndRebalance and replaceStaticMember).

A member with a group.instance.id gets no MEMBER_ID_REQUIRED round. Joining without a
member id while the group holds its instance (a restart), it takes that member over: a
new member id, the same place in the generation and the same assignment; the old id is
fenced (FENCED_INSTANCE_ID to what it waits for and to every later request naming the
instance with it). A Stable group whose protocol choice would not change does not
rebalance: the new id is stored and the member is answered as a follower, so it syncs
and gets its partitions back while nobody else notices. The other group APIs check the
instance through GroupMetadata.static_member_error; a static member that misses a
rebalance is kept (coordinator.on_complete_join) until its session expires.
"""

from __future__ import annotations

import uuid
from typing import Any

from minibroker.broker.coordinator.answers import join_error, sync_answer
from minibroker.broker.coordinator.group import GroupMetadata, GroupState, MemberMetadata
from minibroker.broker.coordinator.records import group_key, group_value
from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol.errors import ErrorCode

DEAD = GroupState.DEAD
# A JoinGroup's member description, in MemberMetadata's order after the member id.
JoinArgs = tuple[str, str, int, int, str, list[tuple[str, bytes]]]
PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE


class StaticMembership:
    """Mixed into GroupCoordinator (coordinator.py), whose join path and timers it uses."""

    config: Any
    log: Any
    manager: Any
    _join_known_member: Any
    _add_member_and_rebalance: Any
    _maybe_prepare_rebalance: Any
    _remove_heartbeat: Any
    _join_answer: Any
    complete_and_schedule_heartbeat: Any

    def _join_static_member(
        self, group: GroupMetadata, member_id: str, instance_id: str, args: JoinArgs
    ) -> dict | PendingResponse:
        """KIP-345: a member with a group.instance.id. Known by its instance, it gets no
        MEMBER_ID_REQUIRED round; joining without its member id (a restart) it takes over
        the instance's member, fencing the old id (Kafka's doStaticNewMemberJoin); with
        its member id it is any known member, once the id is the instance's current one.
        ``args``: (client id, host, rebalance and session timeouts, protocol type, protocols)."""
        if member_id:
            error = group.static_member_error(member_id, instance_id)
            if error is not None:
                return join_error(member_id, error)
            return self._join_known_member(group, member_id, *args)
        _, _, rebalance_ms, session_ms, protocol_type, protocols = args
        refusal = group.join_refusal(protocol_type, protocols)
        if refusal is not None:
            return join_error("", refusal)
        new_id = f"{instance_id}-{uuid.uuid4()}"  # Kafka's generateMemberId for statics
        old_id = group.static_member_id(instance_id)
        if old_id is not None:
            self.log.info(
                "group_static_member_replaced",
                group=group.group_id,
                group_instance_id=instance_id,
                old_member=old_id,
                member=new_id,
                state=group.state.value,
            )
            return self._update_static_member_and_rebalance(
                group, instance_id, old_id, new_id, protocols, rebalance_ms, session_ms
            )
        if len(group.members) + len(group.pending_members) >= self.config["group.max.size"]:
            return join_error("", ErrorCode.GROUP_MAX_SIZE_REACHED)
        member = MemberMetadata(new_id, *args, instance_id)
        return self._add_member_and_rebalance(group, member)

    def _replace_static_member(
        self, group: GroupMetadata, instance_id: str, old_id: str, new_id: str
    ) -> MemberMetadata:
        """``new_id`` takes ``instance_id`` over; what the old id waits for is answered
        FENCED_INSTANCE_ID and its heartbeat stops (the old process is a zombie)."""
        old = group.replace_static_member(instance_id, old_id, new_id)
        response, old.join_response = old.join_response, None
        if response is not None:
            response.set(join_error(old_id, ErrorCode.FENCED_INSTANCE_ID))
        response, old.sync_response = old.sync_response, None
        if response is not None:
            response.set(sync_answer(ErrorCode.FENCED_INSTANCE_ID))
        self._remove_heartbeat(group, old)
        member = group.get(new_id)
        self.complete_and_schedule_heartbeat(group, member)
        return member

    def _update_static_member_and_rebalance(
        self,
        group: GroupMetadata,
        instance_id: str,
        old_id: str,
        new_id: str,
        protocols: list[tuple[str, bytes]],
        rebalance_ms: int,
        session_ms: int,
    ) -> PendingResponse:
        """Kafka's updateStaticMemberAndRebalance. A Stable group whose protocol would not
        change keeps its generation and assignment: the new id is stored (so a moved
        coordinator knows it) and answered as a follower of the current leader, which
        makes the restarted member sync and get its old partitions back, nobody else
        disturbed. Otherwise the replacement is a rebalance like any rejoin."""
        leader = group.leader_id
        member = self._replace_static_member(group, instance_id, old_id, new_id)
        old_protocols = member.protocols
        old_timeouts = (member.rebalance_timeout_ms, member.session_timeout_ms)
        response = PendingResponse()
        group.update(member, protocols, rebalance_ms, session_ms, response)
        if group.is_in(PREPARING):
            return response  # it is one of the joined now; the join completes as usual
        if group.is_in(COMPLETING) or group.select_protocol() != group.protocol_name:
            # Mid-sync the leader may be assigning to the old id: rebalance (Kafka's).
            self._maybe_prepare_rebalance(group, f"static member {instance_id} rejoined")
            return response

        def stored(error: ErrorCode) -> None:
            if member.join_response is not response or group.is_in(PREPARING):
                # Answered already (a rebalance completed, an expiry, another restart), or
                # a rebalance began meanwhile and answers this join when it completes.
                return
            member.join_response = None
            if group.is_in(DEAD):
                response.set(join_error("", ErrorCode.NOT_COORDINATOR))
                return
            if error is not ErrorCode.NONE:
                # The log still names the old id: so does the group again (Kafka's revert).
                group.update(member, old_protocols, *old_timeouts, None)
                self._replace_static_member(group, instance_id, new_id, old_id)
                response.set(join_error("", error))
                return
            answer = self._join_answer(group, member)
            # The current leader, not this member: the new id is not the leader's, so the
            # member does not assign, which a Stable group would not hand out anyway.
            answer["leader"] = leader or ""
            answer["members"] = []
            response.set(answer)

        self.manager.append(
            group.partition, [(group_key(group.group_id), group_value(group))], stored
        )
        return response
