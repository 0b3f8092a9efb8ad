"""Stock Kafka clients (confluent-kafka, kafka-python, aiokafka, kcat) against a real
cluster's Kafka listeners: the same partitions, purgatories and replication as ours."""

from __future__ import annotations

import asyncio
import select
import shutil
import socket
import struct
import subprocess
import threading
import time

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from minibroker.client import SyncConsumer, SyncProducer
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol.kafka import (
    KafkaApi,
    KafkaRequestHeader,
    decode_response,
    encode_request,
)
from minibroker.protocol.kafka import records as kafka_records
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

ROWS = [(b"k%d" % i, b"value-%d" % i, [("h", b"%d" % i)]) for i in range(200)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(
        tmp_path_factory.mktemp("kafka"),
        3,
        {**DEFAULT_CONFIG, "replica.lag.time.max.ms": 1500},
    )
    yield cluster
    cluster.close()


# --- one client each: create, produce acks=all, consume from the beginning (assign) ------


def rd_create(bootstrap: str, name: str, partitions: int = 1, config: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(name, partitions, 3, config=config or {})]
    ).values():
        future.result(30)


def rd_consume(bootstrap: str, topic: str, count: int, partition: int = 0, **conf) -> list:
    consumer = RdConsumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False, **conf}
    )
    try:
        consumer.assign([RdTopicPartition(topic, partition, 0)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message)
        return got
    finally:
        consumer.close()


def test_confluent_kafka_creates_produces_acks_all_and_consumes(cluster):
    bootstrap = cluster.kafka_bootstrap
    rd_create(bootstrap, "rd")
    producer = RdProducer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True}
    )
    offsets = []
    for key, value, headers in ROWS:
        producer.produce(
            "rd",
            value,
            key,
            headers=headers,
            on_delivery=lambda e, m: offsets.append((e, m.offset())),
        )
    assert producer.flush(30) == 0
    assert [e for e, _ in offsets if e is not None] == []
    assert sorted(o for _, o in offsets) == list(range(len(ROWS)))
    got = rd_consume(bootstrap, "rd", len(ROWS))
    assert [(m.offset(), m.key(), m.value(), m.headers()) for m in got] == [
        (i, k, v, h) for i, (k, v, h) in enumerate(ROWS)
    ]


def test_kafka_python_creates_produces_acks_all_and_consumes(cluster):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KpNewTopic

    bootstrap = cluster.kafka_bootstrap.split(",")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([KpNewTopic("kp", 1, 3)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type="gzip")
    futures = [producer.send("kp", value=v, key=k, headers=h) for k, v, h in ROWS]
    producer.flush(30)
    assert [f.get(10).offset for f in futures] == list(range(len(ROWS)))
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = TopicPartition("kp", 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    got = []
    deadline = time.monotonic() + 30
    while len(got) < len(ROWS) and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=1000).values():
            got += records
    consumer.close()
    assert [(m.offset, m.key, m.value, m.headers) for m in got] == [
        (i, k, v, h) for i, (k, v, h) in enumerate(ROWS)
    ]


def test_aiokafka_creates_produces_acks_all_and_consumes(cluster):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewTopic as AioNewTopic

    bootstrap = cluster.kafka_bootstrap

    async def run() -> list:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        await admin.create_topics([AioNewTopic("aio", 1, 3)])
        await admin.close()
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=True,
            compression_type="zstd",
        )
        await producer.start()
        try:
            sent = [await producer.send_and_wait("aio", v, key=k, headers=h) for k, v, h in ROWS]
        finally:
            await producer.stop()
        assert [m.offset for m in sent] == list(range(len(ROWS)))
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition("aio", 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            got: list = []
            async with asyncio.timeout(30):
                while len(got) < len(ROWS):
                    for records in (await consumer.getmany(timeout_ms=1000)).values():
                        got += records
            return got
        finally:
            await consumer.stop()

    got = asyncio.run(run())
    assert [(m.offset, m.key, m.value, list(m.headers)) for m in got] == [
        (i, k, v, [(n, d) for n, d in h]) for i, (k, v, h) in enumerate(ROWS)
    ]


# --- both listeners, one log ---------------------------------------------------------------


def test_a_record_from_either_listener_reads_the_same_through_both(cluster):
    rd_create(cluster.kafka_bootstrap, "both")
    producer = RdProducer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"})
    producer.produce(
        "both", b"from-kafka", b"k1", headers=[("a", b"1")], timestamp=1_700_000_000_001
    )
    assert producer.flush(30) == 0
    with SyncProducer(cluster.bootstrap, acks="all") as ours:
        ours.send(
            "both", b"from-native", key=b"k2", headers=[("b", b"2")], timestamp=1_700_000_000_002
        )
    expected = [
        (0, 1_700_000_000_001, b"k1", b"from-kafka", [("a", b"1")]),
        (1, 1_700_000_000_002, b"k2", b"from-native", [("b", b"2")]),
    ]
    got = rd_consume(cluster.kafka_bootstrap, "both", 2)
    assert [
        (m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers()) for m in got
    ] == expected
    with SyncConsumer(cluster.bootstrap) as consumer:
        consumer.assign([("both", 0)])
        consumer.seek(("both", 0), 0)
        records = []
        while len(records) < 2:
            records += consumer.poll(timeout_ms=5000)
    # Our ConsumerRecord's headers are a tuple of pairs; confluent-kafka gives a list.
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records] == expected


