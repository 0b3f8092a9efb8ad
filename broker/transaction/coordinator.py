"""The transaction coordinator: InitProducerId with a transactional id, AddPartitionsToTxn,
AddOffsetsToTxn (by its offsets partition), EndTxn, the transaction timeout, and the
completion of a commit or abort (Kafka's TransactionCoordinator).

Everything runs on the broker's trio thread, so a transaction needs no lock: a change is
prepared (``pending_state`` set: any other request meanwhile answers
CONCURRENT_TRANSACTIONS), written with acks=all to ``__transaction_state``, and applied
when the in-sync replicas have it. EndTxn answers once PrepareCommit/PrepareAbort is
written; the markers then go out (markers.py) and CompleteCommit/CompleteAbort is written
when every partition has its marker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.purgatory import Purgatory
from minibroker.broker.transaction.answers import chain, error_only, init_answer
from minibroker.broker.transaction.delayed import DelayedAddPartitions, TxnTimeout
from minibroker.broker.transaction.manager import TransactionStateManager
from minibroker.broker.transaction.markers import TransactionMarkerChannelManager
from minibroker.broker.transaction.metadata import (
    COMPLETED,
    MAX_EPOCH,
    NO_PRODUCER_EPOCH,
    TransactionMetadata,
    TxnState,
    TxnTransit,
)
from minibroker.protocol.errors import ErrorCode

S = TxnState
E = ErrorCode


class TransactionCoordinator:
    def __init__(
        self,
        config: Any,
        logger: Any,
        manager: TransactionStateManager,
        markers: TransactionMarkerChannelManager,
        timeout_purgatory: Purgatory,
        new_producer_id: Callable[[], dict | PendingResponse],
        busy_purgatory: Purgatory,
    ) -> None:
        self.config = config
        self.log = logger
        self.manager = manager
        self.transactions = manager.transactions
        self.markers = markers
        self.timeouts = timeout_purgatory
        # AddPartitionsToTxn waiting for its id's change in flight, watched by id.
        self.busy = busy_purgatory
        self._to_wake: list[str] = []
        # The same requests by id, for the follow-on write (_complete) to claim.
        self._waiting: dict[str, list[DelayedAddPartitions]] = {}
        # An InitProducerId answer for a fresh id (the controller's blocks, producer_ids.py).
        self.new_producer_id = new_producer_id
        self.timed_out = 0

    def _wall(self) -> int:
        return self.manager.wall_ms()

    # --- validation ---------------------------------------------------------------------

    def _lookup(
        self, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> tuple[TransactionMetadata | None, ErrorCode]:
        """Kafka's checks shared by AddPartitions, AddOffsets and EndTxn, in its order."""
        if not transactional_id:
            return None, E.INVALID_REQUEST
        error = self.manager.ownership_error(transactional_id)
        if error is not None:
            return None, error
        txn = self.transactions.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            return None, E.INVALID_PRODUCER_ID_MAPPING
        if producer_epoch != txn.producer_epoch:
            return None, E.PRODUCER_FENCED
        if txn.pending_state is not None:
            return None, E.CONCURRENT_TRANSACTIONS
        return txn, E.NONE

    # --- InitProducerId -----------------------------------------------------------------

    def init_producer_id(self, body: dict) -> dict | PendingResponse:
        transactional_id = body["transactional_id"]
        timeout_ms = body["transaction_timeout_ms"]
        if not transactional_id:
            return init_answer(E.INVALID_REQUEST, message="transactional.id must not be empty")
        limit = self.config["transaction.max.timeout.ms"]
        if not 0 < timeout_ms <= limit:
            return init_answer(
                E.INVALID_TRANSACTION_TIMEOUT,
                message=f"transaction.timeout.ms {timeout_ms} is outside (0, {limit}] "
                "(transaction.max.timeout.ms)",
            )
        error = self.manager.ownership_error(transactional_id)
        if error is not None:
            return init_answer(error)
        expected = None
        if body["producer_id"] >= 0:
            expected = (body["producer_id"], body["producer_epoch"])
        txn = self.transactions.get(transactional_id)
        if txn is not None:
            return self._init_existing(txn, timeout_ms, expected)

        def created(answer: dict) -> dict | PendingResponse:
            if answer["error_code"]:
                return answer
            known = self.transactions.get(transactional_id)
            if known is None:
                if self.manager.ownership_error(transactional_id) is not None:
                    return init_answer(E.NOT_COORDINATOR)
                known = self.transactions[transactional_id] = TransactionMetadata(
                    transactional_id,
                    self.manager.partition_for(transactional_id),
                    answer["producer_id"],
                    NO_PRODUCER_EPOCH,
                    timeout_ms,
                    self._wall(),
                )
            return self._init_existing(known, timeout_ms, expected)

        return chain(self.new_producer_id(), created)

    def _init_existing(
        self, txn: TransactionMetadata, timeout_ms: int, expected: tuple[int, int] | None
    ) -> dict | PendingResponse:
        if txn.pending_state is not None:
            return init_answer(E.CONCURRENT_TRANSACTIONS)
        if expected is not None and not _is_valid_producer(txn, expected):
            return init_answer(E.PRODUCER_FENCED)
        state = txn.state
        if state in (S.PREPARE_COMMIT, S.PREPARE_ABORT, S.DEAD):
            return init_answer(E.CONCURRENT_TRANSACTIONS)
        if state in (S.ONGOING, S.PREPARE_EPOCH_FENCE):
            # A new producer for this id while a transaction is open: fence the old one
            # and abort its transaction; the new one retries until the abort completes.
            if state is S.ONGOING:
                txn.fence_producer_epoch()
                self.timeouts.cancel_for_key(txn.transactional_id)
            result = self._end(txn, commit=False)
            return chain(
                result,
                lambda a: init_answer(E.parse(a["error_code"]) or E.CONCURRENT_TRANSACTIONS),
            )
        if expected is not None and expected != (txn.producer_id, txn.producer_epoch):
            # A retry whose answer was lost: the bump already happened (KIP-360).
            return init_answer(E.NONE, txn.producer_id, txn.producer_epoch)
        if txn.producer_epoch >= MAX_EPOCH:
            return chain(self.new_producer_id(), lambda a: self._bump(txn, timeout_ms, a))
        return self._bump(txn, timeout_ms, None)

    def _bump(self, txn: TransactionMetadata, timeout_ms: int, rotated: dict | None) -> Any:
        if rotated is not None and rotated["error_code"]:
            return rotated
        if txn.pending_state is not None or txn.state not in COMPLETED:
            return init_answer(E.CONCURRENT_TRANSACTIONS)
        new_id = rotated["producer_id"] if rotated is not None else -1
        transit = txn.prepare_epoch_bump(timeout_ms, self._wall(), new_id)
        return self._write(
            txn,
            [transit],
            lambda code: (
                init_answer(code, transit.producer_id, transit.producer_epoch)
                if code is E.NONE
                else init_answer(code)
            ),
        )

    # --- AddPartitionsToTxn / AddOffsetsToTxn --------------------------------------------

    def add_partitions(
        self, transactional_id: str, producer_id: int, epoch: int, partitions: set[tuple[str, int]]
    ) -> ErrorCode | PendingResponse:
        """Answers the one code for every partition (Kafka's handleAddPartitionsToTransaction);
        a busy id (the previous transaction completing) is waited for (DelayedAddPartitions)."""

        wait_ms = self.config["add.partitions.to.txn.retry.backoff.max.ms"]
        if wait_ms <= 0 or not self._busy(transactional_id, producer_id, epoch):
            return self._add_partitions(transactional_id, producer_id, epoch, partitions)
        op = DelayedAddPartitions(
            lambda: self._busy(transactional_id, producer_id, epoch),
            lambda: self._add_partitions(transactional_id, producer_id, epoch, partitions),
            wait_ms,
        )
        op.request = (producer_id, epoch, frozenset(partitions))
        if not self.busy.try_complete_else_watch(op, (transactional_id,)):
            self._waiting.setdefault(transactional_id, []).append(op)
        return op.response.body if op.response.body is not None else op.response

    def _busy(self, transactional_id: str, producer_id: int, epoch: int) -> bool:
        """AddPartitionsToTxn would be answered CONCURRENT_TRANSACTIONS now."""
        txn, error = self._lookup(transactional_id, producer_id, epoch)
        if txn is None:
            return error is E.CONCURRENT_TRANSACTIONS
        return txn.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT)

    def _wake(self, transactional_id: str) -> None:
        """Try the AddPartitionsToTxn waiting on the id. Not re-entered: a waiter handled
        here may write, and an acks=all write a one-replica log has at once calls back
        here; that id's turn comes once this one's check is done."""
        self._to_wake.append(transactional_id)
        if len(self._to_wake) > 1:
            return
        while self._to_wake:
            transactional_id = self._to_wake[0]
            self.busy.check_and_complete(transactional_id)
            if waiting := self._waiting.get(transactional_id):
                waiting[:] = [op for op in waiting if not op.is_completed]
                if not waiting:
                    del self._waiting[transactional_id]
            del self._to_wake[0]

    def _add_partitions(
        self, transactional_id: str, producer_id: int, epoch: int, partitions: set[tuple[str, int]]
    ) -> ErrorCode | PendingResponse:
        txn, error = self._lookup(transactional_id, producer_id, epoch)
        if txn is None:
            return error
        if txn.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return E.CONCURRENT_TRANSACTIONS
        if txn.state is S.PREPARE_EPOCH_FENCE or txn.state is S.DEAD:
            return E.PRODUCER_FENCED
        if txn.state is S.ONGOING and partitions <= txn.partitions:
            return E.NONE
        begins = txn.state in COMPLETED
        transit = txn.prepare_add_partitions(partitions, self._wall())

        def written(code: ErrorCode) -> ErrorCode:
            if code is E.NONE and begins:
                self._watch_timeout(txn)
            return code

        return self._write(txn, [transit], written)

    def _watch_timeout(self, txn: TransactionMetadata, delay_ms: int | None = None) -> None:
        op = TxnTimeout(self, txn, txn.timeout_ms if delay_ms is None else max(delay_ms, 0))
        self.timeouts.try_complete_else_watch(op, (txn.transactional_id,))

    # --- EndTxn --------------------------------------------------------------------------

    def end_txn(self, body: dict) -> dict | PendingResponse:
        txn, error = self._lookup(
            body["transactional_id"], body["producer_id"], body["producer_epoch"]
        )
        if txn is None:
            return error_only(error)
        commit = body["committed"]
        state = txn.state
        if state is S.ONGOING:
            self.timeouts.cancel_for_key(txn.transactional_id)
            return self._end(txn, commit)
        # A retry of what already happened is answered as done (or still completing).
        done = S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
        completing = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        if state is done:
            return error_only(E.NONE)
        if state is completing:
            return error_only(E.CONCURRENT_TRANSACTIONS)
        if state is S.PREPARE_EPOCH_FENCE:
            return error_only(E.PRODUCER_FENCED)
        return error_only(
            E.INVALID_TXN_STATE,
            f"{'commit' if commit else 'abort'} of transactional id "
            f"{txn.transactional_id!r} in state {state.value}",
        )

    def _end(self, txn: TransactionMetadata, commit: bool) -> dict | PendingResponse:
        """Ongoing (or fenced) -> PrepareCommit/PrepareAbort, then the markers."""
        state = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        if txn.pending_state is not None:
            return error_only(E.CONCURRENT_TRANSACTIONS)
        transit = txn.prepare(state, self._wall())

        def written(code: ErrorCode) -> dict:
            if code is E.NONE:
                self.log.info(
                    "txn_prepared",
                    transactional_id=txn.transactional_id,
                    state=state.value,
                    producer_id=txn.producer_id,
                    producer_epoch=txn.producer_epoch,
                    partitions=len(txn.partitions),
                )
                self.send_markers(txn)
            return error_only(code)

        return self._write(txn, [transit], written)

    def send_markers(self, txn: TransactionMetadata) -> None:
        """PrepareCommit/PrepareAbort is in the log: mark every partition, then complete."""
        partition = txn.partition
        epoch = self.manager.coordinator_epoch(partition)
        producer_epoch = txn.producer_epoch

        def still_wanted() -> bool:
            return (
                self.manager.owned.get(partition) == epoch
                and self.transactions.get(txn.transactional_id) is txn
                and txn.producer_epoch == producer_epoch
            )

        self.markers.add_markers(
            txn.transactional_id,
            txn.producer_id,
            producer_epoch,
            txn.state is S.PREPARE_COMMIT,
            epoch,
            txn.partitions,
            still_wanted,
            lambda: self._complete(txn),
        )

    def _complete(self, txn: TransactionMetadata) -> None:
        """CompleteCommit/CompleteAbort; with it, in the same append, the producer's next
        transaction when its AddPartitionsToTxn is already waiting (the follow-on).

        librdkafka begins the next transaction 1-2 ms after EndTxn is answered, while the
        markers take longer: written one after the other, CompleteCommit and the next
        Ongoing would cost two replicated writes in series. The log holds the same two
        records either way (the last one per id wins on replay), and the waiting requests
        are answered by that write, as their own would have answered them."""
        if txn.pending_state is not None or txn.state not in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return
        now = self._wall()
        transit = txn.prepare_complete(now)
        follow_on = PendingResponse()
        added = self._claim_waiting(txn, follow_on)
        transits = [transit]
        if added:
            transits.append(txn.after(transit).prepare_add_partitions(added, now))

        def written(code: ErrorCode) -> None:
            if code is E.NONE:
                self.log.info(
                    "txn_completed",
                    transactional_id=txn.transactional_id,
                    state=transit.state.value,
                    producer_id=txn.producer_id,
                    next_begun=bool(added),
                )
                if added:
                    self._watch_timeout(txn)
            else:  # still prepared: the next leader (or a reload) sends the markers again
                self.log.warning(
                    "txn_complete_write_failed",
                    transactional_id=txn.transactional_id,
                    error=code.name,
                )
            if added:
                follow_on.set(code)

        self._write(txn, transits, written)

    def _claim_waiting(
        self, txn: TransactionMetadata, outcome: PendingResponse
    ) -> set[tuple[str, int]]:
        """The partitions the id's current producer is waiting to add: each of its parked
        requests is claimed (answered by ``outcome``); another producer's are left to be
        refused as they stand once the id is free."""
        added: set[tuple[str, int]] = set()
        for op in self._waiting.pop(txn.transactional_id, ()):
            producer_id, epoch, partitions = op.request
            if (producer_id, epoch) == (txn.producer_id, txn.producer_epoch) and op.claim(outcome):
                added |= partitions
        return added

    # --- timeouts and loading ------------------------------------------------------------

    def abort_timed_out(self, txn: TransactionMetadata, epoch: int) -> None:
        """transaction.timeout.ms passed with the transaction still open: fence and abort
        (Kafka's abortTimedOutTransactions, KIP-360's epoch bump included). A fenced
        transaction whose abort could not be written is tried again later."""
        if self.transactions.get(txn.transactional_id) is not txn:
            return  # unloaded meanwhile
        if txn.producer_epoch != epoch or txn.state not in (S.ONGOING, S.PREPARE_EPOCH_FENCE):
            return
        retry_ms = self.config["transaction.abort.timed.out.transaction.cleanup.interval.ms"]
        if txn.pending_state is not None:
            self._watch_timeout(txn, retry_ms)
            return
        if txn.state is S.ONGOING:
            self.timed_out += 1
            self.log.info(
                "txn_timed_out",
                transactional_id=txn.transactional_id,
                producer_id=txn.producer_id,
                producer_epoch=epoch,
                timeout_ms=txn.timeout_ms,
            )
            txn.fence_producer_epoch()

        def written(answer: dict) -> dict:
            if answer["error_code"] and txn.state is S.PREPARE_EPOCH_FENCE:
                self._watch_timeout(txn, retry_ms)
            return answer

        chain(self._end(txn, commit=False), written)

    def partition_loaded(self, partition: int, transactions: dict[str, TxnTransit | None]) -> None:
        """A loaded partition's ids as the log left them; an open transaction gets what is
        left of its timeout, a prepared one its markers again (Kafka's loading completes
        in-flight commits and aborts)."""
        now = self._wall()
        for transactional_id, transit in transactions.items():
            if transit is None:
                continue
            txn = TransactionMetadata(
                transactional_id,
                partition,
                transit.producer_id,
                transit.producer_epoch,
                transit.timeout_ms,
                transit.last_update_ms,
            )
            txn.complete(transit)
            self.transactions[transactional_id] = txn
            if txn.state is S.ONGOING:
                self._watch_timeout(txn, txn.start_ms + txn.timeout_ms - now)
            elif txn.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                self.send_markers(txn)

    def partition_unloaded(self, txns: list[TransactionMetadata]) -> None:
        for txn in txns:
            self.timeouts.cancel_for_key(txn.transactional_id)
            self._wake(txn.transactional_id)  # now NOT_COORDINATOR

    # --- writes ------------------------------------------------------------------------------

    def _write(
        self,
        txn: TransactionMetadata,
        transits: list[TxnTransit],
        answer: Callable[[ErrorCode], Any],
    ) -> Any:
        """Write ``transits`` (one append); apply them in order when stored (abandon the
        prepared change if not); ``answer(code)``."""
        response = PendingResponse()

        def done(code: ErrorCode) -> None:
            if code is E.NONE:
                for transit in transits:
                    txn.complete(transit)
            else:
                txn.abandon()
            result = answer(code)
            if result is not None and response.body is None:
                response.set(result)
            # The id may no longer be busy: an AddPartitionsToTxn waiting on it proceeds.
            self._wake(txn.transactional_id)

        self.manager.write(txn, transits, done)
        return response.body if response.body is not None else response


def _is_valid_producer(txn: TransactionMetadata, expected: tuple[int, int]) -> bool:
    """Kafka's isValidProducerId: the id's current producer, or its previous one (a retry
    after the bump, KIP-360)."""
    producer_id, epoch = expected
    if producer_id == txn.producer_id and epoch == txn.producer_epoch:
        return True
    return producer_id in (txn.producer_id, txn.last_producer_id) and (
        epoch == txn.last_producer_epoch
    )
