"""Preferred-leader election: leadership goes back to each partition's first replica.

Failover moves a dead broker's leaderships to other ISR members, and nothing moved them
back: after ``cluster restart 1`` broker 1 led nothing, and after a few restarts one
broker led most partitions. Placement (placement.py) spreads the *first* replica of each
partition evenly, so Kafka calls it the preferred replica and elects it leader again
once it is alive and in the ISR:

- on request: ElectLeaders (API 43) with election type PREFERRED, or UNCLEAN for a
  partition with no leader at all (``elect_leaders``);
- by itself: with ``auto.leader.rebalance.enable``, every
  ``leader.imbalance.check.interval.seconds`` the active controller computes, per broker,
  the share of the partitions it is preferred for that another broker leads; above
  ``leader.imbalance.per.broker.percentage`` it elects the preferred replica of each of
  those partitions that can lead (``LeaderRebalancer``; the ZooKeeper controller's
  ``checkAndTriggerAutoLeaderRebalance``).

Both are one more reason for the controller's one election path (``Controller._elect``,
a leader change record with a bumped leader epoch): it picks the first live ISR member
in replica order, which is the preferred replica whenever it is eligible, so a
preferred election is ``_elect`` on a partition whose preferred replica is eligible.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import trio

from minibroker.broker.common.clock import Clock
from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.controller.controller import Controller
from minibroker.broker.metadata.image import ClusterMetadata, PartitionState
from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol.api import ELECTION_PREFERRED, ELECTION_UNCLEAN
from minibroker.protocol.errors import ErrorCode

TopicPartition = tuple[str, int]


def preferred_replica(state: PartitionState) -> int:
    """The first replica of the assignment: the leader placement chose."""
    return state.replicas[0] if state.replicas else -1


def preferred_can_lead(md: ClusterMetadata, state: PartitionState) -> bool:
    """Kafka's canPreferredReplicaBeLeader: alive (not fenced) and in the ISR."""
    preferred = preferred_replica(state)
    return preferred in md.live and preferred in state.isr


def imbalance(md: ClusterMetadata) -> dict[int, tuple[int, int]]:
    """Per broker: (partitions it is preferred for that another broker leads, or nobody;
    partitions it is preferred for)."""
    counts: dict[int, list[int]] = {}
    for topic in md.topics.values():
        for state in topic.partitions:
            preferred = preferred_replica(state)
            count = counts.setdefault(preferred, [0, 0])
            count[1] += 1
            if state.leader != preferred:
                count[0] += 1
    return {broker: (away, total) for broker, (away, total) in counts.items()}


def partitions_to_rebalance(md: ClusterMetadata, percentage: int) -> list[TopicPartition]:
    """The partitions an automatic rebalance moves: those not led by their preferred
    replica, whose preferred broker's imbalance ratio exceeds ``percentage`` %, and whose
    preferred replica can lead now. Topic and partition order, so runs are reproducible."""
    over = {
        broker for broker, (away, total) in imbalance(md).items() if away * 100 > percentage * total
    }
    return [
        (name, index)
        for name, topic in md.topics.items()
        for index, state in enumerate(topic.partitions)
        if preferred_replica(state) in over
        and state.leader != preferred_replica(state)
        and preferred_can_lead(md, state)
    ]


def election_error(
    md: ClusterMetadata, topic: str, index: int, election_type: int, unclean_enabled: bool
) -> tuple[ErrorCode, str] | None:
    """Why this partition gets no election of ``election_type`` now, or None: elect."""
    partitions = md.topics[topic].partitions if topic in md.topics else []
    if not 0 <= index < len(partitions):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{index} does not exist"
    state = partitions[index]
    if election_type == ELECTION_PREFERRED:
        preferred = preferred_replica(state)
        if state.leader == preferred:
            return ErrorCode.ELECTION_NOT_NEEDED, f"the preferred replica {preferred} leads"
        if not preferred_can_lead(md, state):
            where = "fenced" if preferred not in md.live else f"not in the ISR {state.isr}"
            return (
                ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                f"the preferred replica {preferred} is {where}",
            )
        return None
    # UNCLEAN: only for a partition that has no leader (Kafka: ELECTION_NOT_NEEDED otherwise).
    if state.leader >= 0:
        return ErrorCode.ELECTION_NOT_NEEDED, f"broker {state.leader} leads"
    if not unclean_enabled:
        # The election path takes a leader from outside the ISR only under this setting.
        return (
            ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
            "no ISR member is alive and unclean.leader.election.enable is false "
            "on the controller (an unclean election may lose acknowledged records)",
        )
    if not any(r in md.live for r in state.replicas):
        return ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, f"no replica of {state.replicas} is alive"
    return None


