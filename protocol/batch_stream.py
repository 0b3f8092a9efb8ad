"""One of our (msgpack) batches' records, decoded a window at a time.

``decode_rows`` builds every row of a batch at once: ~100 bytes of Python objects per
record of 4 bytes or more, so a large batch of small records costs 25 times its size.
The log cleaner walks batches of any size that ever reached the disk, so it reads them
through this instead: msgpack's streaming Unpacker is fed ``window`` bytes at a time and
a row's values are capped at ``max_record`` bytes, so memory stays at about
``window + max_record`` whatever the batch holds. Rows are the shape ``decode_rows``
gives, checked the same way.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgpack

from minibroker.protocol.batch import KAFKA_FLAG, BatchHeader, CorruptBatch
from minibroker.protocol.errors import ProtocolError


class RecordTooLarge(ProtocolError):
    """A record larger than the reader may hold (the cleaner copies its batch as is)."""


def stream_rows(
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    *,
    window: int,
    max_record: int,
) -> Iterator[tuple]:
    """The rows of a native batch (not KAFKA_FLAG) in order, ``(timestamp_delta, key,
    value[, headers])``; CorruptBatch when they do not decode, RecordTooLarge past the cap."""
    if header.attributes & KAFKA_FLAG:
        raise ValueError("a Kafka v2 batch: read it with protocol.kafka.record_stream")
    window = max(1, window)
    view = memoryview(buf)[pos + header.records_at : pos + header.size]
    unpacker = msgpack.Unpacker(
        raw=False,
        use_list=False,
        max_buffer_size=window + max_record,
        max_bin_len=max_record,
        max_str_len=max_record,
        max_array_len=max(header.record_count, max_record),
        max_map_len=0,
        max_ext_len=0,
    )
    at = 0
    count = None
    produced = 0
    where = f"batch at offset {header.base_offset}"
    try:
        while True:
            try:
                if count is None:
                    count = unpacker.read_array_header()
                    if count != header.record_count:
                        raise CorruptBatch(f"{where}: records do not match count")
                if produced == count:
                    break
                row = unpacker.unpack()
            except msgpack.OutOfData:
                if at >= len(view):
                    raise CorruptBatch(f"{where}: records cut off") from None
                try:
                    unpacker.feed(view[at : at + window])
                except msgpack.BufferFull:
                    raise RecordTooLarge(
                        f"{where}: record {header.base_offset + produced} is over "
                        f"{max_record} bytes"
                    ) from None
                at += window
                continue
            _check_row(row, header.base_offset + produced)
            produced += 1
            yield row
    except (CorruptBatch, RecordTooLarge):
        raise
    except ValueError as exc:  # msgpack's limits (max_bin_len ...) and bad bytes
        if "exceeds max" in str(exc):
            raise RecordTooLarge(f"{where}: {exc}") from None
        raise CorruptBatch(f"records of {where}: {exc}") from None
    except Exception as exc:  # msgpack raises a zoo of types on hostile bytes
        raise CorruptBatch(f"records of {where}: {exc}") from None
    if at < len(view) or unpacker.tell() != len(view):
        raise CorruptBatch(f"{where}: bytes after its last record")


def _check_row(row: object, offset: int) -> None:
    """``decode_rows``'s checks for one row (it makes them in bulk)."""
    if type(row) is not tuple or len(row) not in (3, 4):
        raise CorruptBatch(f"record {offset}: not [ts_delta, key, value(, headers)]")
    if not isinstance(row[0], int) or not (row[1] is None or type(row[1]) is bytes):
        raise CorruptBatch(f"record {offset}: bad timestamp or key")
    if len(row) == 4 and not (
        type(row[3]) is tuple and all(type(h) is tuple and len(h) == 2 for h in row[3])
    ):
        raise CorruptBatch(f"record {offset}: headers are not [name, value] pairs")
