"""The trio-native producer.

``await producer.send(...)`` waits for the ack; ``send_nowait`` / ``await enqueue``
return a DeliveryHandle at once so thousands of records share one batch, one
encode and one request. The per-record path is kept to a few list operations:
the throughput of a Python producer is decided right here.
"""

from __future__ import annotations

import math
import time
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

    # --- lifecycle ------------------------------------------------------------------------

    async def _started(self, nursery: trio.Nursery) -> None:
        self._sender = Sender(self.config, self._cluster, self._acc, self._identity)
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
        return await self._open().deliver(handle)

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
