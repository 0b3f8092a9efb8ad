"""Stock clients' transactional producers against a real cluster's transaction coordinators
(broker/transaction): FindCoordinator key type 1 and __transaction_state created on first
use, InitProducerId with a transactional id, zombie fencing, ListTransactions and
DescribeTransactions on the Kafka listener, and faults injected into the transaction APIs.

The end-to-end tests run the partition side too: transactional produce batches, markers
written by WriteTxnMarkers, read_committed.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import KafkaException
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol import ApiKey
from minibroker.protocol.kafka import KafkaRequestHeader, decode_response, encode_request

pytestmark = pytest.mark.integration


# Small internal topics (their partitions are created on first use) and no wait for more
# group members: the transaction tests' clusters, shared by the files that test them.
TXN_CONFIG = {
    **DEFAULT_CONFIG,
    "transaction.state.log.num.partitions": 3,
    "offsets.topic.num.partitions": 3,
    "group.initial.rebalance.delay.ms": 0,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("txn"), 3, TXN_CONFIG)
    yield cluster
    cluster.close()


def create(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 3)]).values():
        future.result(30)


def kafka_listeners(cluster) -> list[tuple[str, int]]:
    out = []
    for address in cluster.kafka_bootstrap.split(","):
        host, _, port = address.rpartition(":")
        out.append((host, int(port)))
    return out


def kafka_call(address: tuple[str, int], api: int, version: int, body: dict) -> dict:
    header = KafkaRequestHeader(api, version, 7, "txn-test")
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(encode_request(header, body))
        stream = sock.makefile("rb")
        (size,) = struct.unpack(">i", stream.read(4))
        return decode_response(header, stream.read(size))


def describe(cluster, transactional_id: str, *, settled: bool = True) -> dict | None:
    """DescribeTransactions on every live Kafka listener: the coordinator's answer, with
    the coordinator's id as ``broker``; None when none answers for it (a failover under
    way) and not ``settled``."""
    states = []
    answers = []
    for broker, address in enumerate(kafka_listeners(cluster)):
        if cluster.status(broker) != "alive":
            continue
        answer = kafka_call(
            address, ApiKey.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [transactional_id]}
        )
        answers.append(answer)
        states += [
            {**s, "broker": broker} for s in answer["transaction_states"] if s["error_code"] == 0
        ]
    if not states and not settled:
        return None
    assert len(states) == 1, answers
    return states[0]


def rd_producer(cluster, transactional_id: str, **conf) -> RdProducer:
    return RdProducer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "transactional.id": transactional_id,
            **conf,
        }
    )


# --- the coordinator alone ----------------------------------------------------------------


def test_each_client_initialises_transactions(cluster):
    producer = rd_producer(cluster, "rd-init")
    producer.init_transactions(60)
    state = describe(cluster, "rd-init")
    assert (state["transaction_state"], state["producer_epoch"]) == ("Empty", 0)
    first_id = state["producer_id"]
    # a restarted instance of the same application: same producer id, next epoch
    rd_producer(cluster, "rd-init").init_transactions(60)
    state = describe(cluster, "rd-init")
    assert (state["producer_id"], state["producer_epoch"]) == (first_id, 1)

    from kafka import KafkaProducer

    kp = KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap,
        transactional_id="kp-init",
        enable_idempotence=True,
    )
    try:
        kp.init_transactions()
    finally:
        kp.close(5)
    assert describe(cluster, "kp-init")["transaction_state"] == "Empty"

    from aiokafka import AIOKafkaProducer

    async def start_aiokafka() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap, transactional_id="aio-init"
        )
        try:
            await asyncio.wait_for(producer.start(), 30)
        finally:
            await producer.stop()

    asyncio.run(start_aiokafka())
    assert describe(cluster, "aio-init")["transaction_state"] == "Empty"


def test_list_transactions_names_each_coordinators_ids(cluster):
    rd_producer(cluster, "listed").init_transactions(60)
    listed = []
    for address in kafka_listeners(cluster):
        answer = kafka_call(
            address,
            ApiKey.LIST_TRANSACTIONS,
            0,
            {"state_filters": ["Empty", "Nonsense"], "producer_id_filters": []},
        )
        assert answer["error_code"] == 0
        assert answer["unknown_state_filters"] == ["Nonsense"]
        listed += [s["transactional_id"] for s in answer["transaction_states"]]
    assert listed.count("listed") == 1  # answered by its coordinator only


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(cluster):
    create(cluster.kafka_bootstrap, "fenced")
    zombie = rd_producer(cluster, "fence-me")
    zombie.init_transactions(60)
    successor = rd_producer(cluster, "fence-me")
    successor.init_transactions(60)
    assert describe(cluster, "fence-me")["producer_epoch"] == 1
    zombie.begin_transaction()
    zombie.produce("fenced", b"from the zombie")
    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(30)
    error = raised.value.args[0]
    assert error.fatal(), error
    assert error.code() in (
        RdKafkaError._FENCED,
        RdKafkaError.PRODUCER_FENCED,
        RdKafkaError.INVALID_PRODUCER_EPOCH,
    ), error
    # the successor's id is untouched by the zombie
    assert describe(cluster, "fence-me")["producer_epoch"] == 1


def test_faults_fail_and_delay_the_transaction_apis(cluster):
    """`minibroker faults` reaches the transaction APIs as any other (Kafka's api keys)."""
    brokers = range(cluster.brokers)
    for broker in brokers:
        cluster.fail_api(broker, "init_producer_id", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
    try:
        with pytest.raises(KafkaException) as raised:
            rd_producer(cluster, "faulted").init_transactions(30)
        assert raised.value.args[0].code() == RdKafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    finally:
        cluster.clear_faults()
    for broker in brokers:
        cluster.delay_api(broker, "init_producer_id", 1500)
    try:
        started = time.monotonic()
        rd_producer(cluster, "delayed").init_transactions(30)
        assert time.monotonic() - started >= 1.5  # the fault's effect, not a speed claim
    finally:
        cluster.clear_faults()


# --- end to end, with the partition side --------------------------------------------------


def read_committed(
    cluster,
    topic: str,
    partitions: int,
    expect: int | None = None,
    isolation: str = "read_committed",
) -> list[bytes]:
    """What a consumer at ``isolation`` reads from the start: ``expect`` records, or all it
    got within 20 s. ``expect`` None: all it read by the end of every partition, which
    shows a record too many at once rather than after 20 s of waiting for it (the caller
    has seen every transaction complete, so under read_committed that end is the log's)."""
    consumer = RdConsumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": f"reader-{topic}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": expect is None,
        }
    )
    try:
        consumer.assign([RdTopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[bytes] = []
        ended: set[int] = set()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (
            len(ended) < partitions if expect is None else len(got) < expect
        ):
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is None:
                got.append(message.value())
            elif message.error().code() == RdKafkaError._PARTITION_EOF:
                ended.add(message.partition())
        return got
    finally:
        consumer.close()


def wait_for_state(cluster, transactional_id: str, state: str) -> None:
    """EndTxn answers once PrepareCommit/PrepareAbort is written; the markers follow."""
    deadline = time.monotonic() + 30
    while (describe(cluster, transactional_id, settled=False) or {}).get(
        "transaction_state"
    ) != state:
        assert time.monotonic() < deadline, f"{transactional_id} never reached {state}"
        time.sleep(0.05)


def test_commit_is_visible_abort_is_not(cluster):
    create(cluster.kafka_bootstrap, "eos-out", 3)
    producer = rd_producer(cluster, "eos-writer")
    producer.init_transactions(60)
    producer.begin_transaction()
    for i in range(30):
        producer.produce("eos-out", b"committed-%d" % i, partition=i % 3)
    producer.commit_transaction(30)
    wait_for_state(cluster, "eos-writer", "CompleteCommit")
    producer.begin_transaction()
    for i in range(30):
        producer.produce("eos-out", b"aborted-%d" % i, partition=i % 3)
    producer.flush(30)  # in the log, so the abort has partitions to mark
    producer.abort_transaction(30)
    wait_for_state(cluster, "eos-writer", "CompleteAbort")
    got = read_committed(cluster, "eos-out", 3, 30)
    assert sorted(got) == sorted(b"committed-%d" % i for i in range(30))
    everything = read_committed(cluster, "eos-out", 3, 60, "read_uncommitted")
    assert sorted(everything) == sorted(
        [b"committed-%d" % i for i in range(30)] + [b"aborted-%d" % i for i in range(30)]
    )


def test_offsets_sent_in_a_transaction_commit_with_it(cluster):
    create(cluster.kafka_bootstrap, "eos-in")
    create(cluster.kafka_bootstrap, "eos-copy")
    producer = rd_producer(cluster, "eos-copier")
    producer.init_transactions(60)
    consumer = RdConsumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": "copier",
            "enable.auto.commit": False,
            # librdkafka's default, read_committed, asks OffsetFetch with require_stable:
            # while the transaction is open that answer waits for it (KIP-447; the test
            # below). read_uncommitted sees that nothing is committed yet.
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        producer.begin_transaction()
        producer.produce("eos-copy", b"copied")
        consumer.assign([RdTopicPartition("eos-in", 0, 0)])
        offsets = [RdTopicPartition("eos-in", 0, 42)]
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
        assert consumer.committed([RdTopicPartition("eos-in", 0)], 10)[0].offset < 0
        producer.commit_transaction(30)
        wait_for_state(cluster, "eos-copier", "CompleteCommit")  # every marker written
        assert consumer.committed([RdTopicPartition("eos-in", 0)], 10)[0].offset == 42
    finally:
        consumer.close()


def offset_fetch_v7(cluster, group: str, topic: str, require_stable: bool) -> tuple[int, int]:
    """OffsetFetch v7 (flexible, require_stable) on the Kafka listener of the group's
    coordinator: ``(committed_offset, error_code)`` of ``topic``-0."""
    for address in kafka_listeners(cluster):
        answer = kafka_call(
            address,
            ApiKey.OFFSET_FETCH,
            7,
            {
                "group_id": group,
                "topics": [{"name": topic, "partition_indexes": [0]}],
                "require_stable": require_stable,
            },
        )
        if answer["error_code"] == 0:
            (partition,) = answer["topics"][0]["partitions"]
            return partition["committed_offset"], partition["error_code"]
    raise AssertionError(f"no coordinator answered for {group}")


def test_require_stable_offset_fetch_is_unstable_while_a_transaction_holds_offsets(cluster):
    """KIP-447: OffsetFetch v7 with require_stable answers UNSTABLE_OFFSET_COMMIT for a
    partition whose offsets an open transaction holds; the committed offset once it
    commits. Without require_stable the previous offset is answered meanwhile."""
    create(cluster.kafka_bootstrap, "eos-stable-in")
    producer = rd_producer(cluster, "eos-stable")
    producer.init_transactions(60)
    consumer = RdConsumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": "stable-group",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.commit(offsets=[RdTopicPartition("eos-stable-in", 0, 3)], asynchronous=False)
        assert offset_fetch_v7(cluster, "stable-group", "eos-stable-in", True) == (3, 0)
        producer.begin_transaction()
        offsets = [RdTopicPartition("eos-stable-in", 0, 17)]
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
        unstable = RdKafkaError.UNSTABLE_OFFSET_COMMIT
        assert offset_fetch_v7(cluster, "stable-group", "eos-stable-in", True) == (-1, unstable)
        assert offset_fetch_v7(cluster, "stable-group", "eos-stable-in", False) == (3, 0)
        producer.commit_transaction(30)
        wait_for_state(cluster, "eos-stable", "CompleteCommit")
        assert offset_fetch_v7(cluster, "stable-group", "eos-stable-in", True) == (17, 0)
    finally:
        consumer.close()


def test_transaction_timeout_aborts_an_abandoned_transaction(cluster):
    create(cluster.kafka_bootstrap, "eos-abandoned")
    producer = rd_producer(cluster, "eos-abandoner", **{"transaction.timeout.ms": 2000})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce("eos-abandoned", b"never committed")
    producer.flush(30)
    deadline = time.monotonic() + 30
    while describe(cluster, "eos-abandoner")["transaction_state"] != "CompleteAbort":
        assert time.monotonic() < deadline, "the abandoned transaction was not aborted"
        time.sleep(0.1)
    with pytest.raises(KafkaException):
        producer.commit_transaction(30)
    assert read_committed(cluster, "eos-abandoned", 1) == []


def test_a_failing_marker_write_holds_the_commit_until_the_fault_is_lifted(cluster):
    create(cluster.kafka_bootstrap, "eos-marker")
    leader = cluster.leader("eos-marker")
    producer = rd_producer(cluster, "eos-marked")
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce("eos-marker", b"held")
    producer.flush(30)
    cluster.fail_api(leader, "write_txn_markers", "NOT_ENOUGH_REPLICAS")
    try:
        producer.commit_transaction(30)  # answered once PrepareCommit is in the log
        deadline = time.monotonic() + 30
        while not any(
            cluster.stats(b)["transactions"]["marker_retries"] for b in range(cluster.brokers)
        ):
            assert time.monotonic() < deadline, "the marker write was never retried"
            time.sleep(0.05)
        assert describe(cluster, "eos-marked")["transaction_state"] == "PrepareCommit"
    finally:
        cluster.clear_faults()
    deadline = time.monotonic() + 30
    while describe(cluster, "eos-marked")["transaction_state"] != "CompleteCommit":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert read_committed(cluster, "eos-marker", 1, 1) == [b"held"]


def test_a_coordinator_killed_mid_commit_is_completed_by_the_next(cluster):
    """The commit is decided (PrepareCommit written, EndTxn answered) while the data
    partition's leader refuses the marker; the coordinator's broker is killed; the new
    coordinator loads __transaction_state and completes the commit: a read_committed
    reader sees the whole transaction, never a part of it."""
    create(cluster.kafka_bootstrap, "eos-failover", 2)
    producer = rd_producer(cluster, "eos-survivor")
    producer.init_transactions(60)
    coordinator = describe(cluster, "eos-survivor")["broker"]
    leaders = {cluster.leader("eos-failover", p) for p in range(2)}
    producer.begin_transaction()
    for i in range(20):
        producer.produce("eos-failover", b"whole-%d" % i, partition=i % 2)
    producer.flush(30)
    for leader in leaders - {coordinator}:
        cluster.fail_api(leader, "write_txn_markers", "NOT_ENOUGH_REPLICAS")
    producer.commit_transaction(30)
    cluster.kill(coordinator)
    killed = time.monotonic()
    try:
        cluster.clear_faults()
        wait_for_state(cluster, "eos-survivor", "CompleteCommit")
        took = time.monotonic() - killed
        assert describe(cluster, "eos-survivor")["broker"] != coordinator
    finally:
        cluster.restart(coordinator)
        # Back in sync (so registered with the controller again) before the next test
        # creates a topic with replication factor 3.
        for p in range(2):
            cluster.wait_for_isr("eos-failover", p, timeout=60)
    print(f"coordinator failover mid-commit completed {took:.2f}s after the kill")
    got = read_committed(cluster, "eos-failover", 2, 20)
    assert sorted(got) == sorted(b"whole-%d" % i for i in range(20))


def test_a_data_leader_killed_mid_transaction_commits_whole_or_aborts(cluster):
    """Half the transaction's records are on the in-sync replicas when a data partition's
    leader is killed (SIGKILL); the producer writes the other half, which wait for the new
    leader, and commits. The transaction either commits whole (the markers reach the new
    leader) or aborts: a read_committed reader, watching throughout, never sees a record
    outside it, and sees all of it or none of it once it completes."""
    topic, tid = "eos-leader-kill", "eos-leader-killed"
    create(cluster.kafka_bootstrap, topic, 3)
    producer = rd_producer(cluster, tid)
    producer.init_transactions(60)
    coordinator = describe(cluster, tid)["broker"]
    victims = [p for p in range(3) if cluster.leader(topic, p) != coordinator]
    assert victims, "every partition led by the coordinator's broker"
    victim = cluster.leader(topic, victims[0])
    watcher = RdConsumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": f"watch-{topic}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    watcher.assign([RdTopicPartition(topic, p, 0) for p in range(3)])
    seen: list[bytes] = []

    def watch(seconds: float) -> None:
        message = watcher.poll(seconds)
        if message is not None and message.error() is None:
            seen.append(message.value())

    whole = [b"before-%d" % i for i in range(30)] + [b"after-%d" % i for i in range(30)]
    try:
        producer.begin_transaction()
        for i in range(30):
            producer.produce(topic, b"before-%d" % i, partition=i % 3)
        producer.flush(30)  # acks=all: on every in-sync replica
        watch(0.2)
        cluster.kill(victim)
        killed = time.monotonic()
        try:
            for i in range(30):
                producer.produce(topic, b"after-%d" % i, partition=i % 3)
            try:
                producer.commit_transaction(60)
                committed = True
            except KafkaException as exc:
                assert exc.args[0].txn_requires_abort(), exc
                producer.abort_transaction(60)
                committed = False
            final = "CompleteCommit" if committed else "CompleteAbort"
            deadline = time.monotonic() + 60
            while (describe(cluster, tid, settled=False) or {}).get("transaction_state") != final:
                assert time.monotonic() < deadline, f"{tid} never reached {final}"
                watch(0.05)
            took = time.monotonic() - killed
            assert cluster.leader(topic, victims[0]) not in (victim, -1)
            deadline = time.monotonic() + 20
            while committed and len(seen) < len(whole) and time.monotonic() < deadline:
                watch(0.5)
        finally:
            cluster.restart(victim)
    finally:
        watcher.close()
    print(f"data leader killed mid-transaction: {final} {took:.2f}s after the kill")
    assert sorted(seen) == (sorted(whole) if committed else [])
    assert sorted(read_committed(cluster, topic, 3, 60 if committed else None)) == (
        sorted(whole) if committed else []
    )
    # The producer goes on with the next transaction.
    producer.begin_transaction()
    producer.produce(topic, b"next", partition=victims[0])
    producer.commit_transaction(60)
    wait_for_state(cluster, tid, "CompleteCommit")
    expected = (len(whole) if committed else 0) + 1
    assert b"next" in read_committed(cluster, topic, 3, expected)


def test_kafka_python_commits_aborts_and_is_fenced(cluster):
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KpError

    create(cluster.kafka_bootstrap, "kp-eos")

    def producer():
        return KafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap,
            transactional_id="kp-eos",
            enable_idempotence=True,
        )

    kp = producer()
    kp.init_transactions()
    kp.begin_transaction()
    kp.send("kp-eos", b"kept").get(30)
    kp.commit_transaction()
    kp.begin_transaction()
    kp.send("kp-eos", b"dropped").get(30)
    kp.abort_transaction()
    wait_for_state(cluster, "kp-eos", "CompleteAbort")
    assert read_committed(cluster, "kp-eos", 1, 1) == [b"kept"]
    successor = producer()
    successor.init_transactions()
    kp.begin_transaction()
    with pytest.raises(KpError):
        kp.send("kp-eos", b"zombie").get(30)
        kp.commit_transaction()
    successor.close(5)
    kp.close(5)
    assert read_committed(cluster, "kp-eos", 1) == [b"kept"]


def test_aiokafka_consume_transform_produce(cluster):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    create(cluster.kafka_bootstrap, "aio-in")
    create(cluster.kafka_bootstrap, "aio-out")
    seed = RdProducer({"bootstrap.servers": cluster.kafka_bootstrap})
    for i in range(5):
        seed.produce("aio-in", b"in-%d" % i)
    seed.flush(30)

    async def run() -> int | None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cluster.kafka_bootstrap,
            group_id="aio-app",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        producer = AIOKafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap, transactional_id="aio-app"
        )
        await asyncio.wait_for(producer.start(), 30)
        await consumer.start()
        try:
            tp = TopicPartition("aio-in", 0)
            consumer.assign([tp])
            got = await consumer.getmany(tp, timeout_ms=10_000, max_records=5)
            records = got.get(tp, [])
            async with producer.transaction():
                for record in records:
                    await producer.send("aio-out", record.value.upper())
                await producer.send_offsets_to_transaction({tp: records[-1].offset + 1}, "aio-app")
            return len(records)
        finally:
            await consumer.stop()
            await producer.stop()

    assert asyncio.run(run()) == 5
    wait_for_state(cluster, "aio-app", "CompleteCommit")
    out = read_committed(cluster, "aio-out", 1, 5)
    assert sorted(out) == [b"IN-%d" % i for i in range(5)]
    checker = RdConsumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "aio-app"})
    try:
        assert checker.committed([RdTopicPartition("aio-in", 0)], 10)[0].offset == 5
    finally:
        checker.close()
