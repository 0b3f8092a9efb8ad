"""protocol.connection without sockets: ids, matching, dropped late answers, and the one
rule for a top-level error that both the broker's peer links and the client follow."""

import pytest

from minibroker.protocol import ApiKey, ProtocolError, decode_request, encode_response
from minibroker.protocol.connection import Connection, check_error
from minibroker.protocol.errors import (
    ErrorCode,
    FencedLeaderEpoch,
    InvalidRequest,
    KafkaError,
    NotController,
    UnsupportedVersion,
)


def stats(broker_id):
    return {"error_code": 0, "broker_id": broker_id, "stats": {}}


def ids_of(frames):
    return [decode_request(f[4:])[0].correlation_id for f in frames]


def test_answers_out_of_order_reach_their_own_waiter_even_fed_a_byte_at_a_time():
    conn = Connection("me")
    (a, fa), (b, fb) = (conn.send_request(ApiKey.BROKER_STATS, {}, waiter=w) for w in "ab")
    assert a != b and ids_of([fa, fb]) == [a, b]
    assert decode_request(fa[4:])[0].client_id == "me"
    assert conn.in_flight == 2
    wire = encode_response(b, stats(2)) + encode_response(a, stats(1))
    got = []
    for i in range(len(wire)):
        got += conn.receive_data(wire[i : i + 1])
    assert [(r.waiter, r.body["broker_id"]) for r in got] == [("b", 2), ("a", 1)]
    assert conn.in_flight == 0


def test_an_answer_after_the_caller_gave_up_is_dropped():
    conn = Connection(None)
    gone, _ = conn.send_request(ApiKey.BROKER_STATS, {}, waiter="gone")
    kept, _ = conn.send_request(ApiKey.BROKER_STATS, {}, waiter="kept")
    conn.forget(gone)
    out = conn.receive_data(encode_response(gone, stats(0)) + encode_response(kept, stats(1)))
    assert [r.waiter for r in out] == ["kept"]


def test_no_response_expected_leaves_nothing_pending():
    conn = Connection(None)
    conn.send_request(
        ApiKey.PRODUCE, {"acks": 0, "timeout_ms": 1, "topics": []}, expect_response=False
    )
    assert conn.in_flight == 0


def test_a_malformed_body_fails_that_request_only():
    conn = Connection(None)
    bad, _ = conn.send_request(ApiKey.BROKER_STATS, {}, waiter="bad")
    good, _ = conn.send_request(ApiKey.BROKER_STATS, {}, waiter="good")
    first, second = conn.receive_data(
        encode_response(bad, {"error_code": 0, "broker_id": "x", "stats": {}})
        + encode_response(good, stats(3))
    )
    assert first.body is None and "malformed BROKER_STATS response" in str(first.problem)
    with pytest.raises(ProtocolError):
        first.result()
    assert second.problem is None and second.result()["broker_id"] == 3


def test_unframeable_bytes_raise_and_fail_all_returns_every_waiter():
    conn = Connection(None, max_frame_bytes=100)
    for w in ("x", "y"):
        conn.send_request(ApiKey.BROKER_STATS, {}, waiter=w)
    with pytest.raises(ProtocolError):
        conn.receive_data(b"\x00\x00\x10\x00")
    assert sorted(conn.fail_all()) == ["x", "y"] and conn.in_flight == 0


def test_a_top_level_error_raises_its_class_on_every_api():
    with pytest.raises(UnsupportedVersion, match="nope"):
        check_error(ApiKey.FETCH, {"error_code": 35, "error_message": "nope"})
    # Not only a bare error body: a non-zero top-level code is the request's verdict.
    with pytest.raises(NotController):
        check_error(ApiKey.CREATE_TOPICS, {"error_code": 41, "topics": []})
    with pytest.raises(FencedLeaderEpoch):
        check_error(ApiKey.BROKER_HEARTBEAT, {"error_code": 74, "metadata": None})


def test_per_item_errors_are_the_callers_to_read():
    produce = {
        "error_code": 0,
        "topics": [{"name": "t", "partitions": [{"partition": 0, "error_code": 6}]}],
    }
    assert check_error(ApiKey.PRODUCE, produce) is produce


def test_alter_partition_returns_its_rejection_with_the_current_isr():
    """AlterPartition is about one partition: a stale proposal comes back INVALID_REQUEST
    with the ISR to catch up from (broker/server.py propose_isr reads it)."""
    body = {"error_code": 42, "error_message": "stale", "isr": [0, 1], "partition_epoch": 7}
    assert check_error(ApiKey.ALTER_PARTITION, body)["isr"] == [0, 1]


def test_one_class_per_error_the_decoders_verdicts_included():
    exc = InvalidRequest("topics[0]: expected map")
    assert isinstance(exc, KafkaError) and isinstance(exc, ProtocolError)
    assert exc.code is ErrorCode.INVALID_REQUEST and exc.message == "topics[0]: expected map"
