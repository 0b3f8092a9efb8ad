"""Turning fetched bytes into ConsumerRecords and fetch answers into partition state."""

import gc
import struct
import zlib

import msgpack
import pytest

from minibroker.client.fetcher import (
    PartitionState,
    apply_partition_result,
    fetch_body,
    to_consumer_records,
)
from minibroker.client.records import ConsumerRecord, TopicPartition, normalize_headers, to_bytes
from minibroker.protocol import CorruptBatch, encode_batch, patch_base_offset, read_records
from minibroker.protocol.errors import ErrorCode, InvalidRecord

TP = TopicPartition("t", 3)


def batch_at(base: int, values: list[bytes], ts: int = 1000) -> bytes:
    buf = bytearray(encode_batch([(ts + i, None, v, []) for i, v in enumerate(values)]))
    patch_base_offset(buf, 0, base)
    return bytes(buf)


def test_records_carry_topic_partition_and_all_fields():
    buf = bytearray(encode_batch([(5, b"k", b"v", [("h", b"1"), ("n", None)])]))
    patch_base_offset(buf, 0, 7)
    (r,) = to_consumer_records("t", 3, bytes(buf), 0)
    assert r == ConsumerRecord("t", 3, 7, 5, b"k", b"v", (("h", b"1"), ("n", None)))
    assert r.headers == (("h", b"1"), ("n", None))


def test_a_record_without_headers_has_an_empty_tuple_and_records_are_values():
    (r,) = to_consumer_records("t", 0, batch_at(0, [b"v"]), 0)
    assert r.headers == () and hash(r) == hash(ConsumerRecord("t", 0, 0, 1000, None, b"v", ()))


def test_a_consumed_record_is_the_only_object_of_it_the_collector_tracks():
    """What makes holding many records cheaper: everything inside a record is a str,
    bytes, int, None or a plain tuple of them, which CPython's collector stops tracking
    once it has seen them; only the record (a tuple subclass, never untracked) is walked by
    later collections. With a list for headers, and a Record decoded in between, a
    record cost the collector two or three objects."""
    buf = bytearray(encode_batch([(5, b"k", b"v", [("h", b"1")]), (6, None, b"w", [])]))
    records = to_consumer_records("t", 0, bytes(buf), 0)
    gc.collect()
    gc.collect()  # a tuple holding a tracked tuple is untracked on the pass after it
    inside = [x for r in records for x in gc.get_referents(r) if x is not ConsumerRecord]
    assert inside and not any(gc.is_tracked(x) for x in inside)


def forged(rows: list) -> bytes:
    """A batch whose records array is ``rows`` as given, with a valid header and CRC."""
    payload = msgpack.packb(rows, use_bin_type=True)
    tail = struct.pack(">hiqqi", 0, len(rows) - 1, 1000, 1000, len(rows)) + payload
    return struct.pack(">qiiI", 0, len(tail) + 8, -1, zlib.crc32(tail)) + tail


@pytest.mark.parametrize(
    "rows",
    [
        [[0, None, b"a"], 7],  # a record that is not an array
        [[0, None]],  # too few fields
        [[0, None, b"a", [], b"extra"]],  # too many
        [[0, None, b"a", [["h"]]]],  # a header that is not a pair
        [[0, None, b"a", 5]],  # headers that are not an array
    ],
)
def test_a_record_of_the_wrong_shape_is_a_corrupt_batch(rows):
    buf = forged(rows)
    assert to_consumer_records("t", 0, forged([[0, None, b"ok"]]), 0)[0].value == b"ok"
    with pytest.raises(CorruptBatch):
        to_consumer_records("t", 0, buf, 0)
    with pytest.raises(CorruptBatch):
        read_records(buf)


def test_min_offset_skips_the_start_of_a_batch():
    buf = batch_at(10, [b"a", b"b", b"c", b"d"])
    assert [r.offset for r in to_consumer_records("t", 0, buf, 12)] == [12, 13]


def test_cut_off_tail_is_dropped():
    buf = batch_at(0, [b"a", b"b"]) + batch_at(2, [b"c"])[:-5]
    assert [r.value for r in to_consumer_records("t", 0, buf, 0)] == [b"a", b"b"]


def test_apply_advances_fetch_offset_and_buffers_a_chunk():
    st = PartitionState(TP, 1024)
    st.seek(10)
    result = {"error_code": 0, "high_watermark": 15, "records": batch_at(10, [b"a", b"b", b"c"])}
    outcome = apply_partition_result(st, result, 10, 1 << 20)
    assert outcome.error is None
    assert st.fetch_offset == 13 and st.position == 10 and st.high_watermark == 15
    assert [r.value for r in st.chunks[0]] == [b"a", b"b", b"c"]


def test_partial_batch_asks_for_more_bytes_next_time():
    st = PartitionState(TP, 100)
    st.seek(0)
    result = {"error_code": 0, "high_watermark": 1, "records": batch_at(0, [b"x" * 500])[:100]}
    apply_partition_result(st, result, 0, 1 << 20)
    assert st.max_bytes == 200 and not st.chunks


def test_partition_errors_are_classified():
    st = PartitionState(TP, 100)
    st.seek(0)

    def outcome(code):
        return apply_partition_result(
            st, {"error_code": int(code), "high_watermark": -1, "records": b""}, 0, 1000
        )

    assert outcome(ErrorCode.OFFSET_OUT_OF_RANGE).out_of_range
    assert outcome(ErrorCode.NOT_LEADER_OR_FOLLOWER).needs_metadata
    assert isinstance(outcome(ErrorCode.INVALID_RECORD).error, InvalidRecord)
    assert outcome(ErrorCode.REQUEST_TIMED_OUT).error is None  # retriable: just fetch again


def test_seek_drops_buffered_records_and_bumps_the_epoch():
    st = PartitionState(TP, 100)
    st.seek(0)
    st.chunks.append([])
    epoch = st.epoch
    st.seek(None, "earliest")
    assert not st.chunks and st.epoch == epoch + 1 and st.reset == "earliest"
    assert not st.fetchable


def test_fetch_body_groups_partitions_by_topic():
    a, b = PartitionState(TopicPartition("t", 0), 10), PartitionState(TopicPartition("t", 1), 20)
    a.seek(5)
    b.seek(6)
    body = fetch_body(
        [a, b], {"fetch.max.wait.ms": 500, "fetch.min.bytes": 1, "fetch.max.bytes": 99}
    )
    assert body["topics"] == [
        {
            "name": "t",
            "partitions": [
                {"partition": 0, "fetch_offset": 5, "partition_max_bytes": 10},
                {"partition": 1, "fetch_offset": 6, "partition_max_bytes": 20},
            ],
        }
    ]
    assert (body["max_wait_ms"], body["min_bytes"], body["max_bytes"]) == (500, 1, 99)


def test_values_and_headers_are_normalized():
    assert to_bytes("é", "value") == "é".encode()
    assert to_bytes(bytearray(b"x"), "value") == b"x"
    assert normalize_headers({"a": "1", "b": None}) == [("a", b"1"), ("b", None)]
    with pytest.raises(TypeError, match="value"):
        to_bytes(12, "value")
