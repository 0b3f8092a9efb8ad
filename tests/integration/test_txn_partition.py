"""Transactions, the partition side, against a live 3-broker cluster (docs/transactions.md).

The coordinator is not needed: transactional batches are produced as a transactional
producer writes them (a stock client's v2 batch on the Kafka listener, or our own batch on
the native one), and the markers are sent as a coordinator sends them: WriteTxnMarkers,
authenticated with the cluster secret. Then read_committed readers (native Fetch,
confluent-kafka, kafka-python, aiokafka, the bundled consumer) see committed records and
never aborted ones, and stop at the LSO while a transaction is open; read_uncommitted
readers see every record; and a leader's kill -9 and restart keep the open transaction (the LSO)
and the aborted-transactions index.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest
import trio
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import TopicPartition as RdTopicPartition

from minibroker.broker.network.cluster_auth import load_credentials
from minibroker.broker.network.peer import PeerConnection
from minibroker.client import SyncConsumer
from minibroker.client.fetcher import decode_fetched
from minibroker.deploy.cluster_secret import SECRET_FILE
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol import ApiKey, ErrorCode, encode_batch
from minibroker.protocol.batch import TRANSACTIONAL_FLAG
from minibroker.protocol.errors import ClusterAuthorizationFailed
from minibroker.protocol.kafka import KafkaApi, KafkaRequestHeader, decode_response, encode_request
from minibroker.protocol.kafka import records as kafka_records

pytestmark = pytest.mark.integration

EARLIEST, LATEST = -2, -1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("txn"), 3, dict(DEFAULT_CONFIG))
    yield cluster
    cluster.close()


# --- talking to brokers as a coordinator and as clients ----------------------------------


def ask(cluster, broker: int, api: int, body: dict, *, version: int = 0, as_member: int = -1):
    """One native request; ``as_member``: authenticated as that broker (a cluster peer)."""
    creds = None
    if as_member >= 0:
        creds = load_credentials(cluster.data_dir / SECRET_FILE, as_member)
    state = cluster.state

    async def run() -> dict:
        conn = PeerConnection(state.host, state.port(broker), "txn-test", credentials=creds)
        try:
            return await conn.request(api, body, timeout=30, version=version)
        finally:
            await conn.close()

    return trio.run(run)


def write_markers(cluster, topic: str, markers: list[tuple[int, int, bool]], *, epoch=0):
    """WriteTxnMarkers to the partition's leader, as broker ``(leader + 1) % 3`` (its
    coordinator, say): ``(producer_id, producer_epoch, commit)`` each; their error codes."""
    leader = cluster.leader(topic)
    body = {
        "markers": [
            {
                "producer_id": pid,
                "producer_epoch": pepoch,
                "transaction_result": commit,
                "topics": [{"name": topic, "partition_indexes": [0]}],
                "coordinator_epoch": epoch,
            }
            for pid, pepoch, commit in markers
        ]
    }
    answer = ask(
        cluster, leader, ApiKey.WRITE_TXN_MARKERS, body, version=1, as_member=(leader + 1) % 3
    )
    return [m["topics"][0]["partitions"][0]["error_code"] for m in answer["markers"]]


def native_produce(cluster, topic: str, values: list[bytes], *, pid=-1, epoch=0, seq=0) -> int:
    """Our own batch (transactional when ``pid`` is given), acks=all; the error code."""
    rows = [(int(time.time() * 1000), None, v, []) for v in values]
    fields = {}
    if pid >= 0:
        fields = dict(
            producer_id=pid, producer_epoch=epoch, base_sequence=seq, attributes=TRANSACTIONAL_FLAG
        )
    body = {
        "acks": -1,
        "timeout_ms": 30_000,
        "topics": [
            {
                "name": topic,
                "partitions": [{"partition": 0, "records": encode_batch(rows, **fields)}],
            }
        ],
    }
    answer = ask(cluster, cluster.leader(topic), ApiKey.PRODUCE, body)
    return answer["topics"][0]["partitions"][0]["error_code"]


def kafka_produce(cluster, topic: str, values: list[bytes], *, pid: int, seq: int = 0) -> int:
    """A stock transactional producer's batch (v2, transactional bit) on the Kafka listener."""
    batch = kafka_records.encode_batch(
        [(int(time.time() * 1000), None, v, ()) for v in values],
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        attributes=kafka_records.TRANSACTIONAL_FLAG,
    )
    header = KafkaRequestHeader(KafkaApi.PRODUCE, 8, 1, "txn-test")
    body = {
        "transactional_id": "txn-test",
        "acks": -1,
        "timeout_ms": 30_000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
    }
    leader = cluster.leader(topic)
    address = (cluster.state.host, cluster.state.kafka_base_port + leader)
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(encode_request(header, body))
        stream = sock.makefile("rb")
        (size,) = struct.unpack(">i", stream.read(4))
        answer = decode_response(header, stream.read(size))
    return answer["responses"][0]["partition_responses"][0]["error_code"]


