"""The producer's background task: turns ready batches into Produce requests and acks into offsets.

One loop decides what to send (linger elapsed or batch full, a leader known, a free
in-flight slot on that broker); each request then runs as its own task so up to
``max.in.flight.requests.per.connection`` are outstanding per broker. Retriable
failures go back to the front of their partition after ``retry.backoff.ms`` and a
metadata refresh, until ``retries`` or ``delivery.timeout.ms`` runs out.

With ``enable.idempotence`` (client/idempotence.py) nothing is sent before the producer
has an id; a batch keeps its sequence across retries, and a retried batch goes out only
when no other batch of its partition is in flight, so retries never reorder.

With ``transactional.id`` (client/transactions.py) the id comes from init_transactions,
batches carry the transactional bit, a partition's batches wait until the coordinator
has added it to the open transaction, and a batch given up on makes the transaction
abortable instead of bumping the epoch here (the abort does that). None of it costs a
non-transactional producer anything per record.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import trio

from minibroker.client.accumulator import (
    DeliveryHandle,
    Parked,
    ParkedHandle,
    ProducerBatch,
    RecordAccumulator,
)
from minibroker.client.cluster import Cluster
from minibroker.client.idempotence import FixedIdentity, IdempotenceState
from minibroker.client.txn_state import TransactionAborted, TransactionState, TxnState
from minibroker.protocol import ApiKey
from minibroker.protocol.batch import TRANSACTIONAL_FLAG
from minibroker.protocol.errors import (
    ErrorCode,
    KafkaError,
    NetworkException,
    OutOfOrderSequenceNumber,
    RequestTimedOut,
    UnknownTopicOrPartition,
    error_class,
)

# Errors a leader answers after it appended the batch (acks=all timing out, or the ISR
# shrinking under it): the records may survive, so the batch's fate is unknown.
_WRITTEN_MAYBE = frozenset(
    {ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND}
)

_FIXED_HOLE = (
    "an earlier batch of this fixed producer identity was not delivered and its sequence "
    "cannot be skipped: the writer must start over (a rerun sends the same sequences)"
)


def now_ms() -> float:
    return time.monotonic() * 1000


class Sender:
    def __init__(
        self,
        config: dict[str, Any],
        cluster: Cluster,
        accumulator: RecordAccumulator,
        identity: FixedIdentity | None = None,
    ) -> None:
        self.cluster = cluster
        self.acc = accumulator
        accumulator.wake_sender = self.wake
        self.acks: int = config["acks"]
        self.request_timeout_ms: int = config["request.timeout.ms"]
        self.retries: int = config["retries"]
        self.backoff_ms: int = config["retry.backoff.ms"]
        self.max_in_flight: int = config["max.in.flight.requests.per.connection"]
        self.max_request_size: int = config["max.request.size"]
        self.max_block_ms: int = config["max.block.ms"]
        self.in_flight: dict[int, int] = defaultdict(int)
        self.in_flight_batches: set[ProducerBatch] = set()
        self.idempotence = IdempotenceState(identity) if config["enable.idempotence"] else None
        # A transactional producer's state (set by the Producer with its manager).
        self.txn: TransactionState | None = None
        self.txn_manager: Any = None
        self._attributes = 0
        self._in_flight_by_partition: dict[tuple[str, int], int] = defaultdict(int)
        self._init_running = False
        self._resolving = False
        self.parked: dict[str, tuple[Parked, float]] = {}
        self.space_freed = trio.Event()
        self._wakeup = trio.Event()
        self._metadata_needed = False
        self._metadata_running = False
        self._metadata_at = -1e18
        self._nursery: trio.Nursery | None = None

    def wake(self) -> None:
        self._wakeup.set()

    # --- what the producer asks of it -----------------------------------------------------

    async def flush(self) -> None:
        """Send everything queued so far without lingering; wait until each is acked or failed."""
        self.acc.begin_flush()
        self.wake()
        try:
            for parked, _ in list(self.parked.values()):
                await parked.placed.wait()
            for batch in self.acc.waiting_batches() + list(self.in_flight_batches):
                await batch.done.wait()
        finally:
            self.acc.end_flush()

    def abandon(self, reason: BaseException) -> None:
        """Fail every batch not yet finished (the producer is closing)."""
        for batch in self.acc.drain_all() + list(self.in_flight_batches):
            if not batch.done.is_set():
                batch.fail(reason)

    # --- the loop ---------------------------------------------------------------------------

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                now = now_ms()
                self._place_parked(now)
                for batch in self.acc.expired(now):
                    self._fail(batch, self._expiry_error(batch))
                ready, next_ms = self.acc.ready(now)
                if ready and self.txn is not None:
                    ready = self._txn_ready(ready)
                if ready and self.idempotence is not None and not self._producer_id_ready():
                    # Before a bump only batches whose fate is unknown may go, as they are.
                    batches = self.acc.batches
                    ready = (
                        [k for k in ready if batches[k][0].unresolved] if self._resolving else []
                    )
                sent = self._send_ready(ready) if ready else False
                if self.cluster.stale:  # metadata.max.age.ms: notice leader moves without an error
                    self._metadata_needed = True
                else:
                    next_ms = min(next_ms, self.cluster.expires_at * 1000)
                next_ms = min(next_ms, self._maybe_refresh_metadata(now))
                if sent:
                    await trio.lowlevel.checkpoint()
                    continue
                delay = max(0.0, (next_ms - now_ms()) / 1000)
                with trio.move_on_after(delay):
                    await self._wakeup.wait()
                self._wakeup = trio.Event()

    def _expiry_error(self, batch: ProducerBatch) -> BaseException:
        """A batch being retried ends with its last attempt's error (as one whose next
        backoff would pass the deadline does, in _retry_or_fail), whether the deadline
        is noticed there or here: which of the two sees it is a race with the loop's
        wake-up, and the caller should not see a different error for it."""
        if batch.last_error is not None:
            return batch.last_error
        age = now_ms() - batch.created_ms
        return RequestTimedOut(
            f"expiring {batch.count or len(batch.records)} record(s) for {batch.topic}-{batch.partition}:"
            f" {age:.0f} ms has passed since batch creation (delivery.timeout.ms)"
        )

    # --- idempotence ------------------------------------------------------------------------

    def _producer_id_ready(self) -> bool:
        """May sequenced batches go out now? Bumps the epoch or asks for an id first."""
        idem = self.idempotence
        self._resolving = False
        if self.txn is not None:
            # init_transactions gives the id; a hole made the transaction abortable and
            # its abort bumps the epoch: nothing of this epoch goes out meanwhile.
            return idem.has_producer_id and not idem.bump_needed
        if idem.bump_needed and idem.fixed:
            # No new epoch to move to: nothing after the hole may go out. The writer
            # fails and its rerun sends everything again from sequence 0.
            for batch in self.acc.drain_all():
                self._fail(batch, OutOfOrderSequenceNumber(_FIXED_HOLE))
            return False
        if idem.bump_needed:
            if self._unresolved_pending():
                # A batch that may have been written is resent first with its own epoch
                # and sequence, so the leader answers "duplicate" rather than storing it
                # again under the new epoch (Kafka's unresolved sequences).
                self._resolving = True
                return False
            if self.in_flight_batches:
                return False  # their answers may still resolve sequences of this epoch
            if idem.bump_epoch():
                self._restamp_waiting()
        if idem.has_producer_id:
            return True
        if not self._init_running:
            self._init_running = True
            self._nursery.start_soon(self._init_producer_id)
        return False

    def _unresolved_pending(self) -> bool:
        if any(b.unresolved for b in self.in_flight_batches):
            return True
        return any(b.unresolved for dq in self.acc.batches.values() for b in dq)

    def _restamp_waiting(self) -> None:
        """After a bump: batches already sequenced get new sequences, in their order."""
        idem = self.idempotence
        for key, dq in self.acc.batches.items():
            for batch in dq:
                if batch.base_sequence >= 0:
                    batch.restamp(
                        idem.producer_id, idem.epoch, idem.take_sequence(key, batch.count)
                    )

    async def _init_producer_id(self) -> None:
        idem = self.idempotence
        try:
            answer = await self.cluster.any_request(
                ApiKey.INIT_PRODUCER_ID,
                {"transactional_id": None, "producer_id": -1, "producer_epoch": -1},
            )
        except KafkaError as exc:
            if not exc.retriable:
                for batch in self.acc.drain_all():
                    self._fail(batch, exc)
            await trio.sleep(self.backoff_ms / 1000)
        else:
            idem.set_producer_id(answer["producer_id"], answer["producer_epoch"])
            self._restamp_waiting()
        finally:
            self._init_running = False
            self.wake()

    def _seal(self, batch: ProducerBatch, key: tuple[str, int]) -> None:
        idem = self.idempotence
        if idem is None or batch.sealed:
            batch.seal()
        else:
            sequence = idem.take_sequence(key, len(batch.records))
            batch.seal((idem.producer_id, idem.epoch, sequence), self._attributes)

    # --- transactions -----------------------------------------------------------------------

    def use_transactions(self, state: TransactionState, manager: Any) -> None:
        """Make this sender transactional (the Producer calls it before it runs)."""
        self.txn = state
        self.txn_manager = manager
        self._attributes = TRANSACTIONAL_FLAG

    def _txn_ready(self, ready: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """The ready partitions already in the open transaction. The others wait for
        AddPartitionsToTxn, asked here (one request at a time, for every partition that
        lacks it); after an abortable or fatal error nothing more is sent, and what
        waits fails with that error (Kafka's abortUndrainedBatches)."""
        state = self.txn
        if state.failed or state.state is TxnState.ABORTING_TRANSACTION:
            reason = state.error if state.failed else TransactionAborted("aborted before sent")
            for batch in self.acc.drain_all():
                self._fail(batch, reason)
            return []
        added = state.partitions
        if all(key in added for key in ready):
            return ready
        manager = self.txn_manager
        if not manager.adding:
            manager.adding = True
            self._nursery.start_soon(self._add_partitions)
        return [key for key in ready if key in added]

    async def _add_partitions(self) -> None:
        try:
            await self.txn_manager.add_partitions(
                lambda: [k for k, dq in self.acc.batches.items() if dq]
            )
        finally:
            self.wake()

    def abort_undrained(self, reason: BaseException) -> None:
        """Fail every batch not yet sent (an abort: they are not in any transaction)."""
        for batch in self.acc.drain_all():
            self._fail(batch, reason)

    def _earlier_pending(self, batch: ProducerBatch) -> bool:
        """Is a batch of the same partition with a lower sequence in flight or queued?"""
        key = (batch.topic, batch.partition)
        seq = batch.base_sequence
        for other in self.in_flight_batches:
            if (other.topic, other.partition) == key and 0 <= other.base_sequence < seq:
                return True
        return any(0 <= other.base_sequence < seq for other in self.acc.batches.get(key, ()))

    def _send_ready(self, ready: list[tuple[str, int]]) -> bool:
        by_node: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for key in ready:
            leader = self.cluster.leader(*key)
            if leader is None:
                self._metadata_needed = True
            else:
                by_node[leader].append(key)
        sent = False
        for node, keys in by_node.items():
            if self.in_flight[node] >= self.max_in_flight:
                continue
            batches: list[ProducerBatch] = []
            size = 0
            for key in keys:
                head = self.acc.batches[key][0]
                if (
                    self.idempotence is not None
                    and head.attempts
                    and self._in_flight_by_partition[key]
                ):
                    continue  # a retry goes out alone, after the partition's in-flight batches
                self._seal(head, key)
                if batches and size + len(head.payload) > self.max_request_size:
                    break
                batches.append(self.acc.pop(key))
                size += len(head.payload)
            if not batches:
                continue
            self.in_flight[node] += 1
            self.in_flight_batches.update(batches)
            for batch in batches:
                self._in_flight_by_partition[(batch.topic, batch.partition)] += 1
            self._nursery.start_soon(self._produce, node, batches)
            sent = True
        return sent

    # --- one request ------------------------------------------------------------------------

    def _request_body(self, batches: list[ProducerBatch]) -> dict:
        topics: dict[str, list[dict]] = defaultdict(list)
        for b in batches:
            topics[b.topic].append({"partition": b.partition, "records": b.payload})
            b.attempts += 1
        return {
            "acks": self.acks,
            "timeout_ms": self.request_timeout_ms,
            "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()],
        }

    async def _produce(self, node: int, batches: list[ProducerBatch]) -> None:
        body = self._request_body(batches)
        try:
            # A little longer than the broker's own timeout, so its REQUEST_TIMED_OUT wins.
            response = await self.cluster.request(
                node,
                ApiKey.PRODUCE,
                body,
                timeout=self.request_timeout_ms / 1000 + 1.0,
                expect_response=self.acks != 0,
            )
        except Exception as exc:
            for batch in batches:
                batch.unresolved = True  # no answer: it may or may not have been written
                self._retry_or_fail(batch, exc)
        else:
            self._handle_response(batches, response)
        finally:
            self.in_flight[node] -= 1
            self.in_flight_batches.difference_update(batches)
            for batch in batches:
                self._in_flight_by_partition[(batch.topic, batch.partition)] -= 1
            self.wake()

    def _handle_response(self, batches: list[ProducerBatch], response: dict) -> None:
        if self.acks == 0:
            for batch in batches:
                self._complete(batch, -1)
            return
        results = {
            (t["name"], p["partition"]): p for t in response["topics"] for p in t["partitions"]
        }
        for batch in batches:
            result = results.get((batch.topic, batch.partition))
            if result is None:
                self._retry_or_fail(
                    batch, NetworkException("the produce response left out this partition")
                )
            elif result["error_code"]:
                error = error_class(result["error_code"])(result.get("error_message") or "")
                # Appended but not acknowledged: written on the leader, maybe kept.
                batch.unresolved = result["error_code"] in _WRITTEN_MAYBE
                if (
                    result["error_code"] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
                    and self.idempotence is not None
                ):
                    self._out_of_order(batch, error)
                else:
                    self._retry_or_fail(batch, error)
            else:
                self._complete(batch, result["base_offset"])

    def _retry_or_fail(
        self, batch: ProducerBatch, error: BaseException, *, retriable: bool | None = None
    ) -> None:
        """Back to its partition after the backoff while retries and delivery.timeout.ms
        allow, else failed. ``retriable`` overrides the error's own verdict."""
        now = now_ms()
        if retriable is None:
            retriable = isinstance(error, KafkaError) and error.retriable
        if (
            retriable
            and batch.attempts <= self.retries
            and now + self.backoff_ms < batch.deadline_ms
        ):
            self._metadata_needed = True
            batch.last_error = error
            self.acc.reenqueue(batch, now + self.backoff_ms)
        else:
            self._fail(batch, error)

    def _out_of_order(self, batch: ProducerBatch, error: KafkaError) -> None:
        """Behind a batch being retried: wait for it. The oldest pending one: the leader
        has no state leading here (it was not written), so bump the epoch and resend."""
        if self.txn is not None:
            self._fail(batch, error)  # the transaction is abortable; its abort bumps
            return
        if not self._earlier_pending(batch):
            self.idempotence.request_bump()
        self._retry_or_fail(batch, error, retriable=True)

    def _complete(self, batch: ProducerBatch, base_offset: int) -> None:
        self.acc.release(batch)
        batch.complete(base_offset)
        self._space_freed()

    def _fail(self, batch: ProducerBatch, error: BaseException) -> None:
        if self.idempotence is not None and batch.base_sequence >= 0:
            # Its sequence may never reach the leader: a hole every later batch would be
            # refused for. A new epoch starts the sequences over.
            self.idempotence.request_bump()
        if self.txn is not None:
            self.txn.record_failed(error)
        self.acc.release(batch)
        batch.fail(error)
        self._space_freed()

    def _space_freed(self) -> None:
        self.space_freed.set()
        self.space_freed = trio.Event()

    # --- metadata -----------------------------------------------------------------------------

    def _maybe_refresh_metadata(self, now: float) -> float:
        """Start a refresh if one is needed and the backoff allows; returns when to look again."""
        if not self._metadata_needed or self._metadata_running:
            return float("inf")
        due = self._metadata_at + self.backoff_ms
        if now < due:
            return due
        self._metadata_needed = False
        self._metadata_running = True
        self._metadata_at = now
        self._nursery.start_soon(self._refresh_metadata)
        return float("inf")

    async def _refresh_metadata(self) -> None:
        try:
            await self.cluster.refresh(self.parked.keys())
        except KafkaError:
            self._metadata_needed = True  # try again after the backoff
        finally:
            self._metadata_running = False
            self.wake()

    def need_metadata(self) -> None:
        self._metadata_needed = True
        self.wake()

    # --- records sent before their topic was known ----------------------------------------

    def park(self, topic: str, item: tuple) -> DeliveryHandle:
        entry = self.parked.get(topic)
        if entry is None:
            entry = self.parked[topic] = (Parked(topic), now_ms())
            self.cluster.wanted.add(topic)
            self.need_metadata()
        handle = ParkedHandle(entry[0])
        entry[0].records.append((*item, handle))
        return handle

    def _place_parked(self, now: float) -> None:
        for topic, (parked, since) in list(self.parked.items()):
            count = self.cluster.partition_count(topic)
            if count is None:
                if now - since >= self.max_block_ms:
                    del self.parked[topic]
                    parked.error = self.cluster.topic_error(
                        topic,
                        f"topic '{topic}' not in the cluster metadata after {self.max_block_ms} ms",
                    )
                    parked.placed.set()
                else:
                    self._metadata_needed = True
                continue
            del self.parked[topic]
            for place, partition, record, nbytes, handle in parked.records:
                place(topic, partition, count, record, nbytes, handle)
            parked.placed.set()

    def fail_invalid_partition(self, topic: str, partition: int, count: int) -> ProducerBatch:
        """A finished, failed batch for a record aimed at a partition that does not exist."""
        batch = ProducerBatch(topic, partition, now_ms(), now_ms())
        batch.fail(
            UnknownTopicOrPartition(
                f"topic '{topic}' has {count} partitions, no partition {partition}"
            )
        )
        return batch
