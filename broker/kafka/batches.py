"""Record batches across the Kafka listener: in as they came, out as they went in.

Produce: each v2 batch is checked (length, magic, CRC-32C, a codec we can serve, Kafka's
validateBatch rules) and wrapped in our batch header (protocol/batch.py
wrap_kafka_batch): per batch, one C-level CRC each way (the log takes the wrapped
batches' CRC as checked: CheckedBatches). The leader's log then walks every record
before writing (storage/record_validation.py, Kafka's LogValidator); compressed batches
are stored as they came, decompressed only in that walk's fixed window.

Fetch: a wrapped batch is unwrapped (the offset and epoch the leader gave, then the
client's own bytes). A batch our own client wrote (msgpack records) has no v2 form on
disk and is re-encoded here, record by record: the one per-record path, taken only when
a stock client reads what the bundled client wrote (docs/kafka-clients.md: "Ordering and batches").
"""

from __future__ import annotations

from minibroker.protocol.batch import (
    KAFKA_FLAG,
    TRANSACTIONAL_FLAG,
    CheckedBatches,
    CorruptBatch,
    decode_rows,
    iter_batches,
    producer_fields,
    unwrap_kafka_batch,
    wrap_kafka_batch,
)
from minibroker.protocol.errors import ErrorCode, ProtocolError
from minibroker.protocol.kafka import records as kafka_records


class RefusedBatch(Exception):
    """A produce's records for one partition that cannot be stored: its error code."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def wrap_produce(records: bytes | None) -> CheckedBatches:
    """The partition's records as our batches, or RefusedBatch."""
    if not records:
        raise RefusedBatch(ErrorCode.CORRUPT_MESSAGE, "the produce carries no records")
    out = CheckedBatches()
    try:
        for pos, size in kafka_records.iter_batches(records):
            header = kafka_records.check_batch(records, pos, size)
            kafka_records.check_compression(header.compression)
            if header.attributes & kafka_records.CONTROL_FLAG:
                # Kafka's rule: markers are written by partition leaders only.
                raise RefusedBatch(
                    ErrorCode.INVALID_RECORD, "clients may not write control batches"
                )
            if header.attributes & kafka_records.TRANSACTIONAL_FLAG and header.producer_id < 0:
                raise RefusedBatch(
                    ErrorCode.INVALID_RECORD,
                    "a transactional batch must carry its producer id and epoch",
                )
            if header.producer_id >= 0 and header.base_sequence < 0:
                raise RefusedBatch(
                    ErrorCode.INVALID_RECORD,
                    f"invalid sequence number {header.base_sequence} in a batch with "
                    f"producer id {header.producer_id}",
                )
            wrap_kafka_batch(records, pos, header, out)
    except kafka_records.UnsupportedCompression as exc:
        raise RefusedBatch(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, str(exc)) from None
    except ProtocolError as exc:
        raise RefusedBatch(ErrorCode.CORRUPT_MESSAGE, str(exc)) from None
    return out


def to_kafka(records: bytes) -> bytes:
    """A fetch's batches (ours, possibly cut short at the end) as v2 batches."""
    if not records:
        return records
    out = []
    try:
        for pos, header in iter_batches(records, verify=False, allow_partial=True):
            if header.attributes & KAFKA_FLAG:
                out.append(unwrap_kafka_batch(records, pos, header))
            else:
                out.append(_reencode(records, pos, header))
    except CorruptBatch:
        # A damaged stored batch: serve what came before it; the client asks again from
        # there and gets CORRUPT_MESSAGE from the native path's own checks.
        pass
    return b"".join(out)


def _reencode(records: bytes, pos: int, header) -> bytes:
    # decode_rows checks the record count; offsets run from the batch's base offset.
    first_ts = header.first_timestamp
    rows = decode_rows(records, pos, header)
    # The producer's identity and the transactional bit go along: a stock read_committed
    # consumer skips an aborted transaction by its producer id and that bit (Kafka's
    # aborted_transactions name producers, not batches).
    pid, epoch, sequence = producer_fields(records, pos, header) or (-1, -1, -1)
    return kafka_records.encode_batch(
        [(first_ts + r[0], r[1], r[2], r[3] if len(r) == 4 else ()) for r in rows],
        base_offset=header.base_offset,
        leader_epoch=header.leader_epoch,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=sequence,
        attributes=header.attributes & TRANSACTIONAL_FLAG,
    )
