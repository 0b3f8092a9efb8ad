"""Frames, codecs and record batches: round trips, strict validation, hostile bytes."""

from __future__ import annotations

import struct
import tracemalloc

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minibroker.protocol as p
from minibroker.protocol import schema
from minibroker.protocol.batch import CorruptBatch
from minibroker.protocol.errors import ErrorCode, KafkaError


def produce_body(records: bytes = b"") -> dict:
    return {
        "acks": 1,
        "timeout_ms": 1000,
        "topics": [{"name": "t", "partitions": [{"partition": 0, "records": records}]}],
    }


# --- errors ---------------------------------------------------------------------------------


def test_error_classes_are_named_after_kafka_codes():
    assert p.errors.RequestTimedOut.code is ErrorCode.REQUEST_TIMED_OUT
    assert p.error_class(19) is p.errors.NotEnoughReplicas
    assert p.errors.NotEnoughReplicas("x").retriable
    assert not p.errors.InvalidRequiredAcks().retriable
    assert str(p.errors.RequestTimedOut()) == "REQUEST_TIMED_OUT"
    assert ErrorCode.parse(12345) is ErrorCode.UNKNOWN_SERVER_ERROR
    with pytest.raises(p.errors.OffsetOutOfRange):
        p.raise_for(1, "bad offset")
    p.raise_for(0)


def test_every_error_code_has_an_exception():
    for code in ErrorCode:
        if code is not ErrorCode.NONE:
            exc = p.error_class(code)("m")
            assert isinstance(exc, KafkaError) and exc.code is code


# --- framing --------------------------------------------------------------------------------


def test_frames_split_across_feeds():
    frames = [p.encode_frame(b"a" * n) for n in (1, 5, 300)]
    data = b"".join(frames)
    decoder = p.FrameDecoder()
    out = []
    for i in range(0, len(data), 7):
        out += decoder.feed(data[i : i + 7])
    assert out == [b"a", b"a" * 5, b"a" * 300]
    assert decoder.buffered == 0


def test_one_whole_frame_of_bytes_is_a_view_into_them_and_anything_else_is_fed():
    """feed_bytes: a read that is exactly one frame is not copied; a split, a pair of
    frames, a frame after buffered bytes or an oversized one take feed's way."""
    decoder = p.FrameDecoder(max_frame_bytes=1024)
    data = p.encode_frame(b"x" * 300)
    (view,) = decoder.feed_bytes(data)
    assert isinstance(view, memoryview) and view.obj is data and view == b"x" * 300
    assert decoder.feed_bytes(data + data) == [b"x" * 300] * 2
    assert decoder.feed_bytes(data[:10]) == [] and decoder.buffered == 10
    assert decoder.feed_bytes(data[10:]) == [b"x" * 300] and decoder.buffered == 0
    with pytest.raises(p.FrameTooLarge):
        decoder.feed_bytes(p.encode_frame(b"y" * 2000))


def test_oversized_frame_refused_before_buffering():
    decoder = p.FrameDecoder(max_frame_bytes=1024)
    with pytest.raises(p.FrameTooLarge, match="2147483648 bytes exceeds"):
        decoder.feed(struct.pack(">I", 2**31))
    assert decoder.buffered == 0


def test_empty_frame_is_a_protocol_error():
    with pytest.raises(p.ProtocolError):
        p.FrameDecoder().feed(b"\x00\x00\x00\x00")


# --- codec ----------------------------------------------------------------------------------


def test_request_round_trip_fills_defaults():
    frame = p.encode_request(
        p.ApiKey.FETCH,
        0,
        7,
        "me",
        {
            "max_wait_ms": 10,
            "min_bytes": 1,
            "topics": [{"name": "t", "partitions": [{"partition": 0, "fetch_offset": 5}]}],
        },
    )
    (payload,) = p.FrameDecoder().feed(frame)
    header, body = p.decode_request(payload)
    assert header == p.RequestHeader(1, 0, 7, "me")
    assert body["replica_id"] == -1
    assert body["topics"][0]["partitions"][0]["partition_max_bytes"] == 1048576


def _topic(second_partition: dict) -> dict:
    return {"name": "t", "partitions": [{"partition": 0, "records": b""}, second_partition]}


