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
from itertools import islice
from operator import itemgetter

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
        while count is None or produced < count:
            if count is None:
                try:
                    count = unpacker.read_array_header()
                except msgpack.OutOfData:
                    at = _feed(unpacker, view, at, window, where, max_record, produced)
                    continue
                if count != header.record_count:
                    raise CorruptBatch(f"{where}: records do not match count")
                continue
            # The rows whole in what was fed so far: one window's worth, checked at once.
            rows = list(islice(unpacker, count - produced))
            if not rows:
                at = _feed(unpacker, view, at, window, where, max_record, produced)
                continue
            _check_rows(rows, header.base_offset + produced)
            produced += len(rows)
            yield from rows
    except (CorruptBatch, RecordTooLarge):
        raise
    except ValueError as exc:  # msgpack's limits (max_bin_len ...) and bad bytes
        if "exceeds max" in str(exc):
            raise RecordTooLarge(f"{where}: {exc}") from None
        raise CorruptBatch(f"records of {where}: {exc}") from None
    except Exception as exc:  # msgpack raises a zoo of types on hostile bytes
        raise CorruptBatch(f"records of {where}: {exc}") from None
    if unpacker.tell() != len(view):
        raise CorruptBatch(f"{where}: bytes after its last record")


def _feed(
    unpacker: msgpack.Unpacker,
    view: memoryview,
    at: int,
    window: int,
    where: str,
    max_record: int,
    produced: int,
) -> int:
    """Give the unpacker the next window of the records; where the one after starts."""
    if at >= len(view):
        raise CorruptBatch(f"{where}: records cut off")
    try:
        unpacker.feed(view[at : at + window])
    except msgpack.BufferFull:
        raise RecordTooLarge(f"{where}: record {produced} is over {max_record} bytes") from None
    return at + window


_ROW_TYPES = {tuple}
_ROW_LENGTHS = frozenset({3, 4})
_KEY_TYPES = frozenset({bytes, type(None)})
_first = itemgetter(0)
_second = itemgetter(1)


def _check_rows(rows: list, first_offset: int) -> None:
    """``decode_rows``'s checks, a few C-level passes over a window's rows, plus the
    types of timestamps and keys (the cleaner hashes keys)."""
    if set(map(type, rows)) != _ROW_TYPES or not set(map(len, rows)) <= _ROW_LENGTHS:
        raise CorruptBatch(
            f"records from {first_offset}: a record is not [ts_delta, key, value(, headers)]"
        )
    if set(map(type, map(_first, rows))) != {int}:
        raise CorruptBatch(f"records from {first_offset}: a timestamp delta is not an integer")
    if not set(map(type, map(_second, rows))) <= _KEY_TYPES:
        raise CorruptBatch(f"records from {first_offset}: a key is not bytes or null")
    for i, row in enumerate(rows):
        if len(row) == 4 and not (
            type(row[3]) is tuple and all(type(h) is tuple and len(h) == 2 for h in row[3])
        ):
            raise CorruptBatch(f"record {first_offset + i}: headers are not [name, value] pairs")
