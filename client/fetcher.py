"""Per-partition fetch state and the Fetch request/response handling for the consumer.

Each assigned partition has a *position* (next offset handed to the user) and a
*fetch offset* (next offset to ask the broker for); decoded records waiting
between the two sit in the partition's chunks. A seek bumps the partition's
epoch, which is how an answer to a fetch sent before the seek is recognised and
dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from itertools import count
from typing import Any

from minibroker.client.records import NO_HEADERS, ConsumerRecord, TopicPartition
from minibroker.protocol import CorruptBatch, iter_batches
from minibroker.protocol.batch import (
    CONTROL_FLAG,
    PRODUCER_FLAG,
    TRANSACTIONAL_FLAG,
    decode_rows,
    producer_fields,
    read_control_batch,
)
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
        "isolation_level": isolation_level(config),
        "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
    }


def isolation_level(config: Mapping[str, Any]) -> int:
    """The wire's isolation_level of a client's ``isolation.level`` (1: read_committed),
    which its Fetch and ListOffsets both carry, as Kafka's consumer sends them."""
    return 1 if config.get("isolation.level") == "read_committed" else 0


def to_consumer_records(
    topic: str,
    partition: int,
    buf: bytes,
    min_offset: int,
    aborted: list[dict] | None = None,
) -> list[ConsumerRecord]:
    """``decode_fetched``'s records only."""
    return decode_fetched(topic, partition, buf, min_offset, aborted)[0]


def decode_fetched(
    topic: str,
    partition: int,
    buf: bytes,
    min_offset: int,
    aborted: list[dict] | None = None,
) -> tuple[list[ConsumerRecord], int]:
    """Decode a fetched buffer into ConsumerRecords (the consumer's only per-record work):
    one tuple per record built straight from msgpack's row, nothing in between, and
    nothing inside it that the cyclic collector keeps tracking (see protocol.batch).

    Returns the records and the offset after the last whole batch (``min_offset`` if
    none): control batches (transaction markers) hold no record for the application but
    are read past. ``aborted`` (a read_committed answer's aborted_transactions) drops the
    records of aborted transactions as Kafka's consumer does: from an aborted
    transaction's first offset, that producer's transactional batches are skipped until
    its abort marker.
    """
    out: list[ConsumerRecord] = []
    next_offset = min_offset
    pending = sorted((a["first_offset"], a["producer_id"]) for a in aborted) if aborted else []
    aborting: set[int] = set()
    for pos, header in iter_batches(buf, verify=True, allow_partial=True):
        if header.next_offset <= min_offset:
            continue
        next_offset = header.next_offset
        if header.attributes & (CONTROL_FLAG | TRANSACTIONAL_FLAG) and _skipped(
            buf, pos, header, pending, aborting
        ):
            continue
        rows = decode_rows(buf, pos, header)
        base = header.base_offset
        first_ts = header.first_timestamp
        if base < min_offset:
            rows = rows[min_offset - base :]
            base = min_offset
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
    return out, next_offset


def _skipped(buf: bytes, pos: int, header: Any, pending: list, aborting: set[int]) -> bool:
    """Whether a transactional or control batch is kept from the application (Kafka's
    CompletedFetch.nextFetchedRecord: aborted producers are those whose aborted
    transaction started at or before this batch's last offset, until their abort marker)."""
    while pending and pending[0][0] <= header.last_offset:
        aborting.add(pending.pop(0)[1])
    if not header.attributes & PRODUCER_FLAG:
        return bool(header.attributes & CONTROL_FLAG)
    producer_id = producer_fields(buf, pos, header)[0]
    if header.attributes & CONTROL_FLAG:
        if aborting and not read_control_batch(buf, pos, header)[0]:
            aborting.discard(producer_id)  # its abort marker: what follows is not aborted
        return True
    return producer_id in aborting


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
        records, next_offset = decode_fetched(
            st.tp.topic, st.tp.partition, buf, sent_offset, result.get("aborted_transactions")
        )
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
    if next_offset > sent_offset:
        # Past every whole batch, markers and aborted transactions included; with nothing
        # left to hand out, the position moves past them too (as Kafka's consumer's).
        st.fetch_offset = next_offset
        if not st.chunks and st.position == sent_offset:
            st.position = next_offset
    elif st.max_bytes < max_partition_bytes_limit:
        # Only part of a batch came back: the batch is bigger than we asked for. Ask for more.
        st.max_bytes = min(st.max_bytes * 2, max_partition_bytes_limit)
    else:
        outcome.error = MessageTooLarge(
            f"a batch at offset {sent_offset} of {st.tp.topic}-{st.tp.partition} is larger than "
            f"fetch.max.bytes ({max_partition_bytes_limit})"
        )
    return outcome
