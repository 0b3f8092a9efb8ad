"""The coordinator as the broker sees it: the ten group APIs, its purgatories, and the
metadata hook that makes this broker coordinator of the partitions it leads.

Built by server.py with the replica manager, the broker's one timer, a task spawner and
a way to ask the controller for ``__consumer_offsets``; apis.py calls one method per API.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minibroker.broker.common.tasks import Spawner
from minibroker.broker.coordinator import offsets
from minibroker.broker.coordinator.coordinator import GroupCoordinator
from minibroker.broker.coordinator.expiry import OffsetExpiry
from minibroker.broker.coordinator.manager import GroupMetadataManager
from minibroker.broker.coordinator.offset_delete import delete_offsets
from minibroker.broker.coordinator.records import OFFSETS_TOPIC, PartitionContents
from minibroker.broker.metadata.image import ClusterMetadata
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.purgatory import DeadlinePurgatory, Purgatory, Timer
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.protocol.errors import ErrorCode


class CoordinatorService:
    """Every broker runs one; it coordinates the groups of the offsets partitions it leads."""

    def __init__(
        self,
        broker_id: int,
        config: Any,
        logger: Any,
        *,
        replica_manager: ReplicaManager,
        timer: Timer,
        tasks: Spawner,
        metadata: Callable[[], ClusterMetadata],
        create_offsets_topic: Callable[[int, int], None],
    ) -> None:
        self.broker_id = broker_id
        self.log = logger
        self.metadata = metadata
        self.create_offsets_topic = create_offsets_topic
        self.config = config
        now_ms = timer.clock.now_ms
        # One purgatory per kind of wait (Kafka's DelayedOperationPurgatory[DelayedJoin],
        # [DelayedHeartbeat], ...), all on the broker's one timer thread.
        self.purgatories = {
            "join": Purgatory("Rebalance", timer),
            "heartbeat": DeadlinePurgatory("Heartbeat", timer),
            "sync": Purgatory("Sync", timer),
        }
        self.manager = GroupMetadataManager(
            broker_id, config, logger, replica_manager, tasks, now_ms
        )
        self.coordinator = GroupCoordinator(
            broker_id,
            config,
            logger,
            self.manager,
            join_purgatory=self.purgatories["join"],
            heartbeat_purgatory=self.purgatories["heartbeat"],
            sync_purgatory=self.purgatories["sync"],
            now_ms=now_ms,
        )
        self.expiry = OffsetExpiry(self.coordinator, config, logger, self.manager.now_ms_wall)
        # Every member calls it every heartbeat.interval.ms: no call in between.
        self.heartbeat: Callable[[dict], dict] = self.coordinator.heartbeat

    # --- the APIs -----------------------------------------------------------------------------

    def find_coordinator(self, body: dict) -> dict:
        """The leader of the group's offsets partition; the topic is created on first use."""
        md = self.metadata()
        topic = md.topics.get(OFFSETS_TOPIC)
        if topic is None:
            live = len(md.live) or len(md.brokers) or 1
            self.create_offsets_topic(
                self.config["offsets.topic.num.partitions"],
                min(self.config["offsets.topic.replication.factor"], live),
            )
            return _no_coordinator("__consumer_offsets is being created")
        if not body["key"]:
            return {**_no_coordinator(None), "error_code": int(ErrorCode.INVALID_GROUP_ID)}
        partition = self.manager.partition_for(body["key"])
        if partition >= len(topic.partitions):
            return _no_coordinator(None)
        leader = topic.partitions[partition].leader
        broker = md.brokers.get(leader)
        if broker is None:
            return _no_coordinator(f"{OFFSETS_TOPIC}-{partition} has no leader")
        return {
            "error_code": 0,
            "node_id": broker.node_id,
            "host": broker.host,
            "port": broker.port,
            "error_message": None,
            "throttle_time_ms": 0,
        }

    def join_group(self, body: dict, client_id: str, client_host: str) -> dict | PendingResponse:
        return self.coordinator.join_group(body, client_id, client_host)

    def sync_group(self, body: dict) -> dict | PendingResponse:
        return self.coordinator.sync_group(body)

    def leave_group(self, body: dict) -> dict:
        return self.coordinator.leave_group(body)

    def commit_offsets(self, body: dict) -> dict | PendingResponse:
        return offsets.commit_offsets(self.coordinator, body, self._partition_exists)

    def _partition_exists(self, topic: str, partition: int) -> bool:
        """Kafka's metadataCache.contains(topicPartition), as OffsetCommit checks it."""
        state = self.metadata().topics.get(topic)
        return state is not None and 0 <= partition < len(state.partitions)

    def fetch_offsets(self, body: dict) -> dict:
        return offsets.fetch_offsets(self.coordinator, body)

    def list_groups(self, body: dict) -> dict:
        return offsets.list_groups(self.coordinator, body)

    def describe_groups(self, body: dict) -> dict:
        return offsets.describe_groups(self.coordinator, body)

    def delete_groups(self, body: dict) -> dict | PendingResponse:
        return offsets.delete_groups(self.coordinator, body)

    def delete_offsets(self, body: dict) -> dict | PendingResponse:
        return delete_offsets(self.coordinator, body)

    # --- leadership of the offsets partitions ------------------------------------------------

    def on_metadata(self, md: ClusterMetadata) -> None:
        """Load the offsets partitions this broker now leads; unload those it lost."""
        topic = md.topics.get(OFFSETS_TOPIC)
        if topic is None:
            return
        manager = self.manager
        manager.num_partitions = len(topic.partitions)
        replicas = manager.replica_manager.partitions
        for index, state in enumerate(topic.partitions):
            replica = replicas.get((OFFSETS_TOPIC, index))
            leads = state.leader == self.broker_id and replica is not None and replica.is_leader
            loaded_at = manager.owned.get(index, manager.loading.get(index))
            if loaded_at is not None and (not leads or loaded_at != state.leader_epoch):
                # Lost it, or lost and regained it: what we hold may be stale either way.
                for group in manager.resign(index):
                    self.coordinator.partition_unloaded(group)
            if leads:
                manager.start_load(index, state.leader_epoch, self.partition_loaded)

    def partition_loaded(self, partition: int, contents: PartitionContents) -> None:
        self.coordinator.partition_loaded(partition, contents)
        self.expiry.partition_loaded(partition, contents)

    def stats(self) -> dict:
        return {
            "groups": len(self.manager.groups),
            "owned_partitions": sorted(self.manager.owned),
            "loading_partitions": sorted(self.manager.loading),
            "offsets_expired": self.expiry.expired_offsets,
            "groups_expired": self.expiry.deleted_groups,
            "purgatory": {name: p.stats() for name, p in self.purgatories.items()},
        }


def _no_coordinator(message: str | None) -> dict:
    return {
        "error_code": int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
        "node_id": -1,
        "host": "",
        "port": -1,
        "error_message": message,
        "throttle_time_ms": 0,
    }
