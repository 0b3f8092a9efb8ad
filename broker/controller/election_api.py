"""ElectLeaders (API 43) on any broker: answered by the active controller, like CreateTopics.

A client may ask any broker; the broker forwards to the active controller (or answers
itself when it is the controller), and a forwarded request is answered there or refused
with NOT_CONTROLLER, never forwarded again (no loops while brokers disagree on who
the controller is).
"""

from __future__ import annotations

from minibroker.broker.controller.membership import ControllerLink
from minibroker.broker.controller.rebalance import elect_leaders, requested_partitions
from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol import ApiKey
from minibroker.protocol.api import ELECTION_PREFERRED
from minibroker.protocol.errors import ErrorCode


def handle_elect_leaders(
    link: ControllerLink, body: dict, *, forwarded: bool
) -> dict | PendingResponse:
    """The ElectLeaders response for ``body``, from the active controller."""

    def local(body: dict) -> dict | PendingResponse:
        controller = link.role.controller
        if controller is None:
            return {
                "error_code": int(ErrorCode.NOT_CONTROLLER),
                "error_message": f"broker {link.me.node_id} is not the controller "
                f"(the controller is {link.cache.controller_id})",
                "replica_election_results": [],
            }
        return elect_leaders(
            controller,
            body["election_type"],
            requested_partitions(body),
            reason="preferred_leader_election"
            if body["election_type"] == ELECTION_PREFERRED
            else "unclean_leader_election",
        )

    if forwarded:
        return local(body)
    pending = PendingResponse()

    async def call() -> None:
        answer = await link.controller_call(
            ApiKey.ELECT_LEADERS, body, local, timeout=max(body["timeout_ms"] / 1000, 1)
        )
        answer.setdefault("replica_election_results", [])
        pending.set(answer)

    link.tasks.start_soon(call)
    return pending
