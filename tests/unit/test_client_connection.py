"""The connection's own logic: matching by correlation id, failing in-flight calls, clear errors.

The peer here is a few lines of frame echoing, enough to reorder answers or hang up;
real broker behaviour is covered by the integration tests.
"""

import pytest
import trio

from minibroker.client.connection import BrokerConnection
from minibroker.deploy.launcher import free_port
from minibroker.protocol import ApiKey, FrameDecoder, decode_request, encode_response
from minibroker.protocol.errors import (
    BrokerNotAvailable,
    NetworkException,
    RequestTimedOut,
    UnsupportedVersion,
)


async def serve(handler, task_status=trio.TASK_STATUS_IGNORED):
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])

    async def conn(stream):
        decoder = FrameDecoder()
        async with stream:
            async for data in stream:
                for payload in decoder.feed(data):
                    await handler(stream, *decode_request(payload))

    await trio.serve_listeners(conn, listeners)


def stats(broker_id):
    return {"error_code": 0, "broker_id": broker_id, "stats": {}}


async def test_answers_out_of_order_reach_the_right_caller(nursery):
    held = []

    async def handler(stream, header, body):
        held.append(header.correlation_id)
        if len(held) == 2:  # answer the second first
            for corr in reversed(held):
                await stream.send_all(encode_response(corr, stats(corr)))

    port = await nursery.start(serve, handler)
    conn = await BrokerConnection.open(nursery, "127.0.0.1", port)
    results = {}

    async def ask(name):
        results[name] = await conn.request(ApiKey.BROKER_STATS, {})

    async with trio.open_nursery() as inner:
        inner.start_soon(ask, "a")
        await trio.testing.wait_all_tasks_blocked()
        inner.start_soon(ask, "b")
    assert results["a"]["broker_id"] == held[0]
    assert results["b"]["broker_id"] == held[1]
    await conn.aclose()


async def test_top_level_error_code_raises_its_exception(nursery):
    async def handler(stream, header, body):
        await stream.send_all(
            encode_response(header.correlation_id, {"error_code": 35, "error_message": "nope"})
        )

    port = await nursery.start(serve, handler)
    conn = await BrokerConnection.open(nursery, "127.0.0.1", port)
    with pytest.raises(UnsupportedVersion, match="nope"):
        await conn.request(ApiKey.BROKER_STATS, {})
    await conn.aclose()


async def test_a_dead_connection_fails_every_caller(nursery):
    async def handler(stream, header, body):
        if header.correlation_id == 3:
            await stream.aclose()

    port = await nursery.start(serve, handler)
    conn = await BrokerConnection.open(nursery, "127.0.0.1", port)
    errors = []

    async def ask():
        try:
            await conn.request(ApiKey.BROKER_STATS, {}, timeout=10)
        except NetworkException as exc:
            errors.append(exc)

    async with trio.open_nursery() as inner:
        for _ in range(3):
            inner.start_soon(ask)
    assert len(errors) == 3
    with pytest.raises(NetworkException):
        await conn.request(ApiKey.BROKER_STATS, {})


async def test_no_answer_is_request_timed_out(nursery):
    async def handler(stream, header, body):
        pass

    port = await nursery.start(serve, handler)
    conn = await BrokerConnection.open(nursery, "127.0.0.1", port)
    with pytest.raises(RequestTimedOut, match="BROKER_STATS"):
        await conn.request(ApiKey.BROKER_STATS, {}, timeout=0.05)
    await conn.aclose()


async def test_unreachable_broker_is_one_clear_error(nursery):
    port = free_port()
    with pytest.raises(
        BrokerNotAvailable, match=f"cannot connect to 127.0.0.1:{port}: connection refused"
    ):
        await BrokerConnection.open(nursery, "127.0.0.1", port)


class MetadataScript:
    """Stands in for the network under Cluster.refresh: one metadata answer per refresh."""

    def __init__(self, answers):
        self.answers = list(answers)

    def body(self):
        topic = self.answers.pop(0)
        return {"brokers": [], "controller_id": -1, "topics": [topic] if topic else []}


