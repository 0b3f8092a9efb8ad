"""Kafka's TransactionMarkerChannelManager: a finished transaction's markers, written by each
of its partitions' leaders (WriteTxnMarkers), and the transaction completed once all have.

One trio task per transaction being completed: it groups the partitions still to mark by
their current leader, sends one WriteTxnMarkers to each (concurrently, over the
authenticated peer links), and goes round again after ``retry_backoff_ms`` for the
partitions whose answer was retriable (leader moved, not enough replicas, timed out, the
request lost or failed by an injected fault). A partition whose topic no longer exists is
dropped (Kafka's). INVALID_PRODUCER_EPOCH or TRANSACTION_COORDINATOR_FENCED mean a newer
coordinator or epoch owns the producer: this one stops (Kafka's abortSending). When none
is left, ``on_complete`` writes CompleteCommit/CompleteAbort.

Why a task per transaction and not Kafka's per-broker queue: a transaction's markers are
few (one per partition), answers come back per transaction anyway, and a task that sleeps
costs nothing on the trio loop; batching across transactions can come when measured.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from minibroker.broker.common.tasks import Spawner
from minibroker.protocol.errors import ErrorCode, KafkaError

# Kafka's TransactionMarkerRequestCompletionHandler: these end the sending for good.
_FENCED = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.TRANSACTION_COORDINATOR_FENCED})

TopicPartition = tuple[str, int]


class MarkerSender(Protocol):
    """Sends one WriteTxnMarkers body to a broker and returns its answer; raises KafkaError
    (NetworkException included) when there is none."""

    def __call__(self, broker_id: int, body: dict) -> Awaitable[dict]: ...


def marker_body(
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    partitions: list[TopicPartition],
) -> dict:
    topics: dict[str, list[int]] = {}
    for topic, index in sorted(partitions):
        topics.setdefault(topic, []).append(index)
    return {
        "markers": [
            {
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "transaction_result": commit,
                "topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()],
                "coordinator_epoch": coordinator_epoch,
            }
        ]
    }


class TransactionMarkerChannelManager:
    """Delivers markers; counts what it did for ``stats``."""

    def __init__(
        self,
        logger: Any,
        sender: MarkerSender,
        leader_of: Callable[[str, int], int | None],
        tasks: Spawner,
        retry_backoff_ms: int,
    ) -> None:
        self.log = logger
        self.sender = sender
        # The partition's leader now: -1 while it has none, None once the topic is gone.
        self.leader_of = leader_of
        self.tasks = tasks
        self.retry_backoff_ms = retry_backoff_ms
        self.in_flight: set[str] = set()  # transactional ids whose markers are being sent
        self.sent = 0
        self.retried = 0

    def add_markers(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: set[TopicPartition],
        still_wanted: Callable[[], bool],
        on_complete: Callable[[], None],
    ) -> None:
        """Start writing the markers; ``still_wanted()`` False (the coordinator resigned)
        stops it without completing."""
        self.in_flight.add(transactional_id)
        self.tasks.start_soon(
            self._deliver,
            transactional_id,
            (producer_id, producer_epoch, commit, coordinator_epoch),
            set(partitions),
            still_wanted,
            on_complete,
        )

    async def _deliver(
        self,
        transactional_id: str,
        marker: tuple[int, int, bool, int],
        remaining: set[TopicPartition],
        still_wanted: Callable[[], bool],
        on_complete: Callable[[], None],
    ) -> None:
        try:
            while remaining:
                if not still_wanted():
                    return
                results = await self._round(marker, remaining)
                for tp, code in results.items():
                    if code is ErrorCode.NONE:
                        remaining.discard(tp)
                    elif code in _FENCED:
                        self.log.warning(
                            "txn_markers_abandoned",
                            transactional_id=transactional_id,
                            topic=tp[0],
                            partition=tp[1],
                            error=code.name,
                        )
                        return
                if remaining:
                    self.retried += 1
                    await trio.sleep(self.retry_backoff_ms / 1000)
            if still_wanted():
                on_complete()
        finally:
            self.in_flight.discard(transactional_id)

    async def _round(
        self, marker: tuple[int, int, bool, int], remaining: set[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        """One WriteTxnMarkers per current leader; every partition of ``remaining`` gets a
        result (NOT_LEADER_OR_FOLLOWER while it has no leader)."""
        results: dict[TopicPartition, ErrorCode] = {}
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in remaining:
            leader = self.leader_of(*tp)
            if leader is None:
                results[tp] = ErrorCode.NONE  # the topic is gone: nothing to mark (Kafka's)
            elif leader < 0:
                results[tp] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            else:
                by_leader.setdefault(leader, []).append(tp)

        async def send(leader: int, tps: list[TopicPartition]) -> None:
            body = marker_body(*marker[:2], marker[2], marker[3], tps)
            try:
                answer = await self.sender(leader, body)
            except KafkaError as exc:
                self.log.debug("txn_markers_failed", broker=leader, error=str(exc))
                code = exc.code if exc.code in _FENCED else ErrorCode.NETWORK_EXCEPTION
                for tp in tps:
                    results[tp] = code
                return
            self.sent += 1
            answered = {
                (t["name"], p["partition_index"]): ErrorCode.parse(p["error_code"])
                for m in answer.get("markers", ())
                for t in m["topics"]
                for p in t["partitions"]
            }
            for tp in tps:
                results[tp] = answered.get(tp, ErrorCode.UNKNOWN_SERVER_ERROR)

        async with trio.open_nursery() as nursery:
            for leader, tps in by_leader.items():
                nursery.start_soon(send, leader, tps)
        return results
