"""The leader's record validation in the log (broker/storage/record_validation.py): both
batch formats, the topic's rules, and all-or-nothing appends."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.broker.kafka.batches import wrap_produce
from minibroker.broker.storage import Log, LogConfig
from minibroker.protocol import batch as ours
from minibroker.protocol.errors import (
    CorruptMessage,
    ErrorCode,
    InvalidRecord,
    InvalidTimestamp,
    KafkaError,
)
from minibroker.protocol.kafka import records as kr

NOW = 1_700_000_000_000
C_BUILT = ours._scan_rows is not None


@pytest.fixture(autouse=True, params=["c", "python"] if C_BUILT else ["python"])
def walk_impl(request, monkeypatch):
    """Every test against the C walk (where built) and the Python one it must match."""
    if request.param == "python":
        monkeypatch.setattr(ours, "_scan_rows", None)
    return request.param


def open_log(path: Path, **config) -> Log:
    return Log.open(path, LogConfig(**config), now_ms=lambda: NOW)


def native(
    rows: list, *, first_ts: int = NOW, max_ts: int | None = None, tail: bytes = b""
) -> bytes:
    """Our batch around msgpack ``rows`` (whatever they hold), with a matching CRC."""
    payload = msgpack.packb(rows, use_bin_type=True) + tail
    count = len(rows)
    if max_ts is None:
        ints = [r[0] for r in rows if type(r[0]) is int]
        max_ts = first_ts + max(ints) if ints else first_ts
    newest = max_ts
    body = struct.pack(">hiqqi", 0, count - 1, first_ts, newest, count) + payload
    return struct.pack(">qiiI", 0, len(body) + 8, -1, zlib.crc32(body)) + body


NATIVE_LIES = [
    ("key is an int", [(0, 5, b"v")]),
    ("timestamp delta is a str", [("0", b"k", b"v")]),
    ("value is a str", [(0, b"k", "v")]),
    ("row of two fields", [(0, b"k")]),
    ("row of five fields", [(0, b"k", b"v", [], 1)]),
    ("header name is bytes", [(0, b"k", b"v", [(b"h", b"x")])]),
    ("header of one field", [(0, b"k", b"v", [("h",)])]),
    ("headers not an array", [(0, b"k", b"v", 7)]),
    ("timestamp delta past int64", [(2**64 - 1, b"k", b"v")]),
]


@pytest.mark.parametrize(("name", "rows"), NATIVE_LIES, ids=[n for n, _ in NATIVE_LIES])
def test_our_batches_that_lie_are_refused_and_nothing_is_written(tmp_path, name, rows):
    log = open_log(tmp_path)
    data = native(rows, max_ts=NOW)
    with pytest.raises(InvalidRecord):
        log.append_as_leader(bytearray(data), 0)
    assert log.log_end_offset == 0


def test_bytes_after_our_records_are_refused(tmp_path):
    log = open_log(tmp_path)
    with pytest.raises(InvalidRecord):
        log.append_as_leader(bytearray(native([(0, b"k", b"v")], tail=b"\xc0")), 0)
    assert log.log_end_offset == 0


def test_a_lying_max_timestamp_is_refused_in_both_formats(tmp_path):
    log = open_log(tmp_path)
    with pytest.raises(InvalidRecord, match="max_timestamp"):
        log.append_as_leader(bytearray(native([(0, b"k", b"v"), (3, b"k", b"v")], max_ts=NOW)), 0)
    kafka = bytearray(kr.encode_batch([(NOW, b"k", b"v", []), (NOW + 3, b"k", b"v", [])]))
    struct.pack_into(">q", kafka, 35, NOW + 1)
    struct.pack_into(">I", kafka, kr.CRC_AT, kr.crc32c(bytes(kafka[kr.CRC_START :])))
    with pytest.raises(InvalidRecord, match="max_timestamp"):
        log.append_as_leader(wrap_produce(bytes(kafka)), 0)
    assert log.log_end_offset == 0


@pytest.mark.parametrize("kind", ["native", "kafka", "kafka-gzip"])
def test_a_compacted_topic_refuses_keyless_records_with_their_indexes(tmp_path, kind):
    log = open_log(tmp_path, cleanup_policy="compact")
    rows = [(NOW, b"a", b"1", []), (NOW, None, b"2", []), (NOW, b"c", None, [])]
    data = {
        "native": lambda: bytearray(ours.encode_batch(rows)),
        "kafka": lambda: wrap_produce(kr.encode_batch(rows)),
        "kafka-gzip": lambda: wrap_produce(kr.encode_batch(rows, compression=kr.GZIP)),
    }[kind]()
    with pytest.raises(InvalidRecord) as refused:
        log.append_as_leader(data, 0)
    assert [(e.batch_index, e.message) for e in refused.value.record_errors] == [
        (1, "Compacted topic cannot accept message without key")
    ]
    assert log.log_end_offset == 0
    # A tombstone (a key, no value) is what a compacted topic is for.
    assert log.append_as_leader(bytearray(ours.encode_batch(rows[:1] + rows[2:])), 0)


@pytest.mark.parametrize("kind", ["native", "kafka"])
def test_timestamps_are_held_to_before_and_after_max_ms(tmp_path, kind):
    log = open_log(
        tmp_path, message_timestamp_before_max_ms=1000, message_timestamp_after_max_ms=500
    )
    encode = ours.encode_batch if kind == "native" else kr.encode_batch
    wrap = bytearray if kind == "native" else wrap_produce
    log.append_as_leader(
        wrap(encode([(NOW - 1000, b"k", b"v", []), (NOW + 500, b"k", b"v", [])])), 0
    )
    bad = [(NOW, b"k", b"v", []), (NOW - 1001, b"k", b"v", []), (NOW + 501, b"k", b"v", [])]
    with pytest.raises(InvalidTimestamp) as refused:
        log.append_as_leader(wrap(encode(bad)), 0)
    assert [e.batch_index for e in refused.value.record_errors] == [1, 2]
    assert f"within [{NOW - 1000}, {NOW + 500}]" in refused.value.record_errors[0].message
    assert log.log_end_offset == 2


def test_difference_max_ms_is_the_default_of_before_and_after():
    config = LogConfig(message_timestamp_difference_max_ms=60_000)
    assert (config.timestamp_before_max_ms, config.timestamp_after_max_ms) == (60_000, 60_000)
    config = LogConfig(message_timestamp_difference_max_ms=60_000, message_timestamp_after_max_ms=5)
    assert (config.timestamp_before_max_ms, config.timestamp_after_max_ms) == (60_000, 5)


def test_one_bad_batch_refuses_the_whole_append(tmp_path):
    log = open_log(tmp_path)
    good = ours.encode_batch([(NOW, b"k", b"v", [])])
    with pytest.raises(InvalidRecord, match="batch 1"):
        log.append_as_leader(bytearray(good + native([(0, 5, b"v")])), 0)
    assert log.log_end_offset == 0


def test_a_native_kafka_flag_batch_is_checked_like_a_kafka_listeners(tmp_path):
    """The native listener could send a KAFKA_FLAG batch of its own making: its CRC-32C,
    its flags and its header against ours are checked (the Kafka listener's were)."""
    log = open_log(tmp_path)
    kafka = kr.encode_batch([(NOW, b"k", b"v", [])])
    wrapped = bytearray(wrap_produce(kafka))  # a plain bytearray: as the native listener hands it
    assert log.append_as_leader(bytearray(wrapped), 0).record_count == 1
    damaged = bytearray(wrapped)
    damaged[-1] ^= 1  # inside the v2 batch: its CRC-32C breaks, ours is recomputed below
    struct.pack_into(">I", damaged, ours.CRC_AT, zlib.crc32(damaged[ours.CRC_START :]))
    with pytest.raises(CorruptMessage, match="CRC-32C"):
        log.append_as_leader(damaged, 0)
    lying = bytearray(wrapped)
    struct.pack_into(">i", lying, ours.HEADER_SIZE - 4, 5)  # our record_count
    struct.pack_into(">i", lying, ours.LAST_DELTA_AT, 4)
    struct.pack_into(">I", lying, ours.CRC_AT, zlib.crc32(lying[ours.CRC_START :]))
    with pytest.raises(KafkaError) as refused:
        log.append_as_leader(lying, 0)
    assert refused.value.code == ErrorCode.INVALID_RECORD
    assert log.log_end_offset == 1


@pytest.mark.skipif(not C_BUILT, reason="the C extension is not built")
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.integers(-(2**63), 2**64 - 1) | st.text(max_size=2),
            st.none() | st.binary(max_size=3) | st.text(max_size=2) | st.integers(-9, 9),
            st.none() | st.binary(max_size=3),
        ),
        min_size=1,
        max_size=5,
    ),
    st.booleans(),
)
def test_the_c_walk_of_our_records_matches_the_python_one(walk_impl, rows, keys):
    data = native([r for r in rows], max_ts=NOW)
    header = ours.unpack_header(data)
    results = []
    for scan in (None, ours._scan_rows or __import__(
            "minibroker.protocol.kafka._record_walk", fromlist=["scan_rows"]).scan_rows):  # fmt: skip
        saved, ours._scan_rows = ours._scan_rows, scan
        try:
            results.append(
                ours.walk_rows(data, 0, header, lo=NOW - 5, hi=NOW + 5, require_keys=keys)
            )
        except ours.CorruptBatch:
            results.append("refused")
        finally:
            ours._scan_rows = saved
    assert results[0] == results[1]


def test_huge_timestamp_limits_do_not_overflow(tmp_path):
    log = open_log(
        tmp_path,
        message_timestamp_before_max_ms=2**63 - 2,
        message_timestamp_after_max_ms=2**63 - 2,
    )
    assert log.append_as_leader(bytearray(ours.encode_batch([(NOW, b"k", b"v", [])])), 0)
    assert log.append_as_leader(wrap_produce(kr.encode_batch([(NOW, b"k", b"v", [])])), 0)
