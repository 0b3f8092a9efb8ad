"""Per-partition record batches waiting to be sent: the producer's buffer.

Everything per record here is one tuple, a list append and two additions; the trio
Event, the encoding and the bookkeeping happen once per batch. A record is kept in its
wire shape (``(timestamp_delta, key, value[, headers])``, the delta from the batch's
first timestamp) from the moment it is batched: sealing is then one msgpack call, and a
record without headers holds only bytes and ints, which the cyclic garbage collector
stops tracking at its first pass instead of walking it in every older-generation
collection while the batch waits for its ack. The logic is pure (the
caller passes the time in milliseconds), so linger and batch.size rules are unit
tested without a broker or a clock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import trio

from minibroker.client.records import Headers, RecordMetadata
from minibroker.protocol import encode_rows
from minibroker.protocol.batch import restamp_producer

# msgpack framing per record ([ts_delta, key, value]) on top of key and value bytes.
RECORD_OVERHEAD = 10

# A record parked before its topic's partition count is known: (timestamp_ms, key, value,
# headers or None).
RecordTuple = tuple[int, bytes | None, bytes | None, Headers | None]


def record_size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    """Bytes a record adds to a batch (an estimate within a few bytes)."""
    size = RECORD_OVERHEAD + (len(key) if key else 0) + (len(value) if value else 0)
    for name, hvalue in headers:
        size += len(name) + (len(hvalue) if hvalue else 0) + 4
    return size


class ProducerBatch:
    """Records for one partition, sent and acknowledged as one unit."""

    __slots__ = (
        "accumulator",
        "acked_at",
        "attempts",
        "base_offset",
        "base_sequence",
        "closed",
        "count",
        "created_ms",
        "deadline_ms",
        "done",
        "error",
        "first_ts",
        "last_error",
        "max_ts",
        "partition",
        "payload",
        "records",
        "retry_at_ms",
        "size",
        "topic",
        "unresolved",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        created_ms: float,
        deadline_ms: float,
        accumulator: RecordAccumulator | None = None,
    ) -> None:
        # Where it waits to be sent (None: it never does, e.g. a batch failed at once).
        self.accumulator = accumulator
        self.topic = topic
        self.partition = partition
        # Wire rows: (timestamp - first_ts, key, value[, headers]).
        self.records: list[tuple[Any, ...]] = []
        self.first_ts = 0  # the first record's timestamp (ms), set by its append
        self.max_ts = 0
        self.size = 0
        self.count = 0
        self.created_ms = created_ms
        self.deadline_ms = deadline_ms
        self.retry_at_ms = 0.0
        self.attempts = 0
        self.payload: bytes | None = None
        self.done = trio.Event()
        self.base_offset = -1
        self.error: BaseException | None = None
        # What the attempt before a retry failed with: delivery.timeout.ms ends a batch
        # being retried with it (client/sender.py _expiry_error).
        self.last_error: BaseException | None = None
        self.acked_at = 0.0
        # An idempotent producer's sequence, set when the batch is first sent; -1: none.
        self.base_sequence = -1
        # Its last attempt may have been written (no answer, or a timeout after the append):
        # it must be resolved under its own epoch before any epoch bump re-stamps it.
        self.unresolved = False
        # Takes no more records and is ready to send (close_batches), though not full.
        self.closed = False

    @property
    def sealed(self) -> bool:
        return self.payload is not None

    def seal(self, producer: tuple[int, int, int] | None = None, attributes: int = 0) -> bytes:
        """Encode once (one msgpack call); retries resend the same bytes.

        ``producer``: (producer_id, epoch, base_sequence) of an idempotent producer;
        ``attributes``: TRANSACTIONAL_FLAG for a transactional one's.
        """
        if self.payload is None:
            self.count = len(self.records)
            if producer is None:
                self.payload = encode_rows(self.records, self.first_ts, self.max_ts)
            else:
                self.payload = encode_rows(
                    self.records,
                    self.first_ts,
                    self.max_ts,
                    producer_id=producer[0],
                    producer_epoch=producer[1],
                    base_sequence=producer[2],
                    attributes=attributes,
                )
                self.base_sequence = producer[2]
            self.records = []
        return self.payload

    def restamp(self, producer_id: int, epoch: int, base_sequence: int) -> None:
        """New producer fields for a sealed batch (after an epoch bump): CRC only."""
        buf = bytearray(self.payload)
        restamp_producer(buf, producer_id, epoch, base_sequence)
        self.payload = bytes(buf)
        self.base_sequence = base_sequence

    def complete(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self._finish()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._finish()

    def _finish(self) -> None:
        self.acked_at = time.monotonic()
        self.records = []
        self.done.set()

    async def delivered(self) -> None:
        """Wait until it is acked or failed. Someone is waiting for it now, so no batch
        lingers for company meanwhile (``linger.ms`` is for records nobody waits on)."""
        acc = self.accumulator
        if acc is None:
            await self.done.wait()
            return
        acc.begin_flush()
        acc.wake_sender()
        try:
            await self.done.wait()
        finally:
            acc.end_flush()

    def metadata(self, index: int) -> RecordMetadata:
        if self.error is not None:
            raise self.error
        offset = -1 if self.base_offset < 0 else self.base_offset + index
        return RecordMetadata(self.topic, self.partition, offset)


class Parked:
    """Records sent before their topic's partition count was known; placed by the sender."""

    __slots__ = ("error", "placed", "records", "topic")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.records: list[tuple[Any, ...]] = []
        self.placed = trio.Event()
        self.error: BaseException | None = None