_GOOD_TOPIC = _topic({"partition": 1, "records": b""})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"acks": "1", "timeout_ms": 1, "topics": []}, "acks: expected int16"),
        ({"acks": True, "timeout_ms": 1, "topics": []}, "acks: expected int16, got bool"),
        ({"acks": 1, "timeout_ms": -1, "topics": []}, "timeout_ms: -1 is outside"),
        ({"acks": 1, "topics": []}, "missing field 'timeout_ms'"),
        ({"acks": 1, "timeout_ms": 1, "topics": [], "x": 1}, "unknown field"),
        (
            {
                "acks": 1,
                "timeout_ms": 1,
                "topics": [{"name": "t", "partitions": [{"partition": -1, "records": b""}]}],
            },
            "topics[0].partitions[0].partition",
        ),
        # Deeper, and past the first element: each container names the one that failed.
        (
            {"acks": 1, "timeout_ms": 1, "topics": [_GOOD_TOPIC, _topic({"partition": 0})]},
            "topics[1].partitions[1]: missing field 'records'",
        ),
        (
            {
                "acks": 1,
                "timeout_ms": 1,
                "topics": [_GOOD_TOPIC, _topic({"partition": 0, "records": b"", "z": 1})],
            },
            "topics[1].partitions[1]: unknown field(s) z",
        ),
        (
            {"acks": 1, "timeout_ms": 1, "topics": [_GOOD_TOPIC, {"name": 7, "partitions": []}]},
            "topics[1].name: expected string, got int",
        ),
        ([1, 2], "expected map"),
    ],
)
def test_wrong_shapes_name_the_problem(body, message):
    header = p.RequestHeader(0, 0, 1, None)
    with pytest.raises(p.InvalidRequest) as info:
        p.validate_request(header, body)
    assert message in str(info.value)


def test_a_mapping_names_the_key_or_value_that_failed():
    check = schema.struct({"sizes": schema.mapping(schema.STRING, schema.INT32)})
    assert check({"sizes": {"a": 1, "b": 2}}, "") == {"sizes": {"a": 1, "b": 2}}
    with pytest.raises(
        p.InvalidRequest, match=r"INVALID_REQUEST: sizes\.b: expected int32, got str"
    ):
        check({"sizes": {"a": 1, "b": "2"}}, "")
    with pytest.raises(
        p.InvalidRequest, match=r"INVALID_REQUEST: sizes\.<key>: expected string, got int"
    ):
        check({"sizes": {"a": 1, 3: 2}}, "")


def test_unknown_api_and_version():
    with pytest.raises(p.UnsupportedVersion, match="unknown api_key 999"):
        p.validate_request(p.RequestHeader(999, 0, 1, None), {})
    with pytest.raises(p.UnsupportedVersion, match="PRODUCE version 9 is not supported"):
        p.validate_request(p.RequestHeader(0, 9, 1, None), produce_body())
    # One class per error: the decoder's verdicts are the exceptions named after their codes.
    assert p.UnsupportedVersion("x").code is ErrorCode.UNSUPPORTED_VERSION
    assert isinstance(p.InvalidRequest("x"), p.ProtocolError)
    assert p.error_class(ErrorCode.INVALID_REQUEST) is p.InvalidRequest


def test_envelope_errors():
    for payload in (
        msgpack.packb([1, 2]),
        msgpack.packb(["a", 0, 1, None, {}]),
        msgpack.packb([0, 0, 2**40, None, {}]),
    ):
        with pytest.raises(p.ProtocolError):
            p.decode_request_envelope(payload)


def test_top_level_error_response_is_valid_for_any_api():
    body = p.validate_response(
        p.ApiKey.PRODUCE, 0, p.error_body(ErrorCode.UNSUPPORTED_VERSION, "nope")
    )
    assert body["error_code"] == 35


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_decoders_only_raise_protocol_errors(data):
    decoder = p.FrameDecoder(max_frame_bytes=4096)
    try:
        frames = decoder.feed(data)
    except p.ProtocolError:
        frames = []
    for payload in [*frames, data]:
        try:
            header, raw = p.decode_request_envelope(payload)
            p.validate_request(header, raw)
        except p.ProtocolError:
            pass
        try:
            _corr, raw = p.decode_response_envelope(payload)
            p.validate_response(p.ApiKey.FETCH, 0, raw)
        except p.ProtocolError:
            pass
    try:
        p.read_records(data)
    except p.ProtocolError:
        pass


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=5)
    | st.binary(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(list(p.api.SCHEMAS)), json_like)
