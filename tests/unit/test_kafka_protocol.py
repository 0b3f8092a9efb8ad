"""The Kafka listener's codec (from Kafka's JSON specs) and v2 record batches, and how a
stock client's batch is kept inside ours."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.kafka.batches import RefusedBatch, to_kafka, wrap_produce
from minibroker.protocol import ProtocolError, check_batch, decode_records, encode_batch
from minibroker.protocol.batch import (
    CRC_AT,
    CRC_START,
    KAFKA_FLAG,
    TRANSACTIONAL_FLAG,
    CorruptBatch,
    iter_batches,
    patch_base_offset,
    unpack_header,
)
from minibroker.protocol.errors import ErrorCode
from minibroker.protocol.kafka import (
    SUPPORTED,
    KafkaApi,
    KafkaRequestHeader,
    KafkaUnsupported,
    api_versions_body,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    message_codec,
    unsupported_response,
)
from minibroker.protocol.kafka import records as kr
from minibroker.protocol.kafka.codec import SPEC_NAMES

ROWS = [
    (1_700_000_000_000, b"k0", b"v0", [("h", b"x"), ("n", None)]),
    (1_700_000_000_005, None, b"v1", []),
    (1_700_000_000_003, b"k2", None, []),
]


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(k, v) for k, (low, high) in SUPPORTED.items() for v in range(low, high + 1)],
)
def test_every_served_version_round_trips_a_request(api_key, version):
    header = KafkaRequestHeader(api_key, version, 42, "client")
    request = message_codec(SPEC_NAMES[api_key] + "Request", version)
    body = request.decode(request.encode({}))  # every field at its spec default
    frame = encode_request(header, body)
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    assert decode_request(frame[4:]) == (header, body)


def test_produce_request_carries_its_fields():
    header = KafkaRequestHeader(KafkaApi.PRODUCE, 8, 7, "rdkafka")
    records = kr.encode_batch(ROWS)
    body = {
        "acks": -1,
        "timeout_ms": 1500,
        "topic_data": [{"name": "t", "partition_data": [{"index": 2, "records": records}]}],
    }
    _, decoded = decode_request(encode_request(header, body)[4:])
    assert decoded["acks"] == -1 and decoded["timeout_ms"] == 1500
    assert decoded["transactional_id"] is None
    assert decoded["topic_data"][0]["partition_data"][0] == {"index": 2, "records": records}


def test_api_versions_v3_is_flexible_but_its_response_header_is_v0():
    header = KafkaRequestHeader(KafkaApi.API_VERSIONS, 3, 9, "rdkafka")
    frame = encode_request(header, {"client_software_name": "x", "client_software_version": "1"})
    assert decode_request(frame[4:])[1]["client_software_name"] == "x"
    answer = encode_response(header, api_versions_body())
    # correlation id, then the body at once: no tagged-field byte in between (header v0)
    assert answer[4:8] == struct.pack(">i", 9) and answer[8:10] == b"\x00\x00"
    keys = decode_response(header, answer[4:])["api_keys"]
    assert {k["api_key"]: (k["min_version"], k["max_version"]) for k in keys} == SUPPORTED


def test_an_unserved_version_is_answered_not_dropped():
    with pytest.raises(KafkaUnsupported) as caught:
        decode_request(
            encode_request(KafkaRequestHeader(KafkaApi.API_VERSIONS, 4, 5, None), {})[4:]
        )
    answer = unsupported_response(caught.value.header)
    body = decode_response(KafkaRequestHeader(KafkaApi.API_VERSIONS, 0, 5, None), answer[4:])
    assert body["error_code"] == ErrorCode.UNSUPPORTED_VERSION and body["api_keys"]
    update_features = struct.pack(">hhih", 57, 0, 6, -1) + b"\x00" * 8  # no spec here
    with pytest.raises(KafkaUnsupported) as caught:
        decode_request(update_features)
    assert unsupported_response(caught.value.header)[4:] == struct.pack(">ih", 6, 35)


@pytest.mark.parametrize("codec", [kr.NONE, kr.GZIP, kr.SNAPPY, kr.LZ4, kr.ZSTD])
def test_v2_batches_round_trip_with_every_codec(codec):
    batch = kr.encode_batch(ROWS, base_offset=10, compression=codec)
    header = kr.check_batch(batch, 0, len(batch))
    assert header.compression == codec and header.record_count == 3
    _, rows = kr.decode_records(batch)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in rows] == [
        (10 + i, *row) for i, row in enumerate(ROWS)
    ]


def test_a_damaged_v2_batch_is_refused_by_its_crc():
    batch = bytearray(kr.encode_batch(ROWS))
    batch[-1] ^= 1
    with pytest.raises(kr.CorruptKafkaBatch, match="CRC-32C"):
        kr.check_batch(batch, 0, len(batch))
    with pytest.raises(RefusedBatch) as refused:
        wrap_produce(bytes(batch))
    assert refused.value.code == ErrorCode.CORRUPT_MESSAGE


def test_an_unknown_codec_is_refused_as_unsupported_compression():
    batch = bytearray(kr.encode_batch(ROWS))
    batch[kr.CRC_START + 1] |= 0x07  # compression 7: no such codec
    struct.pack_into(">I", batch, kr.CRC_AT, kr.crc32c(batch[kr.CRC_START :]))
    with pytest.raises(RefusedBatch) as refused:
        wrap_produce(bytes(batch))
    assert refused.value.code == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


@pytest.mark.parametrize("producer_id", [-1, 77])
def test_a_wrapped_batch_is_ours_and_unwraps_to_the_clients_bytes(producer_id):
    kafka = kr.encode_batch(ROWS, compression=kr.LZ4, producer_id=producer_id,
                            producer_epoch=0, base_sequence=5)  # fmt: skip
    ours = bytearray(wrap_produce(kafka))
    header = check_batch(ours, 0, len(ours))  # our CRC, our checks, as storage runs them
    assert header.attributes & KAFKA_FLAG and header.record_count == 3
    assert header.first_timestamp == ROWS[0][0] and header.max_timestamp == ROWS[1][0]
    patch_base_offset(ours, 0, 1000)  # what the leader does: the CRCs stay valid
    check_batch(ours, 0, len(ours))
    served = to_kafka(bytes(ours))
    assert served[12:] == kafka[12:] and kr.unpack_header(served).base_offset == 1000
    kr.check_batch(served, 0, len(served))
    # ... and our own client reads it through the native listener
    rows = decode_records(ours, 0, unpack_header(ours))
    assert [(r.offset, r.key, r.value, r.headers) for r in rows] == [
        (1000 + i, k, v, h) for i, (_, k, v, h) in enumerate(ROWS)
    ]


@pytest.mark.parametrize("producer_id", [-1, 77])
def test_a_wrapped_batch_is_checked_by_its_clients_crc32c_and_every_byte_counts(producer_id):
    """A stored stock batch keeps its client's CRC-32C as its CRC (no second CRC of ours is
    computed): a flipped bit in the carried batch fails it, and so does one in our header
    or producer fields, which the CRC-32C does not cover but must repeat the carried
    batch's own."""
    kafka = kr.encode_batch(ROWS, producer_id=producer_id, producer_epoch=0, base_sequence=5)
    ours = bytearray(wrap_produce(kafka))
    header = check_batch(ours, 0, len(ours))
    assert header.crc == kr.unpack_header(kafka).crc
    records_at = header.records_at
    places = [
        len(ours) - 1,  # a record
        records_at + kr.CRC_START - kr.MAGIC_AT,  # the carried batch's attributes
        CRC_START + 2,  # our last_offset_delta
        CRC_START + 6,  # our first timestamp
        CRC_START + 14,  # our max timestamp
        CRC_START + 25,  # our record count
        records_at - 1,  # our producer fields (or our record count, without them)
        CRC_START + 1,  # our attributes: the transactional bit
    ]
    for at in places:
        damaged = bytearray(ours)
        damaged[at] ^= 0x10
        with pytest.raises(CorruptBatch):
            check_batch(damaged, 0, len(damaged))


