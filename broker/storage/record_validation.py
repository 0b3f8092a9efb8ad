"""The leader's check of every record a producer sends: Kafka's LogValidator.

``Log._validate`` checks each batch's header and CRC, which is all a follower needs (it
copies what its leader accepted). A producer's batch can still lie about its records
with a valid CRC, so before anything is written the leader walks every record of every
batch (``validate_records``) and refuses the partition's whole produce at the first
lie, as Kafka does:

- a stock client's v2 batch (KAFKA_FLAG): protocol/kafka/record_stream.py's walk, in a
  fixed decompression window for compressed ones; its header must match ours (the
  native listener could send a KAFKA_FLAG batch of its own making, so its CRC-32C and
  flags are checked here unless the Kafka listener just checked them: CheckedBatches);
- our own msgpack batch: protocol/batch.py ``walk_rows`` (each record's shape and
  types, its timestamp and key), in C where the extension is built.

Rules from the topic: timestamps within message.timestamp.before/after.max.ms of the
broker's clock (INVALID_TIMESTAMP), a key on every record of a compacted topic
(INVALID_RECORD), each with Kafka's per-record errors (``record_errors``).
"""

from __future__ import annotations

from typing import Any

from minibroker.protocol.batch import (
    KAFKA_FLAG,
    PRODUCER_FLAG,
    BatchHeader,
    CheckedBatches,
    CorruptBatch,
    producer_fields,
    unwrap_kafka_batch,
    walk_rows,
)
from minibroker.protocol.errors import ErrorCode, KafkaError, error_class
from minibroker.protocol.kafka import records as kafka_records
from minibroker.protocol.kafka.record_stream import (
    NO_LIMIT,
    RecordDefect,
    RecordError,
    records_refused,
    rule_error,
    walk_records,
)


def refused(
    code: ErrorCode, message: str, record_errors: list[RecordError] | None = None
) -> KafkaError:
    """The KafkaError a produce is answered with; ``record_errors`` rides along for
    Produce v8+ (KIP-467)."""
    exc = error_class(code)(message)
    exc.record_errors = record_errors or []  # type: ignore[attr-defined]
    return exc


def validate_records(
    buf: bytes | bytearray | memoryview,
    batches: list[tuple[int, BatchHeader]],
    *,
    now_ms: int,
    before_max_ms: int,
    after_max_ms: int,
    require_keys: bool,
    max_decompressed: int,
) -> None:
    """Walk every record of every batch (positions and headers from ``Log._validate``);
    raise the partition's KafkaError at the first batch that fails. The rules are the
    topic's (LogConfig): timestamp bounds around ``now_ms``, keys when compacted."""
    before, after, keys = before_max_ms, after_max_ms, require_keys
    lo = max(now_ms - before, -NO_LIMIT) if before < NO_LIMIT else -NO_LIMIT
    hi = min(now_ms + after, NO_LIMIT) if after < NO_LIMIT else NO_LIMIT  # int64 for C
    checked = type(buf) is CheckedBatches
    for index, (pos, header) in enumerate(batches):
        where = f"batch {index}" if len(batches) > 1 else "batch"
        try:
            if header.attributes & KAFKA_FLAG:
                _kafka_batch(
                    buf, pos, header, checked, now_ms, before, after, keys, max_decompressed
                )
            else:
                _native_batch(buf, pos, header, lo, hi, keys)
        except RecordDefect as exc:
            raise refused(exc.code, f"{where}: {exc.message}", exc.record_errors) from None
        except CorruptBatch as exc:
            raise refused(ErrorCode.CORRUPT_MESSAGE, f"{where}: {exc}") from None


def _kafka_batch(
    buf: Any,
    pos: int,
    header: BatchHeader,
    checked: bool,
    now_ms: int,
    before: int,
    after: int,
    keys: bool,
    max_decompressed: int,
) -> None:
    v2 = unwrap_kafka_batch(buf, pos, header)
    try:
        inner = kafka_records.check_batch(v2, 0, len(v2)) if not checked else None
    except kafka_records.CorruptKafkaBatch as exc:
        raise RecordDefect(ErrorCode.CORRUPT_MESSAGE, str(exc)) from None
    if inner is not None:
        # Not from the Kafka listener: nobody has looked at this client-made v2 batch yet.
        flags = kafka_records.TRANSACTIONAL_FLAG | kafka_records.CONTROL_FLAG
        if inner.attributes & kafka_records.CONTROL_FLAG:
            raise RecordDefect(ErrorCode.INVALID_RECORD, "clients may not write control batches")
        if (inner.attributes ^ header.attributes) & flags:
            raise RecordDefect(
                ErrorCode.INVALID_RECORD,
                "the wrapped v2 batch's transactional bit does not match ours",
            )
        ours = producer_fields(buf, pos, header) or (-1, -1, -1)
        theirs = (inner.producer_id, inner.producer_epoch, inner.base_sequence)
        if (
            header.record_count,
            header.last_offset_delta,
            header.first_timestamp,
            header.max_timestamp,
        ) != (inner.record_count, inner.last_offset_delta, inner.base_timestamp,
              inner.max_timestamp) or (
            (header.attributes & PRODUCER_FLAG or inner.producer_id >= 0) and ours != theirs
        ):  # fmt: skip
            raise RecordDefect(
                ErrorCode.INVALID_RECORD, "the wrapped v2 batch's header does not match ours"
            )
    walk_records(
        v2,
        now_ms=now_ms,
        before_max_ms=before,
        after_max_ms=after,
        require_keys=keys,
        max_decompressed=max_decompressed,
    )


def _native_batch(buf: Any, pos: int, header: BatchHeader, lo: int, hi: int, keys: bool) -> None:
    """Our msgpack records: one C-level pass (protocol/batch.py walk_rows)."""
    try:
        newest, flagged = walk_rows(buf, pos, header, lo=lo, hi=hi, require_keys=keys)
    except CorruptBatch as exc:
        raise RecordDefect(ErrorCode.INVALID_RECORD, str(exc)) from None
    if newest != header.max_timestamp:
        raise RecordDefect(
            ErrorCode.INVALID_RECORD,
            f"max_timestamp {header.max_timestamp} is not the records' largest timestamp {newest}",
        )
    if flagged:
        errors = [rule_error(i, ts, keyless, lo, hi) for i, ts, keyless in flagged]
        raise records_refused(errors, len(errors))