def missing(code):
    return {"name": "t", "error_code": code, "partitions": []}


PRESENT = {
    "name": "t",
    "error_code": 0,
    "partitions": [
        {
            "partition": 0,
            "error_code": 0,
            "leader": 0,
            "leader_epoch": 0,
            "replicas": [0],
            "isr": [0],
        }
    ],
}


async def scripted_cluster(nursery, answers):
    from minibroker.client.cluster import Cluster
    from minibroker.client.config import load_config

    script = MetadataScript(answers)
    cluster = Cluster(load_config("producer", {}), nursery)

    async def any_request(api_key, body, timeout=None):
        return script.body()

    cluster.any_request = any_request
    return cluster


async def test_wait_for_topic_waits_out_not_yet_answers(nursery, autojump_clock):
    cluster = await scripted_cluster(nursery, [missing(3), missing(5), None, PRESENT])
    await cluster.wait_for_topic("t", timeout=60, backoff=1)
    assert cluster.partition_count("t") == 1


async def test_wait_for_topic_raises_another_error_at_once(nursery, autojump_clock):
    from minibroker.protocol.errors import InvalidTopic

    cluster = await scripted_cluster(nursery, [missing(3), missing(17)])
    with pytest.raises(InvalidTopic, match="topic 't'"):
        await cluster.wait_for_topic("t", timeout=60, backoff=1)


async def test_wait_for_topic_gives_up_after_its_timeout(nursery, autojump_clock):
    from minibroker.protocol.errors import UnknownTopicOrPartition

    cluster = await scripted_cluster(nursery, [missing(3)] * 100)
    with pytest.raises(UnknownTopicOrPartition, match="not in the cluster metadata after 5000 ms"):
        await cluster.wait_for_topic("t", timeout=5, backoff=1)


async def test_wait_for_topic_says_why_when_no_broker_answered(nursery, autojump_clock):
    from minibroker.client.cluster import Cluster
    from minibroker.client.config import load_config

    cluster = Cluster(load_config("producer", {}), nursery)

    async def any_request(api_key, body, timeout=None):
        raise BrokerNotAvailable("no broker answered METADATA: 127.0.0.1:1 (connection refused)")

    cluster.any_request = any_request
    with pytest.raises(BrokerNotAvailable, match=r"after 5000 ms: no broker answered") as failed:
        await cluster.wait_for_topic("t", timeout=5, backoff=1)
    assert "UNKNOWN_TOPIC" not in str(failed.value)  # nobody said the topic is missing
    # ... and so does what the producer reports for a record parked on that topic.
    assert isinstance(cluster.topic_error("t", "topic 't'"), BrokerNotAvailable)


# --- peers that are not (answering) brokers --------------------------------------------------


async def serve_raw(on_connect, task_status=trio.TASK_STATUS_IGNORED):
    """A TCP server that hands each accepted stream to ``on_connect`` and keeps it open."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])

    async def conn(stream):
        async with stream:
            await on_connect(stream)
            await trio.sleep_forever()

    await trio.serve_listeners(conn, listeners)


async def silent(stream):
    """Accept and never answer, as a paused broker's kernel does."""


async def http_like(stream):
    """Answer anything with an HTTP error, as `python3 -m http.server` would."""
    await stream.receive_some(1)
    await stream.send_all(b"HTTP/1.0 400 Bad request\r\nContent-Length: 0\r\n\r\n")


async def broker_like(stream):
    """ApiVersions and Metadata answered, enough to be a bootstrap broker."""
    decoder = FrameDecoder()
    async for data in stream:
        for payload in decoder.feed(data):
            header, _ = decode_request(payload)
            body = (
                {"error_code": 0, "api_versions": []}
                if header.api_key == ApiKey.API_VERSIONS
                else {"brokers": [], "controller_id": -1, "topics": []}
            )
            await stream.send_all(encode_response(header.correlation_id, body))