def test_fuzz_wrong_shaped_msgpack_is_rejected_cleanly(api_key, body):
    try:
        p.validate_request(p.RequestHeader(api_key, 0, 1, None), body)
    except p.ProtocolError:
        pass


# --- batches --------------------------------------------------------------------------------


def make_batch(n=3, ts=1000):
    return p.encode_batch(
        [
            (ts + i, f"k{i}".encode(), f"v{i}".encode(), [("h", b"x")] if i == 0 else [])
            for i in range(n)
        ]
    )


def test_batch_round_trip_and_in_place_offsets():
    buf = bytearray(make_batch(3))
    p.patch_base_offset(buf, 0, 41)
    p.patch_leader_epoch(buf, 0, 7)
    [(_pos, header)] = list(p.iter_batches(buf))
    assert (header.base_offset, header.last_offset, header.leader_epoch, header.record_count) == (
        41,
        43,
        7,
        3,
    )
    records = p.read_records(buf)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in records] == [
        (41, 1000, b"k0", b"v0"),
        (42, 1001, b"k1", b"v1"),
        (43, 1002, b"k2", b"v2"),
    ]
    assert records[0].headers == [("h", b"x")]
    assert [r.offset for r in p.read_records(buf, min_offset=43)] == [43]


def test_flipped_byte_fails_crc():
    buf = bytearray(make_batch(3))
    buf[-2] ^= 0xFF
    with pytest.raises(CorruptBatch, match="CRC"):
        list(p.iter_batches(buf))


def test_truncated_batch():
    buf = make_batch(3) + make_batch(2)[:-5]
    with pytest.raises(CorruptBatch, match="truncated"):
        list(p.iter_batches(buf))
    assert len(list(p.iter_batches(buf, allow_partial=True))) == 1


def test_record_count_must_match_records():
    good = p.encode_batch([(1, None, b"a", [])])
    bad = bytearray(good)
    struct.pack_into(">i", bad, 42, 2)  # record_count
    with pytest.raises(CorruptBatch):
        p.check_batch(bad, 0, len(bad))


def test_split_envelope_agrees_with_decoding_or_declines():
    """The split (header + body bytes, body not decoded) gives what decoding gives, or
    None; it never accepts what the full decoder refuses."""
    body = {"max_wait_ms": 1, "min_bytes": 1, "topics": [{"name": "t", "partitions": []}]}
    for key in (0, 1, 127, 128, 10002, 65536):
        for corr in (0, 127, 128, 65535, 65536, 2**31 - 1, 2**31, -1):
            for client_id in (None, "", "bench", "x" * 32, "é" * 100, "y" * 256):
                payload = msgpack.packb([key, 0, corr, client_id, body], use_bin_type=True)
                split = p.split_request_envelope(payload)
                try:
                    decoded = p.decode_request_envelope(payload)
                except p.ProtocolError:
                    decoded = None
                if split is None:
                    assert corr < 0 or corr >= 2**31 or len(client_id or "") > 100
                else:
                    assert decoded is not None and split[0] == decoded[0]
                    assert p.decode_request_body(split[1]) == decoded[1]
    payload = msgpack.packb([1, 0, 5, "bench", body], use_bin_type=True)
    for cut in range(len(payload)):
        split = p.split_request_envelope(payload[:cut])
        assert split is None or 0 < len(split[1]) < len(msgpack.packb(body))
    with pytest.raises(p.ProtocolError, match="extra data"):
        p.decode_request_body(p.split_request_envelope(payload + b"\x00")[1])
    assert p.split_request_envelope(b"") is None
    assert p.split_request_envelope(msgpack.packb([1, 0, 5, "bench"])) is None


# --- what decoding one request may build ------------------------------------------------------

CAP = p.codec.MAX_REQUEST_VALUES
ENVELOPE = b"\x95\x00\x00\x01\xa1x"  # [0, 0, 1, "x", <body>]: a valid Produce envelope's head


def values_in(obj) -> int:
    if isinstance(obj, dict):
        return 1 + sum(values_in(k) + values_in(v) for k, v in obj.items())
    if isinstance(obj, list):
        return 1 + sum(map(values_in, obj))
    return 1


