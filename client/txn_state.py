"""The transactional producer's state machine (Kafka's TransactionManager.State), pure.

Kafka's states and its table of valid transitions, the partitions already added to the
open transaction, and the error that stopped it. Two kinds of error, as Kafka's:

- *abortable* (a record that could not be written, a group's refusal of offsets): the
  transaction cannot commit; abort_transaction() gets the producer back to READY.
- *fatal* (PRODUCER_FENCED: another producer took this transactional.id; an
  authorization failure, an invalid state): the producer can only be closed.

No I/O here, so the rules are unit tested without a broker (client/transactions.py does
the requests).
"""

from __future__ import annotations

from enum import Enum

from minibroker.protocol.errors import ErrorCode, KafkaError, ProducerFenced, error_class

TopicPartition = tuple[str, int]


class TxnState(Enum):
    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING_TRANSACTION = "COMMITTING_TRANSACTION"
    ABORTING_TRANSACTION = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


S = TxnState
# target -> the states it may be reached from (Kafka's isTransitionValid); FATAL_ERROR
# may be reached from anywhere.
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    S.UNINITIALIZED: frozenset({S.READY, S.ABORTABLE_ERROR}),
    S.INITIALIZING: frozenset({S.UNINITIALIZED, S.ABORTING_TRANSACTION}),
    S.READY: frozenset({S.INITIALIZING, S.COMMITTING_TRANSACTION, S.ABORTING_TRANSACTION}),
    S.IN_TRANSACTION: frozenset({S.READY}),
    S.COMMITTING_TRANSACTION: frozenset({S.IN_TRANSACTION}),
    S.ABORTING_TRANSACTION: frozenset({S.IN_TRANSACTION, S.ABORTABLE_ERROR}),
    S.ABORTABLE_ERROR: frozenset(
        {S.IN_TRANSACTION, S.COMMITTING_TRANSACTION, S.ABORTABLE_ERROR, S.INITIALIZING}
    ),
}

# Answers of the coordinator APIs that are tried again after retry.backoff.ms (Kafka's
# TransactionManager handlers): a commit or abort still completing, a coordinator
# loading or moving, a partition whose metadata is on its way, a partition left out
# because another in the same request failed.
RETRY = frozenset(
    {
        ErrorCode.CONCURRENT_TRANSACTIONS,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.OPERATION_NOT_ATTEMPTED,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.NETWORK_EXCEPTION,
    }
)
# The producer cannot go on: close it (a new one with the same id fences this one's
# leftovers on its init_transactions).
FATAL = frozenset(
    {
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        ErrorCode.INVALID_TXN_STATE,
        ErrorCode.INVALID_PRODUCER_ID_MAPPING,
        ErrorCode.INVALID_TRANSACTION_TIMEOUT,
        ErrorCode.TRANSACTION_COORDINATOR_FENCED,
        ErrorCode.UNSUPPORTED_VERSION,
    }
)
# A partition leader's answer to a transactional Produce that ends the producer: its
# epoch is older than the one on the log only when another producer bumped it, and
# Kafka reports that as abortable (the abort's EndTxn then says PRODUCER_FENCED).
_PRODUCE_FATAL = FATAL - {ErrorCode.INVALID_PRODUCER_EPOCH}


class IllegalTransactionState(RuntimeError):
    """Kafka's IllegalStateException: a method called in a state that does not allow it
    (send before begin_transaction, commit without a transaction, ...)."""


class TransactionAborted(Exception):
    """Kafka's TransactionAbortedException: the record was not sent because its
    transaction was aborted first."""


def coordinator_error(code: int, message: str = "") -> KafkaError:
    """The exception for a coordinator API's error code: INVALID_PRODUCER_EPOCH from the
    coordinator means another producer has this id's epoch now, so it is raised as
    ProducerFenced, as Kafka's client does."""
    code = ErrorCode.parse(code)
    if code is ErrorCode.INVALID_PRODUCER_EPOCH:
        return ProducerFenced(message or "another producer with this transactional.id is newer")
    return error_class(code)(message)


