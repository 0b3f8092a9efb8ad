"""Which transactional ids this broker coordinates, and their records (Kafka's
TransactionStateManager).

A transactional id belongs to partition ``abs(java_hash(id)) %
transaction.state.log.num.partitions`` of ``__transaction_state``; the leader of that
partition is its coordinator. Ownership, loading and acks=all appends are the shared
machinery of broker/replication/coordinator_log.py (the group coordinator's too).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from minibroker.broker.common.tasks import Spawner
from minibroker.broker.replication.coordinator_log import CoordinatorPartitions, partition_for
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.broker.transaction.metadata import TransactionMetadata, TxnTransit
from minibroker.broker.transaction.records import TXN_TOPIC, TxnLogContents, txn_batch
from minibroker.protocol.errors import ErrorCode

# How long a write to __transaction_state waits for the in-sync replicas (Kafka's
# transaction.state.log's request timeout is its broker's request.timeout.ms).
APPEND_TIMEOUT_MS = 30_000


class TransactionStateManager(CoordinatorPartitions):
    """Transactional ids by name, the partitions owned or loading, and their writes."""

    def __init__(
        self,
        broker_id: int,
        config: Any,
        logger: Any,
        replica_manager: ReplicaManager,
        tasks: Spawner,
        now_ms: Callable[[], int],
        wall_ms: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(
            TXN_TOPIC,
            broker_id,
            logger,
            replica_manager,
            tasks,
            now_ms,
            config["transaction.state.log.num.partitions"],
        )
        self.config = config
        self.wall_ms = wall_ms or (lambda: int(time.time() * 1000))
        self.transactions: dict[str, TransactionMetadata] = {}

    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.num_partitions)

    def ownership_error(self, transactional_id: str) -> ErrorCode | None:
        return self.partition_error(self.partition_for(transactional_id))

    def coordinator_epoch(self, partition: int) -> int:
        """The leader epoch this broker loaded the partition at: markers carry it, so a
        partition leader can refuse a deposed coordinator's."""
        return self.owned.get(partition, -1)

    def of_partition(self, partition: int) -> list[TransactionMetadata]:
        return [t for t in self.transactions.values() if t.partition == partition]

    def start_txn_load(
        self, partition: int, epoch: int, on_loaded: Callable[[int, TxnLogContents], None]
    ) -> None:
        self.start_load(partition, epoch, TxnLogContents(), on_loaded)

    def resign(self, partition: int) -> list[TransactionMetadata]:
        """No longer the leader: its ids are dropped (their new coordinator loads them)."""
        if not self.resign_partition(partition):
            return []
        dropped = self.of_partition(partition)
        for txn in dropped:
            del self.transactions[txn.transactional_id]
        self.log.info(
            "txn_coordinator_partition_unloaded", partition=partition, transactions=len(dropped)
        )
        return dropped

    def write(
        self,
        txn: TransactionMetadata,
        transits: list[TxnTransit | None],
        done: Callable[[ErrorCode], None],
    ) -> None:
        """Write the id's new values (None: its tombstone) as one batch, acks=all: all of
        them are stored, or none."""
        self.append(
            txn.partition,
            txn_batch(txn.transactional_id, transits, self.wall_ms()),
            APPEND_TIMEOUT_MS,
            done,
        )