packable = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.binary(max_size=300)  # bin 8 and bin 16
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=20)),
    lambda children: (
        st.lists(children, max_size=20)
        | st.dictionaries(st.text(max_size=3), children, max_size=20)
    ),
    max_leaves=60,
)


@settings(max_examples=400, deadline=None)
@given(packable)
def test_value_count_walk_agrees_with_msgpack(value):
    """The walk that counts a request's values without building them counts what
    msgpack builds, for every type and width of header."""
    packed = msgpack.packb(value, use_bin_type=True)
    assert p.codec._announced_values(packed) == values_in(value)


def test_value_count_walk_over_wide_headers():
    wide = [
        "s" * 70000,  # str 32
        b"b" * 70000,  # bin 32
        msgpack.ExtType(1, b"e" * 300),  # ext 16
        msgpack.ExtType(2, b"e" * 70000),  # ext 32
        list(range(20)),  # array 16
        {str(i): i for i in range(20)},  # map 16
        1.5,
        -(2**40),
    ]
    assert p.codec._announced_values(msgpack.packb(wide, use_bin_type=True)) == values_in(wide)
    # Not msgpack (0xC1 is never used, a header cut short): left to unpacking to name.
    assert p.codec._announced_values(b"\x92\xc1\x00") == 0
    assert p.codec._announced_values(b"\x92\x00") == 0


def bombs() -> dict[str, bytes]:
    """Small frames that decode to huge objects (issue 26: 30 million empty maps, 2 GB)."""
    many = 3 * CAP
    return {
        "empty maps": ENVELOPE + b"\xdd" + many.to_bytes(4, "big") + b"\x80" * many,
        "small ints": ENVELOPE + b"\xdd" + many.to_bytes(4, "big") + b"\x01" * many,
        "deep nesting": ENVELOPE + b"\x91" * many + b"\xc0",
        # Many short arrays: no one container is long, together they are.
        "arrays of 15": ENVELOPE
        + b"\xdd"
        + (many // 16).to_bytes(4, "big")
        + (b"\x9f" + b"\x80" * 15) * (many // 16),
        "map pairs": ENVELOPE + b"\xdf" + many.to_bytes(4, "big") + b"\x00\x80" * many,
        "in the client id": b"\x95\x00\x00\x01\x91" + b"\x91" * many + b"\xc0\x80",
    }


@pytest.mark.parametrize("shape", list(bombs()))
def test_request_bombs_are_refused_before_they_are_built(shape):
    payload = bombs()[shape]
    tracemalloc.start()
    try:
        with pytest.raises(p.InvalidRequest, match=f"more than {CAP} msgpack values"):
            p.decode_request_envelope(payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # nothing of the body was built
    # The header is still readable, so the broker answers INVALID_REQUEST to it (except
    # when the client id itself is the bomb: that connection is closed).
    split = p.split_request_envelope(payload)
    if shape != "in the client id":
        assert split is not None and split[0].correlation_id == 1
        with pytest.raises(p.InvalidRequest):
            p.decode_request_body(split[1])


def test_large_requests_of_few_values_still_decode():
    # A Produce carries its bulk as one bin value; CAP values exactly are allowed.
    _, body = p.decode_request(
        p.encode_request(p.ApiKey.PRODUCE, 0, 1, "c", produce_body(b"x" * (4 * CAP)))[4:]
    )
    assert len(body["topics"][0]["partitions"][0]["records"]) == 4 * CAP
    exactly = ENVELOPE + b"\xdd" + (CAP - 6).to_bytes(4, "big") + b"\x00" * (CAP - 6)
    assert len(exactly) > CAP and p.codec._announced_values(exactly) == CAP
    assert len(p.decode_request_envelope(exactly)[1]) == CAP - 6
    with pytest.raises(p.InvalidRequest):
        p.decode_request_envelope(
            exactly[:7] + (CAP - 5).to_bytes(4, "big") + exactly[11:] + b"\x00"
        )


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.integers(0, 255))
def test_fuzz_large_hostile_requests_stay_bounded(pattern, filler):
    """Frames past the walk's threshold, of repeated hostile patterns: decoding raises
    only ProtocolError and builds at most a small multiple of the frame."""
    payload = ENVELOPE + (pattern * (CAP // len(pattern) + 2)) + bytes([filler]) * 16
    tracemalloc.start()
    try:
        try:
            p.decode_request_envelope(payload)
        except p.ProtocolError:
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * len(payload) + (16 << 20)
