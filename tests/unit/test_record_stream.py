"""The streaming record reader and LogValidator's walk (protocol/kafka/record_stream.py):
every lie a CRC-valid v2 batch can tell about its records, in every codec."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.protocol.errors import ErrorCode
from minibroker.protocol.kafka import record_stream as rs
from minibroker.protocol.kafka import records as kr
from minibroker.protocol.kafka.messages import write_uvarint, write_varint

CODECS = [kr.NONE, kr.GZIP, kr.SNAPPY, kr.LZ4, kr.ZSTD]
C_BUILT = rs._scan is not None
# Every test runs against the C loop (where built) and the Python one it must match.
WALKS = ["c", "python"] if C_BUILT else ["python"]
FIXTURES_OK = [HealthCheck.function_scoped_fixture]


@pytest.fixture(autouse=True, params=WALKS)
def walk_impl(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(rs, "_scan", None)
    return request.param


TS = 1_700_000_000_000


def varint(value: int) -> bytes:
    out = bytearray()
    write_varint(out, value)
    return bytes(out)


def record(
    index: int,
    *,
    key: bytes | None = b"k",
    value: bytes | None = b"value",
    ts_delta: int | None = None,
    headers: list[tuple[bytes, bytes | None]] = (),
    length: int | None = None,
    raw_fields: bytes | None = None,
) -> bytes:
    """One record's bytes; ``length`` overrides the true length, ``raw_fields`` the body."""
    body = bytearray(b"\x00")
    body += varint(index if ts_delta is None else ts_delta)
    body += varint(index)
    for blob in (key, value):
        body += varint(-1) if blob is None else varint(len(blob)) + blob
    body += varint(len(headers))
    for name, data in headers:
        body += varint(len(name)) + name
        body += varint(-1) if data is None else varint(len(data)) + data
    if raw_fields is not None:
        body = bytearray(raw_fields)
    return varint(len(body) if length is None else length) + bytes(body)


def batch(
    body: bytes,
    count: int,
    *,
    codec: int = kr.NONE,
    last_delta: int | None = None,
    max_ts: int | None = None,
    attributes: int = 0,
    compressed: bytes | None = None,
) -> bytes:
    """A v2 batch around ``body`` with a valid CRC-32C, whatever its header claims."""
    payload = compressed if compressed is not None else kr.compress(codec, body)
    tail = struct.pack(
        ">hiqqqhii",
        codec | attributes,
        count - 1 if last_delta is None else last_delta,
        TS,
        TS + count - 1 if max_ts is None else max_ts,
        -1,
        -1,
        -1,
        count,
    )
    tail += payload
    head = kr.PREFIX.pack(0, len(tail) + 9, -1)
    return head + struct.pack(">bI", kr.MAGIC, kr.crc32c(tail)) + tail


def records(n: int, **kw) -> bytes:
    return b"".join(record(i, **kw) for i in range(n))


def walk(data: bytes, **kw) -> rs.BatchSummary:
    return rs.walk_records(data, now_ms=TS, **kw)


def both(data: bytes) -> list[rs.RecordDefect]:
    """The defect each reader raises (walk_records and iter_records must agree)."""
    errors = []
    for read in (walk, lambda d: list(rs.iter_records(d))):
        with pytest.raises(rs.RecordDefect) as caught:
            read(data)
        errors.append(caught.value)
    return errors


