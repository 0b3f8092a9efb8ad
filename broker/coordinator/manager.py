"""Which groups this broker coordinates, and their records (Kafka's GroupMetadataManager).

A group belongs to partition ``abs(java_hash(group_id)) % offsets.topic.num.partitions``
of ``__consumer_offsets``; the leader of that partition coordinates it. Becoming leader
starts a load (the partition's log replayed, latest value per key wins; the groups answer
COORDINATOR_LOAD_IN_PROGRESS meanwhile); losing it unloads them. Every write — a commit,
a generation's assignment, a deletion — is an acks=all produce through the replica
manager and its purgatory: acknowledged only once the in-sync replicas have it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from minibroker.broker.common.tasks import Spawner
from minibroker.broker.coordinator.group import GroupMetadata
from minibroker.broker.coordinator.records import OFFSETS_TOPIC, PartitionContents, batch
from minibroker.broker.replication.coordinator_log import (
    APPEND_ERRORS,
    CoordinatorPartitions,
    java_string_hash,
    partition_for,
)
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.protocol.batch import TRANSACTIONAL_FLAG, increment_sequence
from minibroker.protocol.errors import ErrorCode

# What a failed append of group records means to the client (Kafka's GroupMetadataManager
# maps them so): the shared mapping, plus a commit too large to store.
__all__ = ["GroupMetadataManager", "java_string_hash", "partition_for"]

_APPEND_ERRORS = {
    **APPEND_ERRORS,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
}


class GroupMetadataManager(CoordinatorPartitions):
    """Groups by id, the coordinator partitions owned or loading, and appends."""

    def __init__(
        self,
        broker_id: int,
        config: Any,
        logger: Any,
        replica_manager: ReplicaManager,
        tasks: Spawner,
        now_ms: Callable[[], int],
    ) -> None:
        super().__init__(
            OFFSETS_TOPIC,
            broker_id,
            logger,
            replica_manager,
            tasks,
            now_ms,
            config["offsets.topic.num.partitions"],
            _APPEND_ERRORS,
        )
        self.config = config
        self.groups: dict[str, GroupMetadata] = {}

    # --- ownership --------------------------------------------------------------------------

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.num_partitions)

    def ownership_error(self, group_id: str) -> ErrorCode | None:
        """None when this broker serves ``group_id`` now; else why not."""
        return self.partition_error(partition_for(group_id, self.num_partitions))

    def groups_of(self, partition: int) -> list[GroupMetadata]:
        return [g for g in self.groups.values() if g.partition == partition]

    def start_load(  # type: ignore[override]
        self, partition: int, epoch: int, on_loaded: Callable[[int, PartitionContents], None]
    ) -> None:
        """This broker leads ``partition`` at ``epoch``: replay its log, then serve it."""
        super().start_load(partition, epoch, PartitionContents(), on_loaded)

    def resign(self, partition: int) -> list[GroupMetadata]:
        """No longer the leader: stop serving ``partition``; returns its groups, removed."""
        if not self.resign_partition(partition):
            return []
        groups = self.groups_of(partition)
        for group in groups:
            del self.groups[group.group_id]
        self.log.info("coordinator_partition_unloaded", partition=partition, groups=len(groups))
        return groups

    # --- writes -------------------------------------------------------------------------------

    def append(  # type: ignore[override]
        self,
        partition: int,
        entries: list[tuple[bytes, bytes | None]],
        done: Callable[[ErrorCode], None],
        **producer: int,
    ) -> None:
        """Append records with acks=all; ``done(error)`` once the in-sync replicas have them
        (or they cannot), the error already in the group APIs' terms. ``producer``
        (producer_id, producer_epoch) makes it a transaction's batch (TxnOffsetCommit)."""
        if producer:
            producer["base_sequence"] = self._next_sequence(partition, **producer)
            # Transactional in the header, as Kafka's are: the partition then holds its LSO
            # and indexes the abort, so the cleaner drops aborted offsets instead of letting
            # them shadow the group's committed ones.
            producer["attributes"] = TRANSACTIONAL_FLAG
        super().append(
            partition,
            batch(entries, self.now_ms_wall(), **producer),
            self.config["offsets.commit.timeout.ms"],
            done,
        )

    def _next_sequence(self, partition: int, producer_id: int, producer_epoch: int) -> int:
        """The sequence the partition's producer state expects next from this producer (the
        log checks a transactional batch like an idempotent one); the leader appends
        synchronously, so the state read here is the one the append meets."""
        replica = self.replica_manager.partitions.get((self.topic, partition))
        entry = replica.log.producers.producers.get(producer_id) if replica else None
        if entry is None or entry.epoch != producer_epoch:
            return 0
        return increment_sequence(entry.last_seq, 1)

    @staticmethod
    def now_ms_wall() -> int:
        """Record timestamps are wall-clock (commit_timestamp), as Kafka's are."""
        return int(time.time() * 1000)