# --- replication reaches stock clients --------------------------------------------------------


def test_acks_all_with_a_paused_follower_fails_once_the_isr_shrinks(cluster):
    rd_create(cluster.kafka_bootstrap, "strict", config={"min.insync.replicas": "3"})
    leader = cluster.leader("strict")
    follower = next(b for b in range(3) if b not in (leader, cluster.controller))
    cluster.pause(follower)
    try:
        cluster.wait_for_isr("strict", 0, [b for b in range(3) if b != follower])
        producer = RdProducer(
            {
                "bootstrap.servers": cluster.kafka_bootstrap,
                "acks": "all",
                "retries": 0,
                "request.timeout.ms": 2000,
                "message.timeout.ms": 10000,
            }
        )
        outcome = []
        producer.produce("strict", b"refused", on_delivery=lambda e, m: outcome.append(e))
        producer.flush(30)
    finally:
        cluster.resume(follower)
        cluster.wait_for_isr("strict", 0)  # back in: the next test needs three live brokers
    assert outcome and outcome[0] is not None
    assert outcome[0].code() in (
        RdKafkaError.NOT_ENOUGH_REPLICAS,
        RdKafkaError.REQUEST_TIMED_OUT,
    ), outcome[0]


def test_a_long_poll_returns_as_soon_as_a_record_arrives(cluster):
    rd_create(cluster.kafka_bootstrap, "wake")
    consumer = RdConsumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": "unused",
            "fetch.wait.max.ms": 30000,  # only the arrival can end this fetch in time
            "fetch.min.bytes": 1,
        }
    )
    consumer.assign([RdTopicPartition("wake", 0, 0)])
    assert consumer.poll(2) is None  # its fetch is parked now: nothing to read
    waited = []

    def poll() -> None:
        started = time.monotonic()
        message = None
        while message is None and time.monotonic() - started < 60:
            message = consumer.poll(0.5)
        waited.append((message, time.monotonic()))

    reader = threading.Thread(target=poll)
    reader.start()
    with SyncProducer(cluster.bootstrap, acks="all") as producer:
        sent_at = time.monotonic()
        producer.send("wake", b"now")
    reader.join(90)
    consumer.close()
    message, received_at = waited[0]
    assert message is not None and message.value() == b"now"
    assert received_at - sent_at < 15  # far inside fetch.wait.max.ms (30 s)


def test_leader_sigkill_and_the_client_fails_over(cluster):
    rd_create(cluster.kafka_bootstrap, "failover", partitions=3)
    # Leaders are spread: kill one that is not the controller (keep the quorum out of it).
    p = next(p for p in range(3) if cluster.leader("failover", p) != cluster.controller)
    leader = cluster.leader("failover", p)
    producer = RdProducer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all", "enable.idempotence": True}
    )
    producer.produce("failover", b"before", partition=p)
    assert producer.flush(30) == 0
    cluster.kill(leader)
    try:
        cluster.wait_for_leader("failover", p, not_on=[leader])
        failures = []
        producer.produce(
            "failover", b"after", partition=p, on_delivery=lambda e, m: failures.append(e)
        )
        assert producer.flush(60) == 0 and failures == [None]
        got = rd_consume(cluster.kafka_bootstrap, "failover", 2, partition=p)
        assert [m.value() for m in got] == [b"before", b"after"]
    finally:
        cluster.restart(leader)
        cluster.wait_for_isr("failover", p)


# --- kcat, and a client speaking out of turn -----------------------------------------------


