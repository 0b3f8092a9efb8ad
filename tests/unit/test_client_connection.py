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
