"""A leader's ISR proposals to the active controller (Kafka's AlterPartitionManager).

One proposal in flight per partition; an accepted one becomes the partition's ISR, a
rejected or lost one ends so the next follower fetch (or shrink check) proposes again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from minibroker.broker.common.tasks import Spawner
from minibroker.broker.replication.partition import Partition
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.protocol import ApiKey

# (api_key, body, local handler) -> the active controller's answer, wherever it runs.
ControllerCall = Callable[[int, dict, Callable[[dict], Any]], Awaitable[dict]]


class AlterPartitionManager:
    def __init__(
        self,
        broker_id: int,
        replica_manager: ReplicaManager,
        controller_call: ControllerCall,
        local: Callable[[dict], Any],
        tasks: Spawner,
        logger: Any,
    ) -> None:
        self.broker_id = broker_id
        self.replica_manager = replica_manager
        self.controller_call = controller_call
        self.local = local
        self.tasks = tasks
        self.log = logger
        self.in_flight: set[tuple[str, int]] = set()

    def propose(self, partition: Partition, new_isr: list[int]) -> None:
        key = partition.key
        if key in self.in_flight:
            return
        request = {
            "broker_id": self.broker_id,
            "topic": partition.topic,
            "partition": partition.index,
            "leader_epoch": partition.leader_epoch,
            "partition_epoch": partition.partition_epoch,
            "new_isr": new_isr,
        }
        self.in_flight.add(key)
        self.tasks.start_soon(self._send, partition, request)

    async def _send(self, partition: Partition, request: dict) -> None:
        rm = self.replica_manager
        try:
            answer = await self.controller_call(ApiKey.ALTER_PARTITION, request, self.local)
            if answer.get("error_code") == 0:
                rm.isr_update_accepted(
                    partition, request["leader_epoch"], answer["isr"], answer["partition_epoch"]
                )
            else:
                # Rejected (stale partition epoch, fenced leader): committed metadata brings
                # the current state, and the next follower fetch proposes again.
                rm.isr_proposal_ended(partition)
                self.log.info(
                    "alter_partition_rejected",
                    topic=partition.topic,
                    partition=partition.index,
                    error=answer.get("error_message"),
                )
        finally:
            self.in_flight.discard(partition.key)