def test_kcat_lists_produces_and_consumes(cluster):
    kcat = shutil.which("kcat")
    assert kcat, "kcat is not installed: deploy/test.sh installs it (apt-get install kcat)"
    bootstrap = cluster.kafka_bootstrap
    rd_create(bootstrap, "kc")
    listing = subprocess.run([kcat, "-b", bootstrap, "-L", "-t", "kc"], capture_output=True,
                             text=True, timeout=60, check=True).stdout  # fmt: skip
    assert "3 brokers" in listing and 'topic "kc" with 1 partitions' in listing
    subprocess.run([kcat, "-b", bootstrap, "-P", "-t", "kc", "-X", "acks=all"],
                   input="one\ntwo\n", text=True, timeout=60, check=True)  # fmt: skip
    out = subprocess.run([kcat, "-b", bootstrap, "-C", "-t", "kc", "-o", "beginning", "-e"],
                         capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    assert out.split() == ["one", "two"]


def test_an_unserved_api_is_answered_and_the_connection_kept(cluster):
    host, port = cluster.kafka_bootstrap.split(",")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        stream = sock.makefile("rwb")

        def ask(api_key: int, version: int, correlation_id: int) -> bytes:
            payload = struct.pack(">hhih", api_key, version, correlation_id, -1)
            stream.write(struct.pack(">i", len(payload)) + payload)
            stream.flush()
            (size,) = struct.unpack(">i", stream.read(4))
            return stream.read(size)

        assert ask(57, 0, 1) == struct.pack(">ih", 1, 35)  # UpdateFeatures: UNSUPPORTED_VERSION
        answer = ask(18, 0, 2)  # ApiVersions v0 on the same connection
        assert answer[:6] == struct.pack(">ih", 2, 0)


def test_answers_leave_in_request_order_behind_a_parked_fetch(cluster):
    """Kafka's protocol answers a connection in request order (kafka-python 3 drops the
    connection on a correlation id out of turn): a Metadata sent behind a long-polling
    Fetch is answered after it, not before."""
    rd_create(cluster.kafka_bootstrap, "in-order")
    leader = cluster.leader("in-order")
    host, port = cluster.state.host, cluster.state.kafka_base_port + leader
    fetch = KafkaRequestHeader(KafkaApi.FETCH, 4, 1, "t")
    metadata = KafkaRequestHeader(KafkaApi.METADATA, 1, 2, "t")
    partition = {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
    fetch_body = {
        "replica_id": -1,
        "max_wait_ms": 1500,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "topics": [{"topic": "in-order", "partitions": [partition]}],
    }
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(encode_request(fetch, fetch_body) + encode_request(metadata, {"topics": None}))
        stream = sock.makefile("rb")
        answered = []
        for header in (fetch, metadata):
            (size,) = struct.unpack(">i", stream.read(4))
            payload = stream.read(size)
            answered.append(struct.unpack_from(">i", payload)[0])
            assert decode_response(header, payload)["throttle_time_ms"] == 0
    assert answered == [1, 2]


@pytest.fixture(scope="module")
def patient_cluster(tmp_path_factory):
    """Followers that fetch nothing stay in the ISR (a parked acks=all produce stays
    parked), and a connection's send budget is small enough to fill in a test."""
    config = {
        **DEFAULT_CONFIG,
        "replica.lag.time.max.ms": 120_000,
        "queued.max.response.bytes": 16384,
        # A parked follower fetch reserves this much of its connection's budget: under it,
        # so only the test's own connection is ever muted.
        "replica.fetch.max.bytes": 4096,
        "replica.fetch.response.max.bytes": 4096,
    }
    own = start_cluster(tmp_path_factory.mktemp("patient"), 3, config)
    yield own
    own.close()


def raw_produce(correlation_id: int, topic: str, acks: int) -> tuple[KafkaRequestHeader, bytes]:
    header = KafkaRequestHeader(KafkaApi.PRODUCE, 8, correlation_id, "t")
    batch = kafka_records.encode_batch([(0, None, b"v%d" % correlation_id, ())])
    body = {
        "transactional_id": None,
        "acks": acks,
        "timeout_ms": 60_000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
    }
    return header, encode_request(header, body)


def parked_behind_quiet_followers(own, topic: str) -> int:
    """A topic whose followers fetch but keep nothing: its acks=all produces park."""
    rd_create(own.kafka_bootstrap, topic)
    leader = own.leader(topic)
    for follower in range(3):
        if follower != leader:
            own.drop_replication(follower, topic)
    return leader


def log_end(own, leader: int, topic: str) -> int:
    partitions = own.stats(leader)["partitions"]
    return next(p for p in partitions if p["topic"] == topic)["log_end_offset"]


def read_answers(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    stream = sock.makefile("rb")
    answers = []
    for _ in range(count):
        (size,) = struct.unpack(">i", stream.read(4))
        payload = stream.read(size)
        answers.append((struct.unpack_from(">i", payload)[0], payload))
    return answers


def test_pipelined_produces_are_appended_at_once_and_answered_in_order(patient_cluster):
    """While an acks=all Produce waits for its followers, the Produce pipelined behind it
    on the same connection is appended already (one replication round then acknowledges
    both; bench kafka-clients); its answer still leaves after the first's, and a Metadata
    behind them is not dispatched until both are answered, as in Kafka."""
    own = patient_cluster
    leader = parked_behind_quiet_followers(own, "pipelined")
    requests = [raw_produce(1, "pipelined", -1), raw_produce(2, "pipelined", -1)]
    metadata = KafkaRequestHeader(KafkaApi.METADATA, 1, 3, "t")
    requests.append((metadata, encode_request(metadata, {"topics": None})))
    host, port = own.state.host, own.state.kafka_base_port + leader
    try:
        with socket.create_connection((host, port), timeout=60) as sock:
            sock.sendall(b"".join(frame for _, frame in requests))
            deadline = time.monotonic() + 30
            while log_end(own, leader, "pipelined") < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            # Both produces appended, neither acknowledged, nothing answered yet.
            assert log_end(own, leader, "pipelined") == 2
            assert select.select([sock], [], [], 0)[0] == []
            own.clear_faults()
            answered = read_answers(sock, len(requests))
    finally:
        own.clear_faults()
    assert [cid for cid, _ in answered] == [1, 2, 3]
    for (header, _), (_, payload), offset in zip(requests, answered, (0, 1), strict=False):
        part = decode_response(header, payload)["responses"][0]["partition_responses"][0]
        assert (part["error_code"], part["base_offset"]) == (0, offset)


def test_answers_held_behind_a_parked_produce_count_against_the_send_budget(patient_cluster):
    """Answers made but held behind a parked one are charged to the connection's
    queued.max.response.bytes like queued answers: a client pipelining acks=1 produces
    behind a parked acks=all one is muted (TCP slows it), not buffered without bound."""
    own = patient_cluster
    leader = parked_behind_quiet_followers(own, "budget")
    count = 2000  # ~60 bytes an answer: far past the 16 KiB budget
    requests = [raw_produce(1, "budget", -1)]
    requests += [raw_produce(i, "budget", 1) for i in range(2, count + 1)]
    host, port = own.state.host, own.state.kafka_base_port + leader
    try:
        with socket.create_connection((host, port), timeout=60) as sock:
            # From a thread: once muted, the broker stops reading and sendall may block.
            sender = threading.Thread(
                target=sock.sendall, args=(b"".join(frame for _, frame in requests),)
            )
            sender.start()
            deadline = time.monotonic() + 30
            while own.stats(leader)["connections_muted"] < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert own.stats(leader)["connections_muted"] == 1
            assert 1 < log_end(own, leader, "budget") < count  # it stopped reading midway
            own.clear_faults()
            answered = read_answers(sock, count)
            sender.join(30)
    finally:
        own.clear_faults()
    assert [cid for cid, _ in answered] == list(range(1, count + 1))
    offsets = []
    for (header, _), (_, payload) in zip(requests, answered, strict=True):
        part = decode_response(header, payload)["responses"][0]["partition_responses"][0]
        assert part["error_code"] == 0
        offsets.append(part["base_offset"])
    assert offsets == list(range(count))


def test_the_fault_api_fails_kafka_produces_too(cluster):
    rd_create(cluster.kafka_bootstrap, "faulty")
    leader = cluster.leader("faulty")
    cluster.fail_api(leader, "produce", "NOT_ENOUGH_REPLICAS", count=-1)
    try:
        producer = RdProducer(
            {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all", "retries": 0}
        )
        outcome = []
        producer.produce("faulty", b"x", on_delivery=lambda e, m: outcome.append(e))
        producer.flush(30)
    finally:
        cluster.clear_faults(leader)
    assert outcome and outcome[0].code() == RdKafkaError.NOT_ENOUGH_REPLICAS


def test_bench_kafka_clients_idle_topics_are_followed_in_sync_and_deleted_after(cluster):
    """`bench kafka-clients --idle-topics N` measures what idle partitions cost the brokers:
    they must be followed (every replica in sync) before the run, and gone after it."""
    import argparse

    from minibroker.deploy.bench import kafka_clients

    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    names = ["idle-check-0", "idle-check-1"]
    kafka_clients.create_idle_topics(cluster.kafka_bootstrap, names)
    listed = admin.list_topics(timeout=10).topics
    for name in names:
        assert sorted(listed[name].partitions) == [0, 1, 2]
        assert all(len(p.isrs) == 3 for p in listed[name].partitions.values())
    kafka_clients.delete_topics(cluster.kafka_bootstrap, names)

    parser = argparse.ArgumentParser()
    kafka_clients.add_arguments(parser)
    base = ["--bootstrap", cluster.kafka_bootstrap, "--records", "500", "--no-consume"]
    out = kafka_clients.bench(parser.parse_args([*base, "--idle-topics", "3"]))
    assert out["params"]["idle_topics"] == 3 and out["unflushed"] == 0
    assert out["produce_records_per_s"] > 0
    wait_until(
        lambda: not any("-idle-" in t for t in admin.list_topics(timeout=10).topics),
        30,
        "the idle topics deleted after the run",
    )
    with pytest.raises(ValueError, match="needs a cluster"):
        kafka_clients.bench(parser.parse_args([*base, "--client", "mock", "--idle-topics", "1"]))
