"""The coordinator's delayed operations on the broker's one timer: transaction.timeout.ms,
and an AddPartitionsToTxn waiting for the transaction's change in flight."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.purgatory import DelayedOperation
from minibroker.broker.transaction.metadata import TransactionMetadata


class TimeoutOwner(Protocol):
    """What the operation calls back (coordinator.py's TransactionCoordinator)."""

    def abort_timed_out(self, txn: TransactionMetadata, epoch: int) -> None: ...


class TxnTimeout(DelayedOperation):
    """An open transaction's transaction.timeout.ms, one timer task per transaction on the
    broker's wheel: cancelled when the transaction ends, it aborts the transaction (and
    fences its producer) when it fires."""

    __slots__ = ("coordinator", "epoch", "txn")

    def __init__(self, coordinator: TimeoutOwner, txn: TransactionMetadata, delay_ms: int) -> None:
        super().__init__(delay_ms)
        self.coordinator = coordinator
        self.txn = txn
        self.epoch = txn.producer_epoch

    def on_expiration(self) -> None:
        self.coordinator.abort_timed_out(self.txn, self.epoch)


class DelayedAddPartitions(DelayedOperation):
    """An AddPartitionsToTxn (or AddOffsetsToTxn) that found the transactional id busy: the
    previous transaction's markers and CompleteCommit still being written, or another
    change in flight. Instead of CONCURRENT_TRANSACTIONS at once, which the client meets
    with a retry backoff (librdkafka's and the Java client's: ~20 ms, longer than the
    markers take), it is tried again each time a change of the id is applied, so it
    proceeds the moment the previous transaction completes. Kafka 4.0 does the same for
    the partitions it adds on a producer's behalf (KAFKA-18654), retrying on a 20 ms timer
    for up to ``add.partitions.to.txn.retry.backoff.max.ms``; here a completion wakes it,
    and that bound only caps the wait: then it is handled as it stands (still busy:
    CONCURRENT_TRANSACTIONS, as Kafka answers)."""

    __slots__ = ("attempt", "busy", "request", "response")

    def __init__(self, busy: Callable[[], bool], attempt: Callable[[], Any], delay_ms: int) -> None:
        super().__init__(delay_ms)
        self.busy = busy  # no side effects: asked on every change of the id
        # The request handled now: an ErrorCode, or a PendingResponse of one (a write).
        self.attempt = attempt
        self.response = PendingResponse()
        # (producer_id, producer_epoch, partitions): what a follow-on write may add.
        self.request: tuple[int, int, frozenset[tuple[str, int]]] = (-1, -1, frozenset())

    def try_complete(self) -> bool:
        return not self.busy() and self.force_complete()

    def claim(self, outcome: PendingResponse) -> bool:
        """Answered by a write already under way, which adds this request's partitions
        (the coordinator's follow-on); False if it was answered already."""
        self.attempt = lambda: outcome
        return self.force_complete()

    def on_complete(self) -> None:
        """Handled once, on a wake-up or at the deadline (the order Kafka's purgatory
        keeps: on_complete, then on_expiration)."""
        outcome = self.attempt()
        self.busy = self.attempt = _done  # drop the coordinator's state (KAFKA-19389)
        if isinstance(outcome, PendingResponse):
            outcome.add_done_callback(self.response.set)
        else:
            self.response.set(outcome)


def _done() -> Any:
    return None