class TransactionState:
    """Where one transactional producer is, and what its open transaction holds."""

    __slots__ = ("error", "partitions", "started", "state", "transactional_id")

    def __init__(self, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.state = TxnState.UNINITIALIZED
        self.error: BaseException | None = None
        # Partitions the coordinator has added to the open transaction.
        self.partitions: set[TopicPartition] = set()
        # The coordinator knows of this transaction (a partition or a group was added):
        # only then does ending it need an EndTxn.
        self.started = False

    def __repr__(self) -> str:
        return f"TransactionState({self.transactional_id!r}, {self.state.value})"

    @property
    def failed(self) -> bool:
        return self.state in (TxnState.ABORTABLE_ERROR, TxnState.FATAL_ERROR)

    def transition(self, target: TxnState) -> None:
        """Move to ``target``, or IllegalTransactionState naming both states."""
        if target is not TxnState.FATAL_ERROR and self.state not in VALID_PREVIOUS[target]:
            raise IllegalTransactionState(
                f"transactional.id {self.transactional_id}: cannot go from {self.state.value} "
                f"to {target.value}"
            )
        self.state = target
        if target in (TxnState.READY, TxnState.INITIALIZING):
            self.error = None
            self.partitions.clear()
            self.started = False

    # --- what the producer's methods check ---------------------------------------------

    def raise_if_failed(self) -> None:
        """Raise the error that stopped the transaction (a new exception of its class,
        chained to it), saying what the caller must do now."""
        if self.state is TxnState.FATAL_ERROR:
            what = "the producer cannot continue and must be closed"
        elif self.state is TxnState.ABORTABLE_ERROR:
            what = "the transaction cannot commit: call abort_transaction()"
        else:
            return
        error = self.error
        cls = type(error) if isinstance(error, KafkaError) else IllegalTransactionState
        raise cls(f"{what} ({error})") from error

    def check_send(self) -> None:
        """Every record of a transactional producer: only inside a transaction."""
        if self.state is TxnState.IN_TRANSACTION:
            return
        self.raise_if_failed()
        raise IllegalTransactionState(
            f"cannot send in state {self.state.value}: call "
            + (
                "init_transactions()"
                if self.state is TxnState.UNINITIALIZED
                else "begin_transaction()"
            )
            + " first"
        )

    def begin(self) -> None:
        self.raise_if_failed()
        if self.state is TxnState.UNINITIALIZED:
            raise IllegalTransactionState("call init_transactions() before begin_transaction()")
        self.transition(TxnState.IN_TRANSACTION)

    def in_transaction(self, method: str) -> None:
        """send_offsets_to_transaction and friends need an open, healthy transaction."""
        self.raise_if_failed()
        if self.state is not TxnState.IN_TRANSACTION:
            raise IllegalTransactionState(
                f"cannot {method} in state {self.state.value}: no transaction is open"
            )

    def begin_commit(self) -> bool:
        """Enter COMMITTING_TRANSACTION; False when a commit that timed out is resumed."""
        if self.state is TxnState.COMMITTING_TRANSACTION:
            return False
        self.raise_if_failed()
        self.transition(TxnState.COMMITTING_TRANSACTION)
        return True

    def begin_abort(self) -> bool:
        """Enter ABORTING_TRANSACTION; False when an abort that timed out is resumed."""
        if self.state is TxnState.ABORTING_TRANSACTION:
            return False
        if self.state is TxnState.FATAL_ERROR:
            self.raise_if_failed()
        self.transition(TxnState.ABORTING_TRANSACTION)
        return True

    # --- errors ---------------------------------------------------------------------------

    def abortable(self, error: BaseException) -> None:
        """The open transaction cannot commit any more (a fatal error stays fatal; an
        error while aborting is the abort's own business)."""
        if self.state in (
            TxnState.IN_TRANSACTION,
            TxnState.COMMITTING_TRANSACTION,
            TxnState.ABORTABLE_ERROR,
        ):
            if self.state is not TxnState.ABORTABLE_ERROR:
                self.error = error
            self.state = TxnState.ABORTABLE_ERROR

    def fatal(self, error: BaseException) -> None:
        if self.state is not TxnState.FATAL_ERROR:
            self.error = error
        self.state = TxnState.FATAL_ERROR

    def coordinator_failed(self, error: KafkaError) -> None:
        """A coordinator API's error that was not retried: fatal or abortable by its code."""
        if error.code in FATAL:
            self.fatal(error)
        else:
            self.abortable(error)

    def record_failed(self, error: BaseException) -> None:
        """A transactional batch was given up on: its records are not in the transaction,
        so the transaction must not commit (Kafka's Sender: abortable, or fatal for the
        codes that end the producer)."""
        if isinstance(error, TransactionAborted):
            return
        if isinstance(error, KafkaError) and error.code in _PRODUCE_FATAL:
            self.fatal(error)
        else:
            self.abortable(error)
