"""One transactional id's state (Kafka's TransactionMetadata and TransactionState).

The state machine is Kafka's: Empty -> Ongoing -> PrepareCommit/PrepareAbort ->
CompleteCommit/CompleteAbort -> (Ongoing again, or Empty after an epoch bump), with
PrepareEpochFence (a new producer took the id while a transaction was open: its epoch is
bumped and the transaction aborted) and Dead (the id expired). A change is *prepared*
(``prepare``: the target state, not yet applied, with ``pending_state`` set so that any
other request answers CONCURRENT_TRANSACTIONS), written to ``__transaction_state``, and
applied (``complete``) only once the in-sync replicas have it.
"""

from __future__ import annotations

import copy
from enum import Enum
from typing import Any, NamedTuple

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# An epoch at this value cannot be bumped again: the id gets a new producer id at epoch 0
# (Kafka's isEpochExhausted: Short.MaxValue - 1, one spare for the fencing bump).
MAX_EPOCH = 32767 - 1


class TxnState(Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"


S = TxnState
# Kafka's TransactionState.validPreviousStates.
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}
# A transaction is over in these: a new one may begin, the id may expire.
COMPLETED = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})


class IllegalTxnTransition(Exception):
    """A transition Kafka's state machine does not allow: a bug, never a client's doing."""


class TxnTransit(NamedTuple):
    """The state a prepared change leads to: what is written to the log, then applied."""

    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[tuple[str, int]]
    start_ms: int
    last_update_ms: int


class TransactionMetadata:
    """A transactional id as its coordinator holds it."""

    __slots__ = (
        "last_producer_epoch",
        "last_producer_id",
        "last_update_ms",
        "partition",
        "partitions",
        "pending_state",
        "producer_epoch",
        "producer_id",
        "start_ms",
        "state",
        "timeout_ms",
        "timeout_op",
        "transactional_id",
    )

    def __init__(
        self,
        transactional_id: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        timeout_ms: int,
        now_ms: int,
        state: TxnState = S.EMPTY,
    ) -> None:
        self.transactional_id = transactional_id
        self.partition = partition  # its __transaction_state partition
        self.producer_id = producer_id
        self.last_producer_id = NO_PRODUCER_ID
        self.producer_epoch = producer_epoch
        self.last_producer_epoch = NO_PRODUCER_EPOCH
        self.timeout_ms = timeout_ms
        self.state = state
        self.partitions: set[tuple[str, int]] = set()
        self.start_ms = -1  # when the open transaction began (-1: none open)
        self.last_update_ms = now_ms
        self.pending_state: TxnState | None = None
        self.timeout_op: Any = None  # the open transaction's TxnTimeout (service.py)

    def __repr__(self) -> str:
        return (
            f"Txn({self.transactional_id!r}, {self.state.value}, "
            f"pid={self.producer_id}, epoch={self.producer_epoch})"
        )

    # --- prepared transitions (Kafka's prepare* methods) -----------------------------------

    def prepare(self, state: TxnState, now_ms: int, **changes: Any) -> TxnTransit:
        """The change to ``state`` (with ``changes`` to the other fields), marked pending."""
        if self.pending_state is not None:
            raise IllegalTxnTransition(f"{self}: {self.pending_state.value} is still pending")
        if self.state not in VALID_PREVIOUS[state]:
            raise IllegalTxnTransition(f"{self}: {self.state.value} -> {state.value}")
        fields = {
            "producer_id": self.producer_id,
            "last_producer_id": self.last_producer_id,
            "producer_epoch": self.producer_epoch,
            "last_producer_epoch": self.last_producer_epoch,
            "timeout_ms": self.timeout_ms,
            "state": state,
            "partitions": frozenset(self.partitions),
            "start_ms": self.start_ms,
            "last_update_ms": now_ms,
        }
        fields.update(changes)
        self.pending_state = state
        return TxnTransit(**fields)

    def prepare_epoch_bump(
        self, timeout_ms: int, now_ms: int, new_producer_id: int = -1
    ) -> TxnTransit:
        """InitProducerId on a finished transaction: epoch + 1, or a new producer id at epoch
        0 once the epoch is exhausted (``new_producer_id``)."""
        if new_producer_id >= 0:
            return self.prepare(
                S.EMPTY,
                now_ms,
                producer_id=new_producer_id,
                last_producer_id=self.producer_id,
                producer_epoch=0,
                last_producer_epoch=self.producer_epoch,
                timeout_ms=timeout_ms,
                partitions=frozenset(),
                start_ms=-1,
            )
        return self.prepare(
            S.EMPTY,
            now_ms,
            producer_epoch=self.producer_epoch + 1,
            last_producer_epoch=self.producer_epoch,
            timeout_ms=timeout_ms,
            partitions=frozenset(),
            start_ms=-1,
        )

    def fence_producer_epoch(self) -> None:
        """Kafka's prepareFenceProducerEpoch: the open transaction's producer is fenced (its
        epoch bumped in memory) and the abort that follows is written under the new
        epoch, so the old producer's requests are refused from now on."""
        if self.state not in VALID_PREVIOUS[S.PREPARE_EPOCH_FENCE]:
            raise IllegalTxnTransition(f"{self}: cannot fence from {self.state.value}")
        if self.producer_epoch < MAX_EPOCH:
            self.last_producer_epoch = self.producer_epoch
            self.producer_epoch += 1
        self.state = S.PREPARE_EPOCH_FENCE

    def prepare_add_partitions(self, added: set[tuple[str, int]], now_ms: int) -> TxnTransit:
        start = now_ms if self.state in COMPLETED else self.start_ms
        return self.prepare(
            S.ONGOING,
            now_ms,
            partitions=frozenset(self.partitions | added),
            start_ms=start,
        )

    def prepare_complete(self, now_ms: int) -> TxnTransit:
        """PrepareCommit/Abort -> CompleteCommit/Abort, once every marker is written."""
        state = S.COMPLETE_COMMIT if self.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
        return self.prepare(state, now_ms, partitions=frozenset())

    def complete(self, transit: TxnTransit) -> None:
        """The prepared change is in the log: apply it."""
        self.pending_state = None
        self.producer_id = transit.producer_id
        self.last_producer_id = transit.last_producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.timeout_ms = transit.timeout_ms
        self.state = transit.state
        self.partitions = set(transit.partitions)
        self.start_ms = transit.start_ms
        self.last_update_ms = transit.last_update_ms

    def after(self, transit: TxnTransit) -> TransactionMetadata:
        """A detached copy as it will be once ``transit`` is applied: the next change is
        prepared on it, to be written in the same append (coordinator.py's follow-on)."""
        shadow = copy.copy(self)
        shadow.complete(transit)
        return shadow

    def abandon(self) -> None:
        """The prepared change could not be written: nothing changed."""
        self.pending_state = None

    def describe_topics(self) -> list[dict]:
        topics: dict[str, list[int]] = {}
        for topic, index in sorted(self.partitions):
            topics.setdefault(topic, []).append(index)
        return [{"name": t, "partitions": ps} for t, ps in topics.items()]