# (name, body, declared count, header overrides, the message both readers name)
LIES = [
    ("count 1 holding 3", records(3), 1, {"max_ts": TS + 2}, "holds more bytes"),
    ("count 3 holding 1", records(1), 3, {}, "declares 3 records but holds 1"),
    ("last offset delta 2^31-1", records(1), 1, {"last_delta": 2**31 - 1}, "last_offset_delta"),
    ("count 0", records(1), 0, {"last_delta": 0}, "record_count 0"),
    ("offset deltas 0,0", record(0) + record(0), 2, {}, "offset delta 0, not 1"),
    ("negative record length", varint(-7) + b"\x00" * 10, 1, {}, "length -7"),
    ("overlong varint", b"\xff" * 6 + b"\x00" * 10, 1, {}, "longer than 5 bytes"),
    (
        "value length 2^40",
        record(0, raw_fields=b"\x00\x00\x00\x01" + b"\x80\x80\x80\x80\x80\x80\x02" + b"\x00"),
        1,
        {},
        "longer than 5 bytes",
    ),
    (
        "value length past the record",
        record(0, raw_fields=b"\x00\x00\x00\x01" + varint(1000) + b"abc\x00"),
        1,
        {},
        "value",
    ),
    (
        "negative key length",
        record(0, raw_fields=b"\x00\x00\x00" + varint(-5) + b"\x01\x00"),
        1,
        {},
        "key length -5",
    ),
    ("record shorter than its fields", record(0, length=8), 1, {}, ""),
    ("record longer than its fields", record(0, length=11) + b"\x00\x00", 1, {}, ""),
    ("record past the batch's end", record(0, length=60), 1, {}, ""),
    (
        "negative header count",
        record(0, raw_fields=b"\x00\x00\x00\x01\x01" + varint(-3)),
        1,
        {},
        "headers",
    ),
    (
        "2^30 headers",
        record(0, raw_fields=b"\x00\x00\x00\x01\x01" + varint(2**30)),
        1,
        {},
        "headers",
    ),
]


@pytest.mark.parametrize("codec", CODECS, ids=[kr.CODEC_NAMES[c] for c in CODECS])
@pytest.mark.parametrize(
    ("name", "body", "count", "fields", "says"), LIES, ids=[x[0] for x in LIES]
)
def test_every_lie_is_refused_as_an_invalid_record(name, body, count, fields, says, codec):
    data = batch(body, count, codec=codec, **fields)
    for defect in both(data):
        assert defect.code == ErrorCode.INVALID_RECORD, defect.message
        assert says in defect.message


@pytest.mark.parametrize("codec", CODECS, ids=[kr.CODEC_NAMES[c] for c in CODECS])
def test_honest_batches_read_back_in_every_codec(codec):
    body = records(200, headers=[(b"h", b"x"), (b"n", None)]) + record(200, key=None, value=None)
    data = batch(body, 201, codec=codec)
    summary = walk(data)
    assert summary == rs.BatchSummary(201, TS + 200, len(body))
    got = list(rs.iter_records(data))
    assert [r.offset_delta for r in got] == list(range(201))
    assert got[0] == rs.StreamRecord(0, 0, 0, b"k", b"value", 5, ((b"h", b"x"), (b"n", None)))
    assert got[200].key is None and got[200].value is None and got[200].value_size == -1
    skipped = list(rs.iter_records(data, values=False))
    assert skipped[0].value is None and skipped[0].value_size == 5