class DeliveryHandle:
    """The outcome of one ``send_nowait``: ``await handle`` gives its RecordMetadata or raises."""

    __slots__ = ("_batch", "_index")
    # Set only on a ParkedHandle: one store less for each of the millions made per run.
    _parked: Parked | None = None

    def __init__(self, batch: ProducerBatch | None, index: int) -> None:
        self._batch = batch
        self._index = index

    def done(self) -> bool:
        if self._batch is None:
            return self._parked is not None and self._parked.error is not None
        return self._batch.done.is_set()

    def exception(self) -> BaseException | None:
        """The failure of a finished send (None on success); only valid once ``done()``."""
        if self._batch is None:
            return self._parked.error if self._parked else None
        return self._batch.error

    def result(self) -> RecordMetadata:
        if not self.done():
            raise RuntimeError("the record is not acknowledged yet: await the handle")
        if self._batch is None:
            raise self._parked.error
        return self._batch.metadata(self._index)

    @property
    def acked_at(self) -> float:
        """``time.monotonic()`` when the broker's answer arrived (for latency figures)."""
        return self._batch.acked_at if self._batch is not None else 0.0

    def _bind(self, batch: ProducerBatch, index: int) -> None:
        self._batch = batch
        self._index = index

    async def wait(self) -> RecordMetadata:
        if self._batch is None and self._parked is not None:
            await self._parked.placed.wait()
            if self._parked.error is not None:
                raise self._parked.error
        batch = self._batch
        if not batch.done.is_set():
            await batch.delivered()
        return batch.metadata(self._index)

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        batch = self._batch
        if batch is not None and batch.done.is_set():
            # The outcome is known: no coroutine and no trip through the scheduler. A
            # batch's handles are awaited one after another (``[await h for h in
            # handles]``) and all but the first find it acked: this is per record.
            return batch.metadata(self._index)
        return (yield from self.wait().__await__())


class ParkedHandle(DeliveryHandle):
    """A record sent before its topic's partition count was known: bound to its batch
    when the sender places it."""

    __slots__ = ("_parked",)

    def __init__(self, parked: Parked) -> None:
        super().__init__(None, 0)
        self._parked = parked


def _nothing() -> None:
    pass