def test_a_stock_batch_wrapped_with_our_crc_before_crc32c_still_checks():
    """Logs written before wrapped batches kept their CRC-32C carry our zlib.crc32 over
    everything after the CRC field: they are checked that way, damage still caught."""
    ours = bytearray(wrap_produce(kr.encode_batch(ROWS)))
    struct.pack_into(">I", ours, CRC_AT, zlib.crc32(ours[CRC_START:]))
    assert check_batch(ours, 0, len(ours)).record_count == 3
    ours[-1] ^= 1
    with pytest.raises(CorruptBatch, match="CRC"):
        check_batch(ours, 0, len(ours))


def test_our_clients_batch_is_served_to_kafka_clients_record_for_record():
    ours = bytearray(encode_batch(ROWS) + encode_batch(ROWS[:1]))
    patch_base_offset(ours, 0, 5)
    second = [pos for pos, _ in iter_batches(ours)][1]
    patch_base_offset(ours, second, 8)
    served = to_kafka(bytes(ours) + b"\x00\x00")  # a cut-off tail is dropped
    rows = []
    for pos, size in kr.iter_batches(served):
        kr.check_batch(served, pos, size)
        rows += kr.decode_records(served, pos)[1]
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in rows] == [
        (5 + i, *row) for i, row in enumerate(ROWS)
    ] + [(8, *ROWS[0])]


