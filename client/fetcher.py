"""Per-partition fetch state and the Fetch request/response handling for the consumer.

Each assigned partition has a *position* (next offset handed to the user) and a
*fetch offset* (next offset to ask the broker for); decoded records waiting
between the two sit in the partition's chunks. A seek bumps the partition's
epoch, which is how an answer to a fetch sent before the seek is recognised and
dropped.
"""

from __future__ import annotations

from collections import deque
from itertools import count
from typing import Any

from minibroker.client.records import NO_HEADERS, ConsumerRecord, TopicPartition
from minibroker.protocol import CorruptBatch, batch_rows
from minibroker.protocol.errors import (
    CorruptMessage,
    ErrorCode,
    KafkaError,
    MessageTooLarge,
    error_class,
)

_new_tuple = tuple.__new__

# Errors after which the client's metadata is probably wrong.
METADATA_ERRORS = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.KAFKA_STORAGE_ERROR,
    }
)


class PartitionState:
    __slots__ = (
        "chunks",
        "epoch",
        "fetch_offset",
        "fetching",
        "high_watermark",
        "max_bytes",
        "position",
        "reset",
        "tp",
    )

    def __init__(self, tp: TopicPartition, max_bytes: int) -> None:
        self.tp = tp
        self.position: int | None = None
        self.fetch_offset: int | None = None
        self.reset: str | None = None  # "earliest" / "latest" when a reset is pending
        self.chunks: deque[list[ConsumerRecord]] = deque()
        self.epoch = 0
        self.fetching = False
        self.high_watermark = -1
        self.max_bytes = max_bytes

    def seek(self, offset: int | None, reset: str | None = None) -> None:
        self.position = self.fetch_offset = offset
        self.reset = reset
        self.chunks.clear()
        self.epoch += 1

    @property
    def fetchable(self) -> bool:
        """Room for one more response ahead of what the user has read: a one-deep prefetch."""
        return self.fetch_offset is not None and not self.fetching and len(self.chunks) < 2


def fetch_body(states: list[PartitionState], config: dict[str, Any]) -> dict:
    by_topic: dict[str, list[dict]] = {}
    for st in states:
        by_topic.setdefault(st.tp.topic, []).append(
            {
                "partition": st.tp.partition,
                "fetch_offset": st.fetch_offset,
                "partition_max_bytes": st.max_bytes,
            }
        )
    return {
        "max_wait_ms": config["fetch.max.wait.ms"],
        "min_bytes": config["fetch.min.bytes"],
        "max_bytes": config["fetch.max.bytes"],
        "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
    }


def to_consumer_records(
    topic: str, partition: int, buf: bytes, min_offset: int
) -> list[ConsumerRecord]:
    """Decode a fetched buffer into ConsumerRecords (the consumer's only per-record work):
    one tuple per record built straight from msgpack's row, nothing in between, and
    nothing inside it that the cyclic collector keeps tracking (see protocol.batch)."""
    out: list[ConsumerRecord] = []
    for base, first_ts, rows in batch_rows(buf, min_offset=min_offset):
        out += [
            _new_tuple(
                ConsumerRecord,
                (
                    topic,
                    partition,
                    offset,
                    first_ts + row[0],
                    row[1],
                    row[2],
                    row[3] if len(row) == 4 else NO_HEADERS,
                ),
            )
            for offset, row in zip(count(base), rows)
        ]
    return out


class FetchOutcome:
    """What one partition's part of a Fetch response means for the consumer."""

    __slots__ = ("error", "needs_metadata", "out_of_range")

    def __init__(self) -> None:
        self.error: KafkaError | None = None
        self.needs_metadata = False
        self.out_of_range = False


def apply_partition_result(
    st: PartitionState, result: dict, sent_offset: int, max_partition_bytes_limit: int
) -> FetchOutcome:
    """Decode records into the state's chunks and advance its fetch offset; report errors."""
    outcome = FetchOutcome()
    code = result["error_code"]
    if code:
        error = error_class(code)(result.get("error_message") or f"{st.tp.topic}-{st.tp.partition}")
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            outcome.out_of_range = True
        elif code in METADATA_ERRORS:
            outcome.needs_metadata = True
        elif not error.retriable:
            outcome.error = error
        return outcome
    st.high_watermark = result["high_watermark"]
    buf = result["records"]
    if not buf:
        return outcome
    try:
        records = to_consumer_records(st.tp.topic, st.tp.partition, buf, sent_offset)
    except CorruptBatch as exc:
        # Kafka's CorruptRecordException: one line for the user, and no more fetches of
        # this partition until they seek (past the bad batch, if they choose to).
        st.fetch_offset = None
        outcome.error = CorruptMessage(
            f"{st.tp.topic}-{st.tp.partition} at offset {sent_offset}: {exc}; "
            "seek() past it to continue"
        )
        return outcome
    if records:
        st.chunks.append(records)
        st.fetch_offset = records[-1].offset + 1
    elif st.max_bytes < max_partition_bytes_limit:
        # Only part of a batch came back: the batch is bigger than we asked for. Ask for more.
        st.max_bytes = min(st.max_bytes * 2, max_partition_bytes_limit)
    else:
        outcome.error = MessageTooLarge(
            f"a batch at offset {sent_offset} of {st.tp.topic}-{st.tp.partition} is larger than "
            f"fetch.max.bytes ({max_partition_bytes_limit})"
        )
    return outcome