class RecordAccumulator:
    def __init__(self, batch_size: int, linger_ms: int, delivery_timeout_ms: int) -> None:
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.batches: dict[tuple[str, int], deque[ProducerBatch]] = {}
        self.buffered_bytes = 0
        # Callers waiting for delivery now (flush, a send or a handle awaiting its ack):
        # while any is, no batch lingers for company.
        self._flushers = 0
        # Tells the sender to look again (it sets this): a caller has started waiting.
        self.wake_sender: Callable[[], None] = _nothing

    def begin_flush(self) -> None:
        """Make every batch ready at once until the matching :meth:`end_flush`."""
        self._flushers += 1

    def end_flush(self) -> None:
        self._flushers -= 1

    def append(
        self,
        topic: str,
        partition: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None,
        nbytes: int,
        now_ms: float | None = None,
    ) -> tuple[ProducerBatch, int, bool]:
        """Add a record; returns (batch, index in batch, whether a new batch was started).

        ``headers``: normalized (name, value) pairs, or None (or empty) for none.
        ``now_ms`` defaults to the monotonic clock, read only when a batch is started.
        """
        dq = self.batches.get((topic, partition))
        if dq is None:
            dq = self.batches[(topic, partition)] = deque()
        batch = dq[-1] if dq else None
        created = False
        if (
            batch is None
            or batch.payload is not None
            or (batch.size + nbytes > self.batch_size and batch.records)
            or batch.closed
        ):
            if now_ms is None:
                now_ms = time.monotonic() * 1000
            batch = ProducerBatch(topic, partition, now_ms, now_ms + self.delivery_timeout_ms, self)
            batch.first_ts = batch.max_ts = timestamp
            dq.append(batch)
            created = True
        elif timestamp > batch.max_ts:
            batch.max_ts = timestamp
        records = batch.records
        if headers:
            records.append((timestamp - batch.first_ts, key, value, headers))
        else:
            records.append((timestamp - batch.first_ts, key, value))
        batch.size += nbytes
        self.buffered_bytes += nbytes
        return batch, len(records) - 1, created

    def ready(self, now_ms: float) -> tuple[list[tuple[str, int]], float]:
        """Partitions whose first batch may be sent now, and when to look again otherwise."""
        ready = []
        next_ms = float("inf")
        linger = self.linger_ms
        full = self.batch_size
        flushing = self._flushers > 0
        for key, dq in self.batches.items():
            if not dq:
                continue
            head = dq[0]
            if head.retry_at_ms > now_ms:
                next_ms = min(next_ms, head.retry_at_ms)
            elif (
                flushing
                or len(dq) > 1  # the head is full: a newer batch was started behind it
                or head.size >= full
                or head.payload is not None  # a retry
                or head.closed
                or head.created_ms + linger <= now_ms
            ):
                ready.append(key)
            else:
                next_ms = min(next_ms, head.created_ms + linger)
        return ready, next_ms

    def close_batches(self) -> None:
        """End every open batch here: it goes out as it is and new records start the next.

        With linger.ms infinite this makes batch boundaries a function of what was
        appended and where the caller closed, never of timing: a rerun cuts the same
        batches, which a fixed producer identity needs for the leader to recognise them.
        """
        for dq in self.batches.values():
            if dq and dq[-1].payload is None and dq[-1].records:
                dq[-1].closed = True

    def pop(self, key: tuple[str, int]) -> ProducerBatch:
        """Take a partition's first batch for sending; it is encoded here, once."""
        batch = self.batches[key].popleft()
        batch.seal()
        return batch

    def reenqueue(self, batch: ProducerBatch, retry_at_ms: float) -> None:
        """Put a batch back at the front of its partition to retry after a backoff.

        An idempotent producer's batches go back in sequence order (Kafka's
        insertInSequenceOrder): two failed batches retried the wrong way round would be
        refused as out of order forever.
        """
        batch.retry_at_ms = retry_at_ms
        dq = self.batches.setdefault((batch.topic, batch.partition), deque())
        if batch.base_sequence < 0:
            dq.appendleft(batch)
            return
        index = 0
        for queued in dq:
            if queued.base_sequence < 0 or queued.base_sequence > batch.base_sequence:
                break
            index += 1
        dq.insert(index, batch)

    def expired(self, now_ms: float) -> list[ProducerBatch]:
        """Remove and return waiting batches whose delivery.timeout.ms has passed."""
        out = []
        for dq in self.batches.values():
            while dq and dq[0].deadline_ms <= now_ms:
                out.append(dq.popleft())
        return out

    def release(self, batch: ProducerBatch) -> None:
        """A batch is finished (acked or failed): its bytes no longer count against the buffer."""
        self.buffered_bytes -= batch.size

    def waiting_batches(self) -> list[ProducerBatch]:
        """Every batch not yet handed to the sender (oldest first per partition)."""
        return [b for dq in self.batches.values() for b in dq]

    def drain_all(self) -> list[ProducerBatch]:
        out = [b for dq in self.batches.values() for b in dq]
        self.batches.clear()
        return out

    @property
    def pending_batches(self) -> int:
        return sum(len(dq) for dq in self.batches.values())
