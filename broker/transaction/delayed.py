"""transaction.timeout.ms as a delayed operation on the broker's one timer."""

from __future__ import annotations

from typing import Protocol

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
