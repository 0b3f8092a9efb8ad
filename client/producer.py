"""The trio-native producer.

``await producer.send(...)`` waits for the ack; ``send_nowait`` / ``await enqueue``
return a DeliveryHandle at once so thousands of records share one batch, one
encode and one request. The per-record path is kept to a few list operations:
the throughput of a Python producer is decided right here.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import trio

from minibroker.client.accumulator import (
    RECORD_OVERHEAD,
    DeliveryHandle,
    RecordAccumulator,
    record_size,
)
from minibroker.client.background import ClusterClient
from minibroker.client.idempotence import FixedIdentity
from minibroker.client.partitioner import StickyPartitioner
from minibroker.client.records import (
    RecordFields,
    RecordMetadata,
    normalize_headers,
    takes_record,
    to_bytes,
)
from minibroker.client.sender import Sender
from minibroker.client.transactions import ConsumerGroupMetadata, TransactionManager
from minibroker.client.txn_state import TransactionAborted, TransactionState, TxnState
from minibroker.protocol.errors import MessageTooLarge, RequestTimedOut

_time_ns = time.time_ns


class BufferFull(Exception):
    """send_nowait found ``buffer.memory`` bytes already waiting; await enqueue() to wait instead."""


class ProducerClosed(RuntimeError):
    """The producer is not open (use ``async with Producer(...)``)."""


class Producer(ClusterClient):
    """``async with Producer("127.0.0.1:9092", acks=1) as p: await p.send("t", b"v")``.

    Settings use Kafka's names: pass ``config={"linger.ms": 5}`` or ``**{"linger.ms": 5}``.
    Closing the producer flushes what was sent before.

    ``identity``: a producer id and epoch the writer derived itself (client/idempotence.py),
    for a writer that may be rerun and must then send the very same batches: batches are
    cut only by batch.size, :meth:`close_batches` and flush (linger.ms does not apply),
    null-key records are spread from a start derived from the id, and a batch given up
    on fails what follows instead of bumping the epoch.

    ``transactional.id`` makes it Kafka's transactional producer: ``init_transactions()``
    once, then ``begin_transaction()``, sends (and ``send_offsets_to_transaction``), and
    ``commit_transaction()`` or ``abort_transaction()``. An error from commit other than
    a fatal one (ProducerFenced and the other codes in client/txn_state.py FATAL; the
    state is then FATAL_ERROR) means: call ``abort_transaction()`` and start over.
    """

    ROLE = "producer"

    def __init__(
        self,
        bootstrap: str | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        identity: FixedIdentity | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(bootstrap, config, **settings)
        if identity is not None and not self.config["enable.idempotence"]:
            raise ValueError("a fixed producer identity needs enable.idempotence=true")
        self._identity = identity
        self._acc = RecordAccumulator(
            self.config["batch.size"],
            math.inf if identity is not None else self.config["linger.ms"],
            self.config["delivery.timeout.ms"],
        )
        self._partitioner = StickyPartitioner(
            self.config["batch.size"], None if identity is None else identity.producer_id
        )
        self._max_request_size: int = self.config["max.request.size"]
        self._buffer_memory: int = self.config["buffer.memory"]
        self._max_block_s: float = self.config["max.block.ms"] / 1000
        self._sender: Sender | None = None
        self._txn: TransactionState | None = None
        self._txn_manager: TransactionManager | None = None
        # What the transactional producer did (ids, retries), for the caller's logging.
        self.transaction_events: deque[tuple[str, dict]] = deque(maxlen=1000)
        if self.config["transactional.id"]:
            if identity is not None:
                raise ValueError("a fixed producer identity cannot be transactional")
            self._txn = TransactionState(self.config["transactional.id"])
            # Checked per record only when transactional: the plain path stays as it was.
            self._append = self._append_in_txn

    # --- lifecycle ------------------------------------------------------------------------

    async def _started(self, nursery: trio.Nursery) -> None:
        self._sender = Sender(self.config, self._cluster, self._acc, self._identity)
        if self._txn is not None:
            self._txn_manager = TransactionManager(
                self.config, self._cluster, self._sender.idempotence, self._txn, self._txn_event
            )
            self._sender.use_transactions(self._txn, self._txn_manager)
        await nursery.start(self._sender.run)

    async def __aexit__(self, *exc_info: Any) -> None:
        try:
            if exc_info[1] is None and self._sender is not None:
                await self.flush()
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close without flushing: what is still unsent fails with RequestTimedOut."""
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.abandon(RequestTimedOut("the producer was closed before the record was sent"))
        await super().aclose()

    def _open(self) -> Sender:
        if self._sender is None:
            raise ProducerClosed("the producer is not open: use 'async with Producer(...) as p'")
        return self._sender

    # --- sending ------------------------------------------------------------------------------

    @takes_record
    async def send(self, fields: RecordFields) -> RecordMetadata:
        """Send one record and wait for the broker's ack (per ``acks``)."""
        handle = await self.enqueue(*fields)
        return await handle  # waiting for it ends lingering (ProducerBatch.delivered)

    @takes_record
    async def enqueue(self, fields: RecordFields) -> DeliveryHandle:
        """Like send_nowait, but waits (up to ``max.block.ms``) for metadata or buffer space."""
        sender = self._sender
        if sender is None:  # not self._open() each time: one call less per record
            sender = self._open()
        topic, _, _, partition, _, _ = fields
        if partition is None and topic not in self._cluster.topics:
            await self.wait_for_partitions(topic)
        elif partition is not None and 0 < (self._cluster.partition_count(topic) or 0) <= partition:
            await self._wait_for_partition(topic, partition)
        if self._acc.buffered_bytes >= self._buffer_memory:
            with trio.move_on_after(self._max_block_s):
                while self._acc.buffered_bytes >= self._buffer_memory:
                    await sender.space_freed.wait()
        handle, created = self._append(fields)
        if created:
            await trio.lowlevel.checkpoint()  # once per batch: let the sender ship the last one
        return handle

    @takes_record
    def send_nowait(self, fields: RecordFields) -> DeliveryHandle:
        """Queue a record without waiting; the sender runs when the caller next yields to trio.

        Raises BufferFull when ``buffer.memory`` bytes are already waiting.
        """
        if self._sender is None:  # not self._open(): one call less per record
            self._open()
        if self._acc.buffered_bytes >= self._buffer_memory:
            raise BufferFull(
                f"{self._acc.buffered_bytes} bytes are waiting to be sent (buffer.memory="
                f"{self._buffer_memory}): await flush() or use enqueue()"
            )
        return self._append(fields)[0]

    def _append(self, fields: RecordFields) -> tuple[DeliveryHandle, bool]:
        topic, value, key, partition, headers, timestamp = fields
        if type(value) is not bytes:
            value = to_bytes(value, "value")
        if key is not None and type(key) is not bytes:
            key = to_bytes(key, "key")
        if timestamp is None:
            timestamp = _time_ns() // 1_000_000
        if headers:
            hdrs = normalize_headers(headers)
            nbytes = record_size(key, value, hdrs)
        else:
            hdrs = None  # no per-record list: the batched row holds only bytes and ints
            nbytes = RECORD_OVERHEAD + (len(value) if value else 0) + (len(key) if key else 0)
        if nbytes > self._max_request_size:
            raise MessageTooLarge(
                f"the record is about {nbytes} bytes, larger than max.request.size "
                f"({self._max_request_size})"
            )
        parts = self._cluster.topics.get(topic)
        if not parts:
            record = (timestamp, key, value, hdrs)
            return self._sender.park(topic, (self._place, partition, record, nbytes)), False
        count = len(parts)
        if partition is None:
            partition = self._partitioner.partition(topic, key, count, nbytes)
        elif not 0 <= partition < count:
            return DeliveryHandle(
                self._sender.fail_invalid_partition(topic, partition, count), 0
            ), False
        batch, index, created = self._acc.append(
            topic, partition, timestamp, key, value, hdrs, nbytes
        )
        if created:
            self._sender.wake()
        return DeliveryHandle(batch, index), created

    def _append_in_txn(self, fields: RecordFields) -> tuple[DeliveryHandle, bool]:
        self._txn.check_send()
        return Producer._append(self, fields)

    def _place(
        self,
        topic: str,
        partition: int | None,
        count: int,
        record: tuple,
        nbytes: int,
        handle: DeliveryHandle,
    ) -> None:
        """Put a parked record into its batch once the topic's partition count is known."""
        if partition is None:
            partition = self._partitioner.partition(topic, record[1], count, nbytes)
        elif not 0 <= partition < count:
            handle._bind(self._sender.fail_invalid_partition(topic, partition, count), 0)
            return
        batch, index, _ = self._acc.append(topic, partition, *record, nbytes)
        handle._bind(batch, index)

    async def flush(self) -> None:
        """Send everything queued so far without lingering, and wait until each is acked or failed."""
        await self._open().flush()

    def close_batches(self) -> None:
        """Send every partially filled batch as it is, without waiting for acks; records
        sent after this start new batches."""
        self._open()
        self._acc.close_batches()
        self._sender.wake()

    async def wait_for_partitions(self, topic: str) -> int:
        """The topic's partition count, waiting up to max.block.ms for its metadata (as
        Kafka's partitionsFor does)."""
        self._open()
        if topic not in self._cluster.topics:
            await self._cluster.wait_for_topic(
                topic, self._max_block_s, self.config["retry.backoff.ms"] / 1000
            )
        return self._cluster.partition_count(topic)

    async def _wait_for_partition(self, topic: str, partition: int) -> None:
        """A partition past the count this producer knows may have just been added
        (CreatePartitions): refresh the metadata until it is there, up to max.block.ms, as
        Kafka's waitOnMetadata does; past that the record fails (no such partition)."""
        backoff = self.config["retry.backoff.ms"] / 1000
        with trio.move_on_after(self._max_block_s):
            while (self._cluster.partition_count(topic) or 0) <= partition:
                await self._cluster.refresh([topic])
                if (self._cluster.partition_count(topic) or 0) > partition:
                    break
                await trio.sleep(backoff)

    def partitions_for(self, topic: str) -> int | None:
        """Partition count from the metadata this producer has (None: not known yet)."""
        return self._cluster.partition_count(topic) if self._cluster else None

    # --- transactions (Kafka's transactional producer API) ---------------------------------------

    def _txn_event(self, event: str, **fields: Any) -> None:
        self.transaction_events.append((event, fields))

    def _transactional(self) -> tuple[TransactionState, TransactionManager]:
        self._open()
        if self._txn is None:
            raise ValueError("this producer has no transactional.id: set it to use transactions")
        return self._txn, self._txn_manager

    @property
    def transaction_state(self) -> str | None:
        """Kafka's TransactionManager state (READY, IN_TRANSACTION, ABORTABLE_ERROR, ...);
        None for a producer without transactional.id."""
        return None if self._txn is None else self._txn.state.value

    async def init_transactions(self) -> None:
        """Get this transactional.id's producer id and a new epoch: the coordinator fences
        every earlier producer with the same id and aborts what it left open. Call once,
        before the first transaction (again after a RequestTimedOut to resume)."""
        state, manager = self._transactional()
        if state.state is not TxnState.INITIALIZING:
            state.transition(TxnState.INITIALIZING)
        await manager.init_producer_id()
        state.transition(TxnState.READY)

    def begin_transaction(self) -> None:
        """Open a transaction (locally: the coordinator hears of it with its first
        partition or offsets)."""
        state, _ = self._transactional()
        state.begin()

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[tuple[str, int], int],
        group_metadata: ConsumerGroupMetadata | tuple | str,
    ) -> None:
        """Commit ``offsets`` (the next offset to consume, per partition) for the consumer's
        group together with this transaction: a read_committed application's
        consume-transform-produce step happens exactly once. ``group_metadata`` is the
        consumer's ``group_metadata()`` (a bare group id skips KIP-447's member fencing)."""
        state, manager = self._transactional()
        state.in_transaction("send offsets")
        if isinstance(group_metadata, str):
            group = ConsumerGroupMetadata(group_metadata)
        else:
            group = ConsumerGroupMetadata(*group_metadata)
        await manager.send_offsets(offsets, group)

    async def commit_transaction(self) -> None:
        """Flush the transaction's records, then commit it: read_committed consumers see
        all of it, and the offsets sent with it become the group's. Raises the error that
        made it abortable (then call abort_transaction()), or a fatal one."""
        state, manager = self._transactional()
        state.begin_commit()
        await self._sender.flush()
        state.raise_if_failed()
        await manager.end_txn(commit=True)
        state.transition(TxnState.READY)

    async def abort_transaction(self) -> None:
        """Drop the open transaction: records not sent yet fail with TransactionAborted,
        the rest are written but aborted (read_committed consumers skip them), offsets
        sent with it are discarded. The producer is READY for the next one."""
        state, manager = self._transactional()
        state.begin_abort()
        self._sender.abort_undrained(TransactionAborted("the transaction was aborted"))
        await self._sender.flush()
        await manager.end_txn(commit=False)
        if self._sender.idempotence.bump_needed:
            # A batch was given up on after it took a sequence: a new epoch restarts the
            # sequences (KIP-360's InitProducerId with the current id and epoch).
            state.transition(TxnState.INITIALIZING)
            await manager.init_producer_id(bump=True)
        state.transition(TxnState.READY)