def native_fetch(cluster, topic: str, committed: bool, offset: int = 0) -> dict:
    body = {
        "replica_id": -1,
        "max_wait_ms": 0,
        "min_bytes": 0,
        "isolation_level": int(committed),
        "topics": [{"name": topic, "partitions": [{"partition": 0, "fetch_offset": offset}]}],
    }
    answer = ask(cluster, cluster.leader(topic), ApiKey.FETCH, body, version=1)
    return answer["topics"][0]["partitions"][0]


def latest(cluster, topic: str, committed: bool) -> int:
    body = {
        "isolation_level": int(committed),
        "topics": [{"name": topic, "partitions": [{"partition": 0, "timestamp": LATEST}]}],
    }
    answer = ask(cluster, cluster.leader(topic), ApiKey.LIST_OFFSETS, body)
    return answer["topics"][0]["partitions"][0]["offset"]


def rd_values(cluster, topic: str, isolation: str, until: int) -> list[bytes]:
    """confluent-kafka's values from the start, polled until its position reaches ``until``."""
    consumer = RdConsumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    try:
        tp = RdTopicPartition(topic, 0, 0)
        consumer.assign([tp])
        got = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message.value())
            if consumer.position([tp])[0].offset >= until:
                return got
        raise AssertionError(f"confluent-kafka stopped at {consumer.position([tp])}: {got}")
    finally:
        consumer.close()


def kp_values(cluster, topic: str, until: int) -> list[bytes]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpTopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        tp = KpTopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got = []
        deadline = time.monotonic() + 30
        while consumer.position(tp) < until and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got += [r.value for r in records]
        assert consumer.position(tp) >= until, got
        return got
    finally:
        consumer.close()


def aio_values(cluster, topic: str, until: int) -> list[bytes]:
    """aiokafka's read_committed consumer, from the start until its position is ``until``."""
    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioTopicPartition

    async def run() -> list[bytes]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cluster.kafka_bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            tp = AioTopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got = []
            deadline = time.monotonic() + 30
            while await consumer.position(tp) < until and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    got += [r.value for r in records]
            assert await consumer.position(tp) >= until, got
            return got
        finally:
            await consumer.stop()

    return asyncio.run(run())


def our_values(cluster, topic: str, isolation: str, until: int) -> list[bytes]:
    with SyncConsumer(cluster.bootstrap, config={"isolation.level": isolation}) as consumer:
        consumer.assign([(topic, 0)])
        consumer.seek((topic, 0), 0)
        got = []
        deadline = time.monotonic() + 30
        while consumer.position((topic, 0)) < until and time.monotonic() < deadline:
            got += [r.value for r in consumer.poll(timeout_ms=200)]
        assert consumer.position((topic, 0)) >= until, got
        return got


def values_of(part: dict) -> list[bytes]:
    from minibroker.protocol import read_records

    return [r.value for r in read_records(part["records"])]


# --- the tests ----------------------------------------------------------------------------


def test_read_committed_sees_commits_never_aborts_and_stops_at_the_lso(cluster):
    topic = "txn-visibility"
    cluster.create_topic(topic)
    cluster.wait_for_isr(topic)
    assert native_produce(cluster, topic, [b"p0"]) == 0  # offset 0
    assert kafka_produce(cluster, topic, [b"a1", b"a2"], pid=5001) == 0  # 1-2: to abort
    assert native_produce(cluster, topic, [b"c1"], pid=5002) == 0  # 3: to commit
    hw = latest(cluster, topic, committed=False)
    assert hw == 4
    # Both transactions open: read_committed stops at the first one's first offset.
    assert latest(cluster, topic, committed=True) == 1
    part = native_fetch(cluster, topic, committed=True)
    assert values_of(part) == [b"p0"]
    assert (part["last_stable_offset"], part["high_watermark"]) == (1, 4)
    assert native_fetch(cluster, topic, committed=True, offset=1)["records"] == b""
    assert values_of(native_fetch(cluster, topic, committed=False)) == [b"p0", b"a1", b"a2", b"c1"]
    assert rd_values(cluster, topic, "read_committed", until=1) == [b"p0"]

    # The coordinator's markers: abort 5001, commit 5002 (offsets 4 and 5).
    assert write_markers(cluster, topic, [(5001, 0, False), (5002, 0, True)]) == [0, 0]
    assert native_produce(cluster, topic, [b"p1"]) == 0  # 6
    assert latest(cluster, topic, committed=True) == latest(cluster, topic, committed=False) == 7
    part = native_fetch(cluster, topic, committed=True)
    assert part["aborted_transactions"] == [{"producer_id": 5001, "first_offset": 1}]

    committed = [b"p0", b"c1", b"p1"]
    everything = [b"p0", b"a1", b"a2", b"c1", b"p1"]
    assert rd_values(cluster, topic, "read_committed", until=7) == committed
    assert rd_values(cluster, topic, "read_uncommitted", until=7) == everything
    assert kp_values(cluster, topic, until=7) == committed
    assert aio_values(cluster, topic, until=7) == committed
    assert our_values(cluster, topic, "read_committed", until=7) == committed
    assert our_values(cluster, topic, "read_uncommitted", until=7) == everything