def elect_leaders(
    controller: Controller,
    election_type: int,
    partitions: Iterable[TopicPartition] | None,
    reason: str,
) -> dict | PendingResponse:
    """ElectLeaders on the active controller: the ElectLeaders response body, sent once the
    leader change records commit. ``partitions`` None means every partition; then those
    already led as wanted are left out of the answer, as Kafka does."""
    md = controller.metadata
    every = partitions is None
    if every:
        wanted = [(n, i) for n, t in md.topics.items() for i in range(len(t.partitions))]
    else:
        wanted = list(dict.fromkeys(partitions))  # each partition once, in the asked order
    unclean_enabled = controller.config["unclean.leader.election.enable"]
    results: dict[str, list[dict]] = {}
    with controller._change() as draft:
        for topic, index in wanted:
            error = election_error(draft, topic, index, election_type, unclean_enabled)
            if error is None:
                controller._elect(topic, index, draft.topics[topic].partitions[index], reason)
                controller.commit()
            elif every and error[0] == ErrorCode.ELECTION_NOT_NEEDED:
                continue
            code, message = error if error is not None else (ErrorCode.NONE, None)
            results.setdefault(topic, []).append(
                {"partition_id": index, "error_code": int(code), "error_message": message}
            )
    return controller._reply(
        {
            "error_code": 0,
            "error_message": None,
            "replica_election_results": [
                {"topic": topic, "partition_result": rows} for topic, rows in results.items()
            ],
        }
    )


def rebalance(controller: Controller, percentage: int) -> list[TopicPartition]:
    """One automatic check: elect the preferred replicas ``partitions_to_rebalance`` names."""
    moving = partitions_to_rebalance(controller.metadata, percentage)
    if moving:
        controller.log.info(
            "leader_imbalance",
            brokers={
                b: f"{away}/{total}"
                for b, (away, total) in sorted(imbalance(controller.metadata).items())
                if away
            },
            moving=[f"{t}-{p}" for t, p in moving],
        )
        elect_leaders(controller, ELECTION_PREFERRED, moving, reason="auto_leader_rebalance")
    return moving


class LeaderRebalancer:
    """auto.leader.rebalance.enable: a check every leader.imbalance.check.interval.seconds
    while this voter is the active controller, the first one an interval after it became
    active (a new controller first hears from every broker)."""

    def __init__(self, config: BrokerConfig, clock: Clock) -> None:
        self.enabled: bool = config["auto.leader.rebalance.enable"]
        self.interval_ms: int = config["leader.imbalance.check.interval.seconds"] * 1000
        self.percentage: int = config["leader.imbalance.per.broker.percentage"]
        self.clock = clock
        self._controller: Controller | None = None
        self.next_check_ms = 0

    def poll(self, controller: Controller | None) -> list[TopicPartition]:
        """Run the check if it is due for ``controller`` (the active one, or None)."""
        now = self.clock.now_ms()
        if controller is not self._controller:
            # A new term as the active controller (or none): the interval starts again.
            self._controller = controller
            self.next_check_ms = now + self.interval_ms
            return []
        if not self.enabled or controller is None or now < self.next_check_ms:
            return []
        self.next_check_ms = now + self.interval_ms
        return rebalance(controller, self.percentage)

    async def run(self, current: Callable[[], Controller | None]) -> None:
        """Poll for the whole broker life; ``current()`` is the active controller or None.
        Waking at least every 250 ms notices a new term without a hook into activation."""
        if not self.enabled:
            return
        while True:
            await trio.sleep(self.sleep_ms(current()) / 1000)

    def sleep_ms(self, controller: Controller | None) -> int:
        """Poll, then how long to wait before polling again: until the next check while
        active, else 250 ms (a voter that is not the controller only watches for a term)."""
        self.poll(controller)
        if controller is None:
            return 250
        return min(max(self.next_check_ms - self.clock.now_ms(), 1), 250)


def requested_partitions(body: dict[str, Any]) -> list[TopicPartition] | None:
    """An ElectLeaders request's partitions (None: all of them)."""
    asked = body.get("topic_partitions")
    if asked is None:
        return None
    return [(t["topic"], p) for t in asked for p in t["partitions"]]


__all__ = [
    "ELECTION_PREFERRED",
    "ELECTION_UNCLEAN",
    "LeaderRebalancer",
    "elect_leaders",
    "imbalance",
    "partitions_to_rebalance",
    "preferred_replica",
    "requested_partitions",
]
