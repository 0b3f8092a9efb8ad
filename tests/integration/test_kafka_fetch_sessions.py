"""Incremental fetch sessions (KIP-227) with a stock client that uses them: kafka-python
consumes across several partitions led by different brokers, through sessions the brokers
create (their stats say so), and gets every record once, in order."""

from __future__ import annotations

import logging
import socket
import struct
import time

import pytest
from confluent_kafka import Producer as RdProducer
from confluent_kafka.admin import AdminClient, NewTopic

from minibroker.deploy.stats_cli import render
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol.errors import ErrorCode
from minibroker.protocol.kafka import KafkaApi, KafkaRequestHeader, decode_response, encode_request
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

PARTITIONS = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("fetch-sessions"), 3, dict(DEFAULT_CONFIG))
    yield cluster
    cluster.close()


def create(cluster, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 3)]).values():
        future.result(30)
    for p in range(PARTITIONS):  # the answering broker knows it; the others a moment later
        cluster.wait_for_leader(topic, p)


def produce(cluster, topic: str, per_partition: int, start: int = 0) -> None:
    producer = RdProducer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"})
    for i in range(start, start + per_partition):
        for p in range(PARTITIONS):
            producer.produce(topic, b"%d-%d" % (p, i), partition=p)
    assert producer.flush(30) == 0


def session_stats(cluster) -> list[dict]:
    return [cluster.stats(b)["fetch_sessions"] for b in range(3)]


def consume(consumer, wanted: int, got: dict[int, list]) -> None:
    deadline = time.monotonic() + 60
    while sum(map(len, got.values())) < wanted:
        assert time.monotonic() < deadline, {p: len(v) for p, v in got.items()}
        for tp, records in consumer.poll(timeout_ms=500).items():
            got.setdefault(tp.partition, []).extend((r.offset, r.value) for r in records)


def test_kafka_python_consumes_many_partitions_through_incremental_sessions(cluster, caplog):
    from kafka import KafkaConsumer, TopicPartition

    create(cluster, "sessions")
    leaders = {cluster.leader("sessions", p) for p in range(PARTITIONS)}
    before = session_stats(cluster)
    produce(cluster, "sessions", 50)
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap.split(","),
        enable_auto_commit=False,
        max_partition_fetch_bytes=512,  # a few records a fetch: many incremental rounds
    )
    caplog.set_level(logging.DEBUG, logger="kafka.consumer.fetcher")
    got: dict[int, list] = {}
    try:
        partitions = [TopicPartition("sessions", p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        consume(consumer, 50 * PARTITIONS, got)
        # Records that arrive while the consumer is in its sessions reach it too.
        produce(cluster, "sessions", 25, start=50)
        consume(consumer, 75 * PARTITIONS, got)
        during = session_stats(cluster)
    finally:
        consumer.close()
    # Every record once, in order, in every partition.
    assert {p: [o for o, _ in rows] for p, rows in got.items()} == {
        p: list(range(75)) for p in range(PARTITIONS)
    }
    assert {p: [v for _, v in rows] for p, rows in got.items()} == {
        p: [b"%d-%d" % (p, i) for i in range(75)] for p in range(PARTITIONS)
    }
    # One session on each leader the consumer fetched from, created once and kept: had
    # an incremental answer been wrong, kafka-python would have dropped it and made another.
    created = [d["created"] - b["created"] for b, d in zip(before, during, strict=True)]
    assert [c > 0 for c in created] == [b in leaders for b in range(3)]
    assert sum(d["sessions"] for d in during) >= len(leaders)
    assert max(created) == 1, created
    complaints = [r.getMessage() for r in caplog.records if "invalid" in r.getMessage()]
    assert complaints == []
    incremental = [r for r in caplog.records if "incremental fetch response for session" in r.getMessage()]  # fmt: skip
    assert incremental, "kafka-python never fetched incrementally"


def test_an_unknown_session_is_refused_on_the_wire(cluster):
    create(cluster, "no-session")
    leader = cluster.leader("no-session")
    header = KafkaRequestHeader(KafkaApi.FETCH, 11, 5, "t")
    body = {
        "max_wait_ms": 0,
        "min_bytes": 0,
        "session_id": 123456,
        "session_epoch": 3,
        "topics": [],
        "forgotten_topics_data": [],
    }
    port = cluster.state.kafka_base_port + leader
    with socket.create_connection((cluster.state.host, port), timeout=30) as sock:
        sock.sendall(encode_request(header, body))
        stream = sock.makefile("rb")
        (size,) = struct.unpack(">i", stream.read(4))
        answer = decode_response(header, stream.read(size))
    assert answer["error_code"] == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert (answer["session_id"], answer["responses"]) == (0, [])


def test_followers_replicate_through_sessions_holding_every_partition_they_follow(cluster):
    """Between brokers a Fetch names only what changed (broker/replication/fetch_sessions.py):
    acks=all writes still complete, and each leader's sessions, one per follower, hold
    every partition a follower follows from it, the idle ones included."""
    topic = "replicated-through-sessions"
    create(cluster, topic)
    produce(cluster, topic, 20)  # acks=all: both followers of each partition caught up

    def sessions_hold_every_followed_partition() -> bool:
        for broker in range(3):
            stats = cluster.stats(broker)
            followed = sum(
                len(p["replicas"]) - 1 for p in stats["partitions"] if p["leader"] == broker
            )
            held = stats["replica_fetch_sessions"]
            if (held["sessions"], held["partitions_cached"]) != (2, followed):
                return False
        return True

    wait_until(sessions_hold_every_followed_partition, 30, "follower sessions on every leader")
    shown = render({"broker_id": 0, "stats": cluster.stats(0)})  # `minibroker stats`
    assert "follower fetch sessions 2  partitions cached " in shown
    before = [cluster.stats(b)["replica_fetch_sessions"] for b in range(3)]
    produce(cluster, topic, 20, start=20)  # and again, through the incremental fetches
    after = [cluster.stats(b)["replica_fetch_sessions"] for b in range(3)]
    for was, now in zip(before, after, strict=True):
        # Each leader's followers fetched in their sessions, naming only what changed.
        assert now["incremental_fetches"] > was["incremental_fetches"]
    high_watermarks = {
        p["partition"]: p["high_watermark"]
        for b in range(3)
        for p in cluster.stats(b)["partitions"]
        if p["topic"] == topic and p["leader"] == b
    }
    assert high_watermarks == dict.fromkeys(range(PARTITIONS), 40)