async def test_a_silent_peer_fails_the_handshake_in_time(nursery):
    port = await nursery.start(serve_raw, silent)
    with trio.fail_after(5):
        with pytest.raises(BrokerNotAvailable, match=f"127.0.0.1:{port}: no answer in 200 ms"):
            await BrokerConnection.open(nursery, "127.0.0.1", port, api_version_timeout=0.2)


async def test_an_http_server_is_named_as_not_minibroker(nursery):
    port = await nursery.start(serve_raw, http_like)
    with trio.fail_after(5):
        with pytest.raises(
            BrokerNotAvailable, match="does not speak minibroker's protocol: it sent text"
        ):
            await BrokerConnection.open(nursery, "127.0.0.1", port, api_version_timeout=10)


def hedging_cluster(nursery, ports, **settings):
    from minibroker.client.cluster import Cluster
    from minibroker.client.config import load_config

    bootstrap = ",".join(f"127.0.0.1:{p}" for p in ports)
    config = {"bootstrap.servers": bootstrap, "api.version.request.timeout.ms": 300, **settings}
    return Cluster(load_config("admin", config), nursery)


async def test_a_silent_bootstrap_broker_costs_one_hedge_delay_once(nursery):
    accepted = []

    async def counting_silent(stream):
        accepted.append(stream)

    quiet = await nursery.start(serve_raw, counting_silent)
    live = await nursery.start(serve_raw, broker_like)
    # request.timeout.ms of a minute: only the hedge can make this fast.
    cluster = hedging_cluster(nursery, [quiet, live], **{"request.timeout.ms": 60000})
    with trio.fail_after(5):
        start = trio.current_time()
        await cluster.refresh(())
        first = trio.current_time() - start
        await cluster.refresh(())  # the silent one is asked last now: no hedge delay
        second = trio.current_time() - start - first
    assert first >= 0.25  # hedge.delay.ms: the live broker was asked after it
    assert second < 0.25
    assert len(accepted) == 1


async def test_no_answer_names_every_address_and_what_happened(nursery):
    refused = free_port()
    quiet = await nursery.start(serve_raw, silent)
    http = await nursery.start(serve_raw, http_like)
    cluster = hedging_cluster(nursery, [refused, quiet, http])
    with trio.fail_after(5):
        with pytest.raises(BrokerNotAvailable) as failed:
            await cluster.refresh(["t"])
    message = str(failed.value)
    assert message.startswith("BROKER_NOT_AVAILABLE: no broker answered METADATA: ")
    assert f"127.0.0.1:{refused} (connection refused)" in message
    assert f"127.0.0.1:{quiet} (no answer in 300 ms)" in message
    assert f"127.0.0.1:{http} (does not speak minibroker's protocol" in message
    assert "UNKNOWN_TOPIC" not in message


async def test_a_topic_error_says_the_brokers_message_once(nursery):
    """`topics describe nosuch` printed "topic 'nosuch' does not exist (topic 'nosuch'
    does not exist)": the broker's message began with ours."""
    from minibroker.client.cluster import Cluster
    from minibroker.client.config import load_config
    from minibroker.protocol.errors import ErrorCode, InvalidTopic, UnknownTopicOrPartition

    cluster = Cluster(load_config("producer", {}), nursery)
    said = "topic 'x' does not exist"
    cluster.topic_errors["x"] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, said)
    for ours in (said, "topic 'x'"):
        error = cluster.topic_error("x", ours)
        assert isinstance(error, UnknownTopicOrPartition)
        assert str(error) == f"UNKNOWN_TOPIC_OR_PARTITION: {said}"
    # A message that adds something is still kept, after ours.
    cluster.topic_errors["y"] = (ErrorCode.INVALID_TOPIC_EXCEPTION, "name too long")
    assert (
        str(cluster.topic_error("y", "topic 'y'"))
        == "INVALID_TOPIC_EXCEPTION: topic 'y' (name too long)"
    )
    assert isinstance(cluster.topic_error("y", "topic 'y'"), InvalidTopic)
