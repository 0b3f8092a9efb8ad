"""The coordinator as the broker sees it: the ten group APIs, its purgatories, and the
metadata hook that makes this broker coordinator of the partitions it leads.

Built by server.py with the replica manager, the broker's one timer, a task spawner and
a way to ask the controller for ``__consumer_offsets``; apis.py calls one method per API.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minibroker.broker.common.tasks import Spawner
from minibroker.broker.coordinator import offsets, txn_offsets
from minibroker.broker.coordinator.coordinator import GroupCoordinator
from minibroker.broker.coordinator.expiry import OffsetExpiry
from minibroker.broker.coordinator.manager import GroupMetadataManager
from minibroker.broker.coordinator.offset_delete import delete_offsets
from minibroker.broker.coordinator.records import OFFSETS_TOPIC, PartitionContents
from minibroker.broker.metadata.image import ClusterMetadata
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.purgatory import DeadlinePurgatory, Purgatory, Timer
from minibroker.broker.replication.coordinator_log import coordinator_answer, no_coordinator
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
        if OFFSETS_TOPIC not in md.topics:
            live = len(md.live) or len(md.brokers) or 1
            self.create_offsets_topic(
                self.config["offsets.topic.num.partitions"],
                min(self.config["offsets.topic.replication.factor"], live),
            )
            return no_coordinator("__consumer_offsets is being created")
        if not body["key"] or len(body["key"]) > 255:  # the group APIs' limit (group_api.py)
            return no_coordinator(None, ErrorCode.INVALID_GROUP_ID)
        return coordinator_answer(md, OFFSETS_TOPIC, self.manager.partition_for(body["key"]))

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

    def txn_commit_offsets(self, body: dict) -> dict | PendingResponse:
        return txn_offsets.txn_commit_offsets(self.coordinator, body, self._partition_exists)

    def complete_txn(self, topic: str, partition: int, producer_id: int, commit: bool) -> None:
        """A transaction marker landed on ``topic``-``partition`` (the replica manager's
        txn_marker_listeners): settle that producer's pending offsets there."""
        txn_offsets.complete_txn(self.coordinator, topic, partition, producer_id, commit)

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
        self.manager.leadership_changed(md, self._unload, self._load)

    def _unload(self, partition: int) -> None:
        for group in self.manager.resign(partition):
            self.coordinator.partition_unloaded(group)

    def _load(self, partition: int, epoch: int) -> None:
        self.manager.start_load(partition, epoch, self.partition_loaded)

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
