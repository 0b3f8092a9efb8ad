"""WriteTxnMarkers, the partition side (Kafka's handleWriteTxnMarkersRequest).

A transaction coordinator asks each partition leader of a transaction to end it there:
one control batch per (marker, partition), appended at the leader's log end with
acks=all semantics. Each marker waits in the produce purgatory like an acks=all produce
(DelayedProduce on the partitions it wrote) and the request is answered when every
marker's partitions are replicated to the ISR, or timed out (REQUEST_TIMED_OUT), or
refused: NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, NOT_ENOUGH_REPLICAS,
INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED (the coordinator retries the
retriable ones). A marker that landed on a ``__consumer_offsets`` partition is reported to
``ReplicaManager.txn_marker_listeners`` once replicated (the group coordinator then
materialises or drops that producer's pending offset commits), as Kafka's
onTransactionCompleted is called from the write's completion.
"""

from __future__ import annotations

from typing import Any

from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.network.session import ConnectionSession
from minibroker.broker.replication.delayed import DelayedProduce, ProducePartitionStatus
from minibroker.protocol import GROUP_METADATA_TOPIC
from minibroker.protocol.errors import ErrorCode, KafkaError

# The ReplicaManager, untyped here: it imports this module (no cycle, by the layering test).
ReplicaManager = Any

Key = tuple[str, int]

# How long a marker waits for the ISR: Kafka's markers use the broker's request timeout.
MARKER_TIMEOUT_MS = 30_000


def write_txn_markers(
    manager: ReplicaManager, body: dict, session: ConnectionSession | None
) -> dict | PendingResponse:
    """Append every marker, park until replicated; the answer per marker and partition."""
    answers: list[Any] = []
    for marker in body["markers"]:
        statuses: dict[Key, ProducePartitionStatus] = {}
        for t in marker["topics"]:
            for index in t["partition_indexes"]:
                key = (t["name"], index)
                if key not in statuses:
                    statuses[key] = _append(manager, key, marker)
        appended = [key for key, status in statuses.items() if status.acks_pending]
        if appended:
            op = DelayedProduce(MARKER_TIMEOUT_MS, statuses, manager.partitions.get)
            answer = manager.park_produce(op, appended, session)
        else:
            answer = {}
        answers.append(_translate(manager, marker, statuses, answer))
    return _gather(answers)


def _append(manager: ReplicaManager, key: Key, marker: dict) -> ProducePartitionStatus:
    partition = manager.partitions.get(key)
    if partition is None:
        return ProducePartitionStatus(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)
    if manager.offline_reason is not None:
        return ProducePartitionStatus(ErrorCode.KAFKA_STORAGE_ERROR, -1, -1, manager.offline_reason)
    try:
        hw_before = partition.high_watermark
        info = partition.append_marker_to_leader(
            marker["producer_id"],
            marker["producer_epoch"],
            marker["coordinator_epoch"],
            marker["transaction_result"],
        )
    except KafkaError as exc:
        return ProducePartitionStatus(exc.code, -1, -1, exc.message or None)
    except OSError as exc:
        manager.storage_failed(exc, f"writing a transaction marker to {key[0]}-{key[1]}")
        return ProducePartitionStatus(ErrorCode.KAFKA_STORAGE_ERROR, -1, -1, manager.offline_reason)
    manager.logger.debug(
        "txn_marker_appended",
        topic=key[0],
        partition=key[1],
        producer_id=marker["producer_id"],
        commit=marker["transaction_result"],
        offset=info.first_offset,
    )
    manager.appended(key, partition, hw_before)
    return ProducePartitionStatus(ErrorCode.NONE, info.first_offset, info.last_offset + 1)


def _translate(
    manager: ReplicaManager, marker: dict, statuses: dict[Key, ProducePartitionStatus], answer: Any
) -> Any:
    """This marker's answer, now or when its DelayedProduce completes (it updates
    ``statuses`` in place); listeners hear of replicated __consumer_offsets markers."""

    def build(_: dict) -> dict:
        topics: dict[str, list] = {}
        for (topic, index), status in statuses.items():
            code = status.error
            topics.setdefault(topic, []).append({"partition_index": index, "error_code": int(code)})
            if code is ErrorCode.NONE and topic == GROUP_METADATA_TOPIC:
                for listener in manager.txn_marker_listeners:
                    try:
                        listener(topic, index, marker["producer_id"], marker["transaction_result"])
                    except Exception:
                        manager.logger.exception("txn_marker_listener_failed", partition=index)
        return {
            "producer_id": marker["producer_id"],
            "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()],
        }

    if isinstance(answer, PendingResponse):
        out = PendingResponse()
        answer.add_done_callback(lambda body: out.set(build(body)))
        return out
    return build(answer)


def _gather(answers: list[Any]) -> dict | PendingResponse:
    """One answer once every marker's is in (each a dict or a PendingResponse)."""
    pending = [a for a in answers if isinstance(a, PendingResponse)]
    if not pending:
        return {"markers": answers}
    out = PendingResponse()
    left = [len(pending)]

    def one_done(_: dict) -> None:
        left[0] -= 1
        if left[0] == 0:
            out.set({"markers": [a.body if isinstance(a, PendingResponse) else a for a in answers]})

    for a in pending:
        a.add_done_callback(one_done)
    return out
