"""DeleteTopics against a real 3-broker cluster: the metadata record commits, every broker
drops its replicas and their files, the name can be created again, and a consumer's long
poll on a deleted topic is answered with an error instead of waiting out its time."""

from __future__ import annotations

import time

import pytest
import trio

from minibroker.client import Admin, Consumer, NewTopic, Producer
from minibroker.client.connection import BrokerConnection
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, TopicDeletionDisabled, UnknownTopicOrPartition

pytestmark = pytest.mark.integration


def replica_dirs(state, topic: str) -> list[str]:
    """Every broker's partition directories of ``topic``."""
    return sorted(
        f"{d.parent.name}/{d.name}"
        for d in state.root.glob(f"broker-*/{topic}-*")
        if d.name.rpartition("-")[0] == topic
    )


async def produce_and_read(bootstrap: str, topic: str, values: list[bytes]) -> list[bytes]:
    async with Producer(bootstrap, acks="all") as producer:
        for value in values:
            await producer.send(topic, value, partition=0)
    got: list[bytes] = []
    async with Consumer(bootstrap, {"auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([(topic, 0)])
        with trio.fail_after(30):
            while len(got) < len(values):
                got += [r.value for r in await consumer.poll(timeout_ms=500)]
    return got


async def test_delete_removes_files_everywhere_and_the_name_can_be_created_again(
    cluster_factory,
):
    state = await cluster_factory(3)
    bootstrap = state.bootstrap
    async with Admin(bootstrap) as admin:
        await admin.create_topics([NewTopic("gone", 2, 3)])
    assert await produce_and_read(bootstrap, "gone", [b"a", b"b"]) == [b"a", b"b"]
    assert len(replica_dirs(state, "gone")) == 6  # 2 partitions x 3 replicas

    async with Admin(bootstrap) as admin:
        assert await admin.delete_topics(["gone"]) == {"gone": None}
        assert "gone" not in await admin.list_topics()
        # Returned once every broker dropped it: the files are gone on all three.
        assert replica_dirs(state, "gone") == []
        with pytest.raises(UnknownTopicOrPartition):
            await admin.delete_topics(["gone"])
        with pytest.raises(UnknownTopicOrPartition):
            await admin.describe_topics(["gone"])
        await admin.create_topics([NewTopic("gone", 1, 3)])
    # A new topic: its log starts empty, not from the old one's records.
    assert await produce_and_read(bootstrap, "gone", [b"new"]) == [b"new"]
    async with Admin(bootstrap) as admin:
        desc = (await admin.describe_topics(["gone"]))["gone"]
    assert len(desc.partitions) == 1


async def test_a_long_poll_on_a_deleted_topic_gets_an_error_not_a_hang(cluster_factory):
    # One broker: no follower fetches, so a parked fetch in its purgatory is ours.
    state = await cluster_factory(1)
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic("polled", 1, 1)])
    leader, host, port = 0, state.host, state.port(0)
    fetch = {
        "max_wait_ms": 30000,
        "min_bytes": 1,
        "topics": [{"name": "polled", "partitions": [{"partition": 0, "fetch_offset": 0}]}],
    }
    answers: list[tuple[float, dict]] = []
    async with trio.open_nursery() as nursery:
        conn = await BrokerConnection.open(nursery, host, port, client_id="long-poll")

        async def poll() -> None:
            started = time.monotonic()
            body = await conn.request(ApiKey.FETCH, fetch, timeout=60)
            answers.append((time.monotonic() - started, body))

        nursery.start_soon(poll)
        async with Admin(state.bootstrap) as admin:
            with trio.fail_after(10):  # the fetch parks in the leader's purgatory
                while not (await admin.broker_stats(leader))["stats"]["purgatory"]["fetch"][
                    "pending"
                ]:
                    await trio.sleep(0.01)
            assert not answers  # parked: nothing to read for 30 s
            await admin.delete_topics(["polled"])
        with trio.fail_after(10):  # far below its 30 s max_wait
            while not answers:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    waited, body = answers[0]
    assert body["topics"][0]["partitions"][0]["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert waited < 10


async def test_deletion_disabled_is_refused(cluster_factory):
    state = await cluster_factory(1, {"delete.topic.enable": False})
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic("kept", 1, 1)])
        with pytest.raises(TopicDeletionDisabled):
            await admin.delete_topics(["kept"])
        assert "kept" in await admin.list_topics()
