"""Our batches' records streamed a window at a time (protocol/batch_stream.py): the rows
``decode_rows`` gives, whatever the window, and the same refusals."""

from __future__ import annotations

import struct

import msgpack
import pytest

from minibroker.protocol.batch import CorruptBatch, decode_rows, encode_batch, unpack_header
from minibroker.protocol.batch_stream import RecordTooLarge, stream_rows


def batch() -> bytes:
    return encode_batch(
        [(100 + i, b"k%d" % i, b"v" * i, [("h", b"x")] if i % 2 else []) for i in range(300)],
        base_offset=5,
    )


@pytest.mark.parametrize("window", [1, 7, 64, 1 << 20])
def test_the_rows_are_decode_rows_whatever_the_window(window: int) -> None:
    data = batch()
    header = unpack_header(data)
    assert tuple(stream_rows(data, 0, header, window=window, max_record=1000)) == decode_rows(
        data, 0, header
    )


def test_a_record_over_the_cap_is_refused_before_it_is_held() -> None:
    data = batch()
    with pytest.raises(RecordTooLarge, match="exceeds max_bin_len"):
        list(stream_rows(data, 0, unpack_header(data), window=64, max_record=200))


def _with_records(rows: object, count: int) -> bytearray:
    """A batch whose records array is ``rows`` as msgpack (CRC not recomputed: the
    reader's callers check it, this one reads what is there)."""
    data = bytearray(encode_batch([(0, b"k", b"v", ())] * count))
    header = unpack_header(data)
    del data[header.records_at :]
    data += msgpack.packb(rows, use_bin_type=True)
    struct.pack_into(">i", data, 8, len(data) - 12)
    return data


@pytest.mark.parametrize(
    "rows, count, problem",
    [
        ([[0, b"k", b"v"]] * 2, 3, "do not match count"),
        ([[0, "str-key", b"v"]], 1, "key is not bytes"),
        ([[0, b"k"]], 1, "not \\[ts_delta"),
        ([["ts", b"k", b"v"]], 1, "timestamp delta"),
        ([[0, b"k", b"v", [["h"]]]], 1, "headers"),
    ],
)
def test_malformed_records_are_corrupt(rows: object, count: int, problem: str) -> None:
    data = _with_records(rows, count)
    with pytest.raises(CorruptBatch, match=problem):
        list(stream_rows(data, 0, unpack_header(data), window=16, max_record=1000))


def test_bytes_after_the_last_record_are_corrupt() -> None:
    data = bytearray(batch()) + b"\x01"
    struct.pack_into(">i", data, 8, len(data) - 12)
    with pytest.raises(CorruptBatch, match="bytes after its last record"):
        list(stream_rows(data, 0, unpack_header(data), window=64, max_record=5000))