@pytest.mark.parametrize("codec", CODECS[1:], ids=[kr.CODEC_NAMES[c] for c in CODECS[1:]])
def test_records_larger_than_the_window_stream_through(codec):
    big = os.urandom(3 * rs.WINDOW + 17)
    body = record(0) + record(1, value=big) + record(2, key=os.urandom(rs.WINDOW + 1))
    data = batch(body, 3, codec=codec)
    assert walk(data).record_count == 3
    got = list(rs.iter_records(data))
    assert got[1].value == big and len(got[2].key) == rs.WINDOW + 1
    # The same batch with its last record cut off inside the big key.
    cut = batch(body[: -rs.WINDOW // 2], 3, codec=codec)
    for defect in both(cut):
        assert defect.code == ErrorCode.INVALID_RECORD


@pytest.mark.parametrize("codec", CODECS[1:], ids=[kr.CODEC_NAMES[c] for c in CODECS[1:]])
def test_a_fake_compressed_block_is_a_corrupt_message(codec):
    data = batch(records(3), 3, codec=codec, compressed=b"\x1f\x8b" + os.urandom(40))
    for defect in both(data):
        assert defect.code == ErrorCode.CORRUPT_MESSAGE
        assert kr.CODEC_NAMES[codec] in defect.message


@pytest.mark.parametrize("codec", CODECS[1:], ids=[kr.CODEC_NAMES[c] for c in CODECS[1:]])
def test_a_truncated_compressed_block_is_refused(codec):
    whole = kr.compress(codec, records(50))
    data = batch(b"", 50, codec=codec, compressed=whole[: len(whole) // 2])
    for defect in both(data):
        assert defect.code in (ErrorCode.CORRUPT_MESSAGE, ErrorCode.INVALID_RECORD)


@pytest.mark.parametrize("codec", CODECS[1:], ids=[kr.CODEC_NAMES[c] for c in CODECS[1:]])
def test_a_decompression_bomb_is_refused_above_the_limit(codec):
    body = record(0, value=b"\x00" * (4 * rs.WINDOW))
    data = batch(body, 1, codec=codec)
    assert len(data) < len(body) // 10
    assert walk(data, max_decompressed=len(body)).record_count == 1
    with pytest.raises(rs.RecordDefect) as caught:
        walk(data, max_decompressed=2 * rs.WINDOW)
    assert caught.value.code == ErrorCode.MESSAGE_TOO_LARGE
    assert "message.max.decompressed.bytes" in caught.value.message


@pytest.mark.parametrize("codec", [kr.GZIP, kr.LZ4, kr.ZSTD])
def test_the_window_bounds_each_decompression_step(codec):
    # Each codec hands out at most WINDOW bytes per step: a bomb is never held at once.
    packed = kr.compress(codec, b"\x00" * (8 * rs.WINDOW))
    chunks = list(rs._chunks(codec, memoryview(packed), rs.DEFAULT_MAX_DECOMPRESSED))
    assert max(map(len, chunks)) <= rs.WINDOW and sum(map(len, chunks)) == 8 * rs.WINDOW


@pytest.mark.parametrize("codec", CODECS, ids=[kr.CODEC_NAMES[c] for c in CODECS])
def test_keyless_records_in_a_compacted_topic_are_listed(codec):
    body = record(0) + record(1, key=None) + record(2) + record(3, key=None)
    data = batch(body, 4, codec=codec)
    walk(data)  # fine when keys are not required
    with pytest.raises(rs.RecordDefect) as caught:
        walk(data, require_keys=True)
    defect = caught.value
    assert defect.code == ErrorCode.INVALID_RECORD
    assert [e.batch_index for e in defect.record_errors] == [1, 3]
    assert "Compacted topic cannot accept message without key" in defect.record_errors[0].message
    assert "2 record errors in total" in defect.message


@pytest.mark.parametrize("codec", CODECS, ids=[kr.CODEC_NAMES[c] for c in CODECS])
def test_timestamps_outside_the_window_are_invalid_timestamps(codec):
    body = record(0) + record(1, ts_delta=-10_000) + record(2, ts_delta=5_000)
    data = batch(body, 3, codec=codec, max_ts=TS + 5_000)
    walk(data)  # no limits: Kafka's defaults before 4.0
    walk(data, before_max_ms=10_000, after_max_ms=5_000)
    with pytest.raises(rs.RecordDefect) as caught:
        walk(data, before_max_ms=9_999, after_max_ms=4_999)
    defect = caught.value
    assert defect.code == ErrorCode.INVALID_TIMESTAMP
    assert [e.batch_index for e in defect.record_errors] == [1, 2]
    assert f"within [{TS - 9_999}, {TS + 4_999}]" in defect.record_errors[0].message


def test_a_lying_max_timestamp_and_log_append_time_are_refused():
    with pytest.raises(rs.RecordDefect, match="max_timestamp") as caught:
        walk(batch(records(3), 3, max_ts=TS + 99))
    assert caught.value.code == ErrorCode.INVALID_RECORD
    with pytest.raises(rs.RecordDefect) as caught:
        walk(batch(records(3), 3, attributes=kr.TIMESTAMP_TYPE_FLAG))
    assert caught.value.code == ErrorCode.INVALID_TIMESTAMP


def test_record_errors_are_capped_but_counted():
    n = rs.MAX_RECORD_ERRORS + 50
    with pytest.raises(rs.RecordDefect) as caught:
        walk(batch(records(n, key=None), n), require_keys=True)
    assert len(caught.value.record_errors) == rs.MAX_RECORD_ERRORS
    assert f"{n} record errors in total" in caught.value.message


def test_the_encoder_of_records_py_agrees_with_the_reader():
    rows = [(TS + i, b"k%d" % i, b"v" * i, [("h", b"x")] if i % 2 else []) for i in range(300)]
    for codec in CODECS:
        data = kr.encode_batch(rows, compression=codec)
        assert walk(data).record_count == 300
        got = [(r.key, r.value, r.headers) for r in rs.iter_records(data)]
        assert got == [(k, v, tuple((n.encode(), d) for n, d in h)) for _, k, v, h in rows]


@settings(max_examples=300, deadline=None, suppress_health_check=FIXTURES_OK)
@given(st.binary(min_size=0, max_size=200), st.integers(1, 5))
def test_random_record_bytes_never_escape_as_anything_but_a_defect(body, count):
    data = batch(body, count)
    for read in (walk, lambda d: list(rs.iter_records(d))):
        try:
            read(data)
        except rs.RecordDefect:
            pass


@settings(max_examples=200, deadline=None, suppress_health_check=FIXTURES_OK)
@given(st.binary(min_size=0, max_size=300), st.integers(0, 40))
def test_a_single_flipped_byte_is_caught_or_still_parses_the_same_way(noise, at):
    # Whatever a flip does, the fast walk and the field-by-field reader agree on it.
    body = bytearray(records(5))
    body[at % len(body)] ^= noise[0] if noise else 0xFF
    data = batch(bytes(body), 5)
    outcomes = []
    for read in (lambda d: walk(d).record_count, lambda d: len(list(rs.iter_records(d)))):
        try:
            outcomes.append(read(data))
        except rs.RecordDefect as exc:
            outcomes.append(exc.code)
    if outcomes[0] == ErrorCode.INVALID_RECORD or outcomes[1] == ErrorCode.INVALID_RECORD:
        assert ErrorCode.INVALID_RECORD in outcomes
    else:
        assert outcomes[0] == outcomes[1]


def test_uvarint_needs_its_bytes():
    out = bytearray()
    write_uvarint(out, 300)
    assert rs._uvarint(bytes(out), 0, 5) == (300, 2)


def outcome(data: bytes, scan) -> object:
    """walk_records' result or defect (code and message) with the given hot loop."""
    saved = rs._scan
    rs._scan = scan
    try:
        return walk(data, require_keys=True, before_max_ms=10, after_max_ms=10)
    except rs.RecordDefect as exc:
        return exc.code, exc.message, exc.record_errors
    finally:
        rs._scan = saved


@pytest.mark.skipif(not C_BUILT, reason="the C extension is not built")
@settings(max_examples=400, deadline=None, suppress_health_check=FIXTURES_OK)
@given(
    st.lists(
        st.tuples(st.integers(-20, 20), st.none() | st.binary(max_size=3), st.binary(max_size=70)),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 400),
    st.integers(0, 255),
    st.integers(0, 2),
)
def test_the_c_loop_and_the_python_loop_agree(walk_impl, rows, at, xor, extra):
    body = bytearray(
        b"".join(record(i, key=k, value=v, ts_delta=d) for i, (d, k, v) in enumerate(rows))
    )
    body[at % len(body)] ^= xor
    data = batch(bytes(body), len(rows) + extra - 1 if extra else len(rows), max_ts=TS + 20)
    c_scan = rs._scan if walk_impl == "c" else None
    if c_scan is None:
        from minibroker.protocol.kafka._record_walk import scan as c_scan
    assert outcome(data, c_scan) == outcome(data, None)
