"""The transaction coordinator as the broker sees it: its APIs, its purgatory, the metadata
hook that makes this broker coordinator of the ``__transaction_state`` partitions it
leads, and the periodic removal of idle transactional ids.

Built by server.py with the replica manager, the broker's one timer, a task spawner, the
metadata, a way to ask the controller for the topic, InitProducerId's producer-id source
and a WriteTxnMarkers sender; apis.py calls one method per API.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from minibroker.broker.common.tasks import Spawner
from minibroker.broker.metadata.image import ClusterMetadata
from minibroker.broker.network.pending import PendingResponse, then
from minibroker.broker.purgatory import Purgatory, Timer
from minibroker.broker.replication.coordinator_log import (
    coordinator_answer,
    no_coordinator,
    partition_for,
)
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.broker.transaction.answers import error_only
from minibroker.broker.transaction.coordinator import TransactionCoordinator
from minibroker.broker.transaction.manager import TransactionStateManager
from minibroker.broker.transaction.markers import MarkerSender, TransactionMarkerChannelManager
from minibroker.broker.transaction.metadata import COMPLETED, TxnState
from minibroker.broker.transaction.records import TXN_TOPIC, TxnLogContents
from minibroker.protocol import GROUP_METADATA_TOPIC
from minibroker.protocol.errors import ErrorCode

_STATES = {s.value.lower(): s for s in TxnState}


class TransactionService:
    """Every broker runs one; it coordinates the ids of the txn-state partitions it leads."""

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
        create_topic: Callable[[str, int, int, dict[str, str]], None],
        new_producer_id: Callable[[], dict | PendingResponse],
        send_markers: MarkerSender,
        wall_ms: Callable[[], int] | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.config = config
        self.log = logger
        self.metadata = metadata
        self.create_topic = create_topic
        self.clock = timer.clock
        # transaction.timeout.ms: one timer task per open transaction on the shared wheel.
        self.purgatories = {
            "txn_timeout": Purgatory("TxnTimeout", timer),
            # add.partitions.to.txn.retry.backoff.max.ms: AddPartitionsToTxn on a busy id.
            "add_partitions": Purgatory("AddPartitionsToTxn", timer),
        }
        self.manager = TransactionStateManager(
            broker_id, config, logger, replica_manager, tasks, timer.clock.now_ms, wall_ms
        )
        self.markers = TransactionMarkerChannelManager(
            logger,
            send_markers,
            self._leader_of,
            tasks,
            config["transaction.marker.retry.backoff.ms"],
        )
        self.coordinator = TransactionCoordinator(
            config,
            logger,
            self.manager,
            self.markers,
            self.purgatories["txn_timeout"],
            new_producer_id,
            self.purgatories["add_partitions"],
        )
        self.expired_ids = 0

    def _leader_of(self, topic: str, partition: int) -> int | None:
        state = self.metadata().topics.get(topic)
        if state is None or partition >= len(state.partitions):
            return None
        return state.partitions[partition].leader

    # --- FindCoordinator key_type 1 --------------------------------------------------------

    def find_coordinator(self, body: dict) -> dict:
        """The leader of the id's ``__transaction_state`` partition; the topic is created
        on first use, sized and replicated as Kafka's (clamped to the live brokers)."""
        if not body["key"]:
            return no_coordinator("a transactional id must not be empty", ErrorCode.INVALID_REQUEST)
        md = self.metadata()
        if TXN_TOPIC not in md.topics:
            live = len(md.live) or len(md.brokers) or 1
            replication = min(self.config["transaction.state.log.replication.factor"], live)
            self.create_topic(
                TXN_TOPIC,
                self.config["transaction.state.log.num.partitions"],
                replication,
                {
                    "min.insync.replicas": str(
                        min(self.config["transaction.state.log.min.isr"], replication)
                    ),
                },
            )
            return no_coordinator(f"{TXN_TOPIC} is being created")
        return coordinator_answer(md, TXN_TOPIC, self.manager.partition_for(body["key"]))

    # --- the APIs ------------------------------------------------------------------------

    def init_producer_id(self, body: dict) -> dict | PendingResponse:
        return self.coordinator.init_producer_id(body)

    def add_partitions_to_txn(self, body: dict) -> dict | PendingResponse:
        """Kafka's KafkaApis check first: a partition that does not exist fails the request
        (UNKNOWN_TOPIC_OR_PARTITION, the rest OPERATION_NOT_ATTEMPTED)."""
        wanted = {(t["name"], p) for t in body["topics"] for p in t["partitions"]}
        unknown = {tp for tp in wanted if self._leader_of(*tp) is None}
        if unknown:
            return _partition_results(
                body["topics"],
                lambda tp: (
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    if tp in unknown
                    else ErrorCode.OPERATION_NOT_ATTEMPTED
                ),
            )
        result = self.coordinator.add_partitions(
            body["transactional_id"], body["producer_id"], body["producer_epoch"], wanted
        )
        return then(result, lambda code: _partition_results(body["topics"], lambda tp: code))

    def add_offsets_to_txn(self, body: dict) -> dict | PendingResponse:
        """The group's ``__consumer_offsets`` partition joins the transaction: its
        TxnOffsetCommit offsets are marked with the rest."""
        offsets = self.metadata().topics.get(GROUP_METADATA_TOPIC)
        count = (
            len(offsets.partitions)
            if offsets is not None
            else self.config["offsets.topic.num.partitions"]
        )
        partition = (GROUP_METADATA_TOPIC, partition_for(body["group_id"], count))
        result = self.coordinator.add_partitions(
            body["transactional_id"], body["producer_id"], body["producer_epoch"], {partition}
        )
        return then(result, lambda code: error_only(code))

    def end_txn(self, body: dict) -> dict | PendingResponse:
        return self.coordinator.end_txn(body)

    def list_transactions(self, body: dict) -> dict:
        """KIP-664: the ids this broker coordinates, filtered by state, producer id and how
        long the transaction has been open (KIP-994's duration filter)."""
        unknown = [s for s in body["state_filters"] if s.lower() not in _STATES]
        states = {_STATES[s.lower()] for s in body["state_filters"] if s.lower() in _STATES}
        pids = set(body["producer_id_filters"])
        duration = body.get("duration_filter", -1)
        now = self.manager.wall_ms()
        out = []
        for txn in self.manager.transactions.values():
            if states and txn.state not in states:
                continue
            if pids and txn.producer_id not in pids:
                continue
            if duration >= 0 and (txn.start_ms < 0 or now - txn.start_ms < duration):
                continue
            out.append(
                {
                    "transactional_id": txn.transactional_id,
                    "producer_id": txn.producer_id,
                    "transaction_state": txn.state.value,
                }
            )
        error = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if self.manager.loading else ErrorCode.NONE
        return {
            "error_code": int(error),
            "unknown_state_filters": unknown,
            "transaction_states": out,
            "throttle_time_ms": 0,
        }

    def describe_transactions(self, body: dict) -> dict:
        out = []
        for transactional_id in body["transactional_ids"]:
            entry = {
                "error_code": 0,
                "transactional_id": transactional_id,
                "transaction_state": "",
                "transaction_timeout_ms": 0,
                "transaction_start_time_ms": -1,
                "producer_id": -1,
                "producer_epoch": -1,
                "topics": [],
            }
            error = self.manager.ownership_error(transactional_id) if transactional_id else None
            txn = self.manager.transactions.get(transactional_id)
            if error is not None:
                entry["error_code"] = int(error)
            elif txn is None:
                entry["error_code"] = int(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND)
            else:
                entry.update(
                    transaction_state=txn.state.value,
                    transaction_timeout_ms=txn.timeout_ms,
                    transaction_start_time_ms=txn.start_ms,
                    producer_id=txn.producer_id,
                    producer_epoch=txn.producer_epoch,
                    topics=txn.describe_topics(),
                )
            out.append(entry)
        return {"transaction_states": out, "throttle_time_ms": 0}

    # --- leadership of the txn-state partitions ------------------------------------------

    def on_metadata(self, md: ClusterMetadata) -> None:
        self.manager.leadership_changed(md, self._unload, self._load)

    def _unload(self, partition: int) -> None:
        self.coordinator.partition_unloaded(self.manager.resign(partition))

    def _load(self, partition: int, epoch: int) -> None:
        self.manager.start_txn_load(partition, epoch, self._loaded)

    def _loaded(self, partition: int, contents: TxnLogContents) -> None:
        self.coordinator.partition_loaded(partition, contents.transactions)

    # --- transactional.id.expiration.ms ---------------------------------------------------

    def expire_transactional_ids(self) -> int:
        """Remove ids idle (no transaction open, none completing) for longer than
        transactional.id.expiration.ms: a tombstone each, then forgotten (Kafka's
        removeExpiredTransactionalIds). Returns how many were written."""
        limit = self.config["transactional.id.expiration.ms"]
        now = self.manager.wall_ms()
        expired = [
            txn
            for txn in self.manager.transactions.values()
            if txn.state in COMPLETED
            and txn.pending_state is None
            and txn.partition in self.manager.owned
            and now - txn.last_update_ms >= limit
        ]
        for txn in expired:
            txn.prepare(TxnState.DEAD, now)

            def removed(code: ErrorCode, txn=txn) -> None:
                txn.pending_state = None
                if code is ErrorCode.NONE:
                    txn.state = TxnState.DEAD
                    if self.manager.transactions.get(txn.transactional_id) is txn:
                        del self.manager.transactions[txn.transactional_id]
                    self.expired_ids += 1
                    self.log.info("txn_id_expired", transactional_id=txn.transactional_id)

            self.manager.write(txn, [None], removed)
        return len(expired)

    async def run(self) -> None:
        """The id-expiration scan, every
        transaction.remove.expired.transaction.cleanup.interval.ms (Kafka's)."""
        interval = self.config["transaction.remove.expired.transaction.cleanup.interval.ms"]
        while True:
            await trio.sleep(interval / 1000)
            self.expire_transactional_ids()

    def stats(self) -> dict:
        by_state: dict[str, int] = {}
        for txn in self.manager.transactions.values():
            by_state[txn.state.value] = by_state.get(txn.state.value, 0) + 1
        return {
            "transactional_ids": len(self.manager.transactions),
            "states": by_state,
            "owned_partitions": sorted(self.manager.owned),
            "loading_partitions": sorted(self.manager.loading),
            "timed_out": self.coordinator.timed_out,
            "ids_expired": self.expired_ids,
            "markers_in_flight": len(self.markers.in_flight),
            "marker_requests": self.markers.sent,
            "marker_retries": self.markers.retried,
            "purgatory": {name: p.stats() for name, p in self.purgatories.items()},
        }


def _partition_results(topics: list[dict], code: Callable[[tuple[str, int]], ErrorCode]) -> dict:
    return {
        "results": [
            {
                "name": t["name"],
                "partitions": [
                    {"partition": p, "error_code": int(code((t["name"], p)))}
                    for p in t["partitions"]
                ],
            }
            for t in topics
        ],
        "throttle_time_ms": 0,
    }
