"""Sink side: check a DataFrame's columns at planning time, then produce its Arrow batches.

Columns follow Spark's Kafka sink: ``value`` (string or binary) is required; ``key``
(string or binary), ``topic`` (string), ``partition`` (int) and ``headers``
(array<struct<key string, value binary>>) are optional; other columns are ignored.
A ``topic`` option overrides the column.

With a ``FixedIdentity`` (exactlyOnce, the default) a rerun of the task sends the same
batches under the same producer id, epoch and sequences, and the leaders answer what
they already hold as duplicates: the batch boundaries are made a function of the rows
alone (linger off, every open batch closed at the end of each Arrow batch Spark hands
over, a topic's partition count known before its first row is placed). Without one,
delivery is at-least-once, as spark-sql-kafka's: a rerun sends the records again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import trio

from minibroker.client.idempotence import FixedIdentity
from minibroker.client.producer import BufferFull, Producer
from minibroker.client.spark.options import OptionError, WriteOptions
from minibroker.protocol.errors import InvalidProducerEpoch

_TEXT = ("string", "binary")
SINK_TYPES = {
    "value": _TEXT,
    "key": _TEXT,
    "topic": ("string",),
    "partition": ("int",),
    "headers": ("array<struct<key:string,value:binary>>", "array<struct<key:string,value:string>>"),
}


def check_sink_schema(fields: dict[str, str], options: WriteOptions) -> None:
    """``fields``: column name -> Spark simpleString type. Raise naming what is wrong."""
    lowered = {name.lower(): kind for name, kind in fields.items()}
    if "value" not in lowered:
        raise OptionError("the DataFrame to write needs a 'value' column (string or binary)")
    for name, allowed in SINK_TYPES.items():
        kind = lowered.get(name)
        if kind is not None and kind not in allowed:
            raise OptionError(f"column '{name}' is {kind}; the sink wants {' or '.join(allowed)}")
    if options.topic is None and "topic" not in lowered:
        raise OptionError("give the option 'topic' or a 'topic' column to say where rows go")


def produce_batches(
    options: WriteOptions,
    batches: Iterator[pa.RecordBatch],
    identity: FixedIdentity | None = None,
) -> int:
    """Send every row, wait for every ack (acks=all unless kafka.acks says otherwise).

    Returns the number of records acknowledged; raises the first failed send.
    """
    try:
        return trio.run(_produce, options, batches, identity)
    except InvalidProducerEpoch as exc:
        raise InvalidProducerEpoch(
            f"{exc.message}: a later batch of this query (or a later txnVersion of this "
            "txnAppId) was already written from this task's partition, so this rerun of an "
            "older one is refused rather than written"
        ) from None


async def _produce(
    options: WriteOptions, batches: Iterator[pa.RecordBatch], identity: FixedIdentity | None
) -> int:
    sent = 0
    pending: list[Any] = []
    placed: set[str] = set()  # topics whose partition count is known (identity only)
    async with Producer(config=options.client_config, identity=identity) as producer:
        while True:
            # Pulling the next batch from Spark blocks: do it in a thread so the sender
            # keeps shipping the previous batch's records meanwhile.
            batch = await trio.to_thread.run_sync(next, batches, None)
            if batch is None:
                break
            for record in _records(batch, options.topic):
                if identity is not None and record[0] not in placed:
                    # Placed now, not parked until metadata arrives and cut differently.
                    await producer.wait_for_partitions(record[0])
                    placed.add(record[0])
                try:
                    pending.append(producer.send_nowait(*record))
                except BufferFull:
                    pending.append(await producer.enqueue(*record))
            sent += batch.num_rows
            if identity is not None:
                producer.close_batches()
            pending = _raise_failures(pending)
            await trio.lowlevel.checkpoint()
        await producer.flush()
    _raise_failures(pending)
    return sent


def _raise_failures(handles: list[Any]) -> list[Any]:
    """Raise the first failed send; keep the ones still in flight."""
    left = []
    for handle in handles:
        if not handle.done():
            left.append(handle)
        elif handle.exception() is not None:
            raise handle.exception()
    return left


def _column(batch: pa.RecordBatch, name: str) -> list | None:
    for i, field in enumerate(batch.schema):
        if field.name.lower() == name:
            return batch.column(i).to_pylist()
    return None


def _records(batch: pa.RecordBatch, topic_option: str | None) -> Iterator[tuple]:
    """ProducerRecord's fields but the timestamp, per row, as a plain tuple (cheaper to build):
    ``producer.send_nowait(*fields)`` sends it."""
    n = batch.num_rows
    values = _column(batch, "value")
    keys = _column(batch, "key") or [None] * n
    partitions = _column(batch, "partition") or [None] * n
    topics = [topic_option] * n if topic_option else _column(batch, "topic")
    headers = _column(batch, "headers") or [None] * n
    for topic, value, key, partition, hdrs in zip(
        topics, values, keys, partitions, headers, strict=True
    ):
        if topic is None:
            raise ValueError("a row has a null 'topic' and no 'topic' option was given")
        if hdrs:
            hdrs = [(h["key"], h["value"]) for h in hdrs]
        yield topic, value, key, partition, hdrs