def test_markers_are_internal_and_fence_stale_epochs(cluster):
    topic = "txn-fencing"
    cluster.create_topic(topic)
    cluster.wait_for_isr(topic)
    leader = cluster.leader(topic)
    body = {
        "markers": [
            {
                "producer_id": 6001,
                "producer_epoch": 0,
                "transaction_result": True,
                "topics": [{"name": topic, "partition_indexes": [0]}],
                "coordinator_epoch": 0,
            }
        ]
    }
    with pytest.raises(ClusterAuthorizationFailed):
        ask(cluster, leader, ApiKey.WRITE_TXN_MARKERS, body, version=1)
    assert latest(cluster, topic, committed=False) == 0  # nothing written

    assert native_produce(cluster, topic, [b"zombie-1"], pid=6001, epoch=0) == 0
    # A new incarnation fenced the producer: the coordinator aborts with the bumped epoch.
    assert write_markers(cluster, topic, [(6001, 1, False)], epoch=3) == [0]
    code = native_produce(cluster, topic, [b"zombie-2"], pid=6001, epoch=0, seq=1)
    assert code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert write_markers(cluster, topic, [(6001, 0, True)], epoch=3) == [
        ErrorCode.INVALID_PRODUCER_EPOCH
    ]
    assert write_markers(cluster, topic, [(6001, 1, True)], epoch=2) == [
        ErrorCode.TRANSACTION_COORDINATOR_FENCED
    ]
    # A partition this broker does not lead.
    follower = next(b for b in range(3) if b != leader)
    body["markers"][0]["producer_epoch"] = 1
    body["markers"][0]["coordinator_epoch"] = 3
    answer = ask(cluster, follower, ApiKey.WRITE_TXN_MARKERS, body, version=1, as_member=leader)
    code = answer["markers"][0]["topics"][0]["partitions"][0]["error_code"]
    assert code == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_a_leader_kill_and_restart_keep_the_open_transaction_and_the_aborted_index(cluster):
    topic = "txn-restart"
    cluster.create_topic(topic)
    cluster.wait_for_isr(topic)
    assert native_produce(cluster, topic, [b"p0"]) == 0  # 0
    assert native_produce(cluster, topic, [b"x1"], pid=7001) == 0  # 1: aborted below
    assert write_markers(cluster, topic, [(7001, 0, False)]) == [0]  # 2
    assert native_produce(cluster, topic, [b"o1", b"o2"], pid=7002) == 0  # 3-4: left open
    assert native_produce(cluster, topic, [b"p1"]) == 0  # 5
    aborted = [{"producer_id": 7001, "first_offset": 1}]

    def check() -> None:
        # A new leader's HW catches up with its followers' first fetches.
        deadline = time.monotonic() + 30
        while latest(cluster, topic, committed=False) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert latest(cluster, topic, committed=False) == 6
        assert latest(cluster, topic, committed=True) == 3
        part = native_fetch(cluster, topic, committed=True)
        assert values_of(part) == [b"p0", b"x1"]  # up to the LSO, markers read past
        assert part["aborted_transactions"] == aborted  # which tells the reader to drop x1
        records, _ = decode_fetched(topic, 0, part["records"], 0, part["aborted_transactions"])
        assert [r.value for r in records] == [b"p0"]
        assert part["last_stable_offset"] == 3

    check()
    old = cluster.leader(topic)
    cluster.kill(old)  # the new leader learnt it all by replication
    cluster.wait_for_leader(topic, not_on=[old])
    check()
    cluster.restart(old)  # its own recovery: snapshot, replay and the .txnindex files
    cluster.wait_for_isr(topic)
    assert cluster.partition(topic).replicas[0] == old  # the first leader is the preferred
    assert cluster.elect_preferred_leaders([(topic, 0)]) == {(topic, 0): None}
    cluster.wait_for(lambda p: p.leader == old, topic, 0, timeout=30)
    check()
    assert write_markers(cluster, topic, [(7002, 0, True)]) == [0]  # 6
    assert our_values(cluster, topic, "read_committed", until=7) == [b"p0", b"o1", b"o2", b"p1"]