@pytest.mark.parametrize("attributes", [0, TRANSACTIONAL_FLAG])
def test_our_producers_identity_and_transaction_bit_reach_kafka_clients(attributes):
    """A stock read_committed consumer skips an aborted transaction by producer id and the
    transactional bit: a re-encoded batch must keep both (and the epoch and sequence)."""
    ours = bytearray(encode_batch(ROWS, producer_id=77, producer_epoch=3, base_sequence=9,
                                  attributes=attributes))  # fmt: skip
    served = to_kafka(bytes(ours))
    header = kr.unpack_header(served)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 3, 9)
    assert header.attributes & kr.TRANSACTIONAL_FLAG == attributes
    plain = kr.unpack_header(to_kafka(bytes(encode_batch(ROWS))))
    assert (plain.producer_id, plain.attributes & kr.TRANSACTIONAL_FLAG) == (-1, 0)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_the_protocols_error(data):
    try:
        decode_request(data)
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_real_requests_raise_only_the_protocols_error(data):
    key = data.draw(st.sampled_from(sorted(SUPPORTED)))
    low, high = SUPPORTED[key]
    version = data.draw(st.integers(low, high))
    request = message_codec(SPEC_NAMES[key] + "Request", version)
    frame = bytearray(
        encode_request(KafkaRequestHeader(key, version, 1, "c"), request.decode(request.encode({})))
    )
    payload = frame[4:]
    for _ in range(data.draw(st.integers(1, 4))):
        if not payload:
            break
        at = data.draw(st.integers(0, len(payload) - 1))
        payload[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(payload)))
    try:
        decode_request(bytes(payload[:cut]))
    except ProtocolError:
        pass


# --- the consumer protocol's bytes (shared by our consumers and stock clients) ----------------


def test_consumer_protocol_round_trips_and_matches_kafka_python():
    from kafka.protocol.old.consumer_protocol import ConsumerProtocolMemberAssignment_v0

    from minibroker.client.assignors import decode_assignment, encode_assignment
    from minibroker.client.records import TopicPartition

    parts = [TopicPartition("a", 0), TopicPartition("a", 2), TopicPartition("b", 1)]
    ours = encode_assignment(parts)
    assert decode_assignment(ours) == parts
    theirs = ConsumerProtocolMemberAssignment_v0(0, [("a", [0, 2]), ("b", [1])], b"").encode()
    assert decode_assignment(theirs) == parts


def test_a_newer_consumer_protocol_version_is_read_as_ours():
    from minibroker.protocol.kafka import consumer_protocol as cp

    # v3 subscription: topics, user data, owned partitions, generation, rack id
    v3 = cp.encode(cp.SUBSCRIPTION, {"topics": ["t"], "generation_id": 4, "rack_id": "r"}, 3)
    future = struct.pack(">h", 9) + v3[2:] + b"fields from later versions"
    assert cp.decode(cp.SUBSCRIPTION, future)["topics"] == ["t"]
    with pytest.raises(ProtocolError):
        cp.decode(cp.SUBSCRIPTION, struct.pack(">h", -1))
    with pytest.raises(ProtocolError):
        cp.decode(cp.ASSIGNMENT, struct.pack(">hi", 0, 5))  # five topics promised, none there


def test_a_field_the_version_does_not_carry_reads_as_its_default():
    """Kafka's generated messages have every field at every version: a v4 Fetch's
    current_leader_epoch (v9+) is -1, so handlers need not know which version came."""
    header = KafkaRequestHeader(KafkaApi.FETCH, 4, 1, None)
    partition = {"partition": 0, "fetch_offset": 7, "partition_max_bytes": 100}
    body = {"max_wait_ms": 5, "topics": [{"topic": "t", "partitions": [partition]}]}
    first = decode_request(encode_request(header, body)[4:])[1]
    decoded = first["topics"][0]["partitions"][0]
    assert (decoded["fetch_offset"], decoded["current_leader_epoch"]) == (7, -1)
    assert first["forgotten_topics_data"] == []
    first["forgotten_topics_data"].append("x")  # each decoded body is its own
    second = decode_request(encode_request(header, body)[4:])[1]
    assert second["forgotten_topics_data"] == []
