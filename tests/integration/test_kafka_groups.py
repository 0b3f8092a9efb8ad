"""Consumer groups for stock Kafka clients (confluent-kafka, kafka-python, aiokafka, kcat)
through the Kafka listener, coordinated by the same coordinator as our own client.

For each client: a group consumer subscribes, consumes, commits and closes, and a second
one in the group resumes from the commit (nothing before it read again); two consumers of
one group share a multi-partition topic without overlap (and so do a stock client and our
own consumer in one group); `minibroker groups describe`
shows the stock client's group, its member and its lag. Every wait is on the thing itself
(records seen, an assignment) with a generous bound.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import KafkaError
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from minibroker.client import SyncConsumer
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster

pytestmark = pytest.mark.integration

GROUP_CONFIG = {
    **DEFAULT_CONFIG,
    "group.min.session.timeout.ms": 500,
    "group.initial.rebalance.delay.ms": 0,
    "offsets.topic.num.partitions": 3,
}
SESSION_MS = 6000
HEARTBEAT_MS = 300
BOUND_S = 60
# kafka-python's and aiokafka's consumer settings (they share the names)
PY_SETTINGS = {
    "auto_offset_reset": "earliest",
    "enable_auto_commit": False,
    "session_timeout_ms": SESSION_MS,
    "heartbeat_interval_ms": HEARTBEAT_MS,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("kafka-groups"), 3, GROUP_CONFIG)
    yield cluster
    cluster.close()


def create_and_fill(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    """``per_partition`` records into each partition, values ``p-offset``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 3)])[topic].result(30)
    producer = RdProducer({"bootstrap.servers": bootstrap, "acks": "all"})
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, b"%d-%d" % (p, i), partition=p)
    assert producer.flush(60) == 0


def describe(cluster, group: str) -> list[list[str]]:
    """`minibroker groups describe`'s rows (the header line and column names dropped)."""
    done = subprocess.run(
        [sys.executable, "-m", "minibroker.deploy.cli", "groups", "describe", group,
         "--bootstrap", cluster.bootstrap],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    lines = out.splitlines()
    assert lines[0].startswith(f"GROUP {group}"), out
    return [line.split() for line in lines[2:]]


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # a polling interval: the condition is checked again, not assumed


# --- one adapter per client: subscribe, poll, commit, close ----------------------------------


class Rd:
    """confluent-kafka (librdkafka)."""

    name = "confluent"

    def __init__(self, cluster, group: str, topic: str) -> None:
        bootstrap = cluster.kafka_bootstrap
        self.c = RdConsumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "client.id": f"{self.name}-{group}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": SESSION_MS,
                "heartbeat.interval.ms": HEARTBEAT_MS,
            }
        )
        self.c.subscribe([topic])

    def poll(self) -> list[tuple[int, int]]:
        message = self.c.poll(0.2)
        if message is None:
            return []
        error = message.error()
        if error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            # A topic just created may not be in every broker's metadata yet: librdkafka
            # reports it and retries on its own (not fatal), so poll again.
            return []
        assert error is None, error
        return [(message.partition(), message.offset())]

    def assigned(self) -> set[int]:
        return {tp.partition for tp in self.c.assignment()}

    def commit(self, topic: str, offsets: dict[int, int]) -> None:
        self.c.commit(
            offsets=[RdTopicPartition(topic, p, o) for p, o in offsets.items()],
            asynchronous=False,
        )

    def close(self) -> None:
        self.c.close()


class Kp:
    """kafka-python."""

    name = "kafka-python"

    def __init__(self, cluster, group: str, topic: str) -> None:
        bootstrap = cluster.kafka_bootstrap
        from kafka import KafkaConsumer

        self.c = KafkaConsumer(
            bootstrap_servers=bootstrap.split(","),
            group_id=group,
            client_id=f"{self.name}-{group}",
            **PY_SETTINGS,
        )
        # kafka-python 3.0.12 joins before it has the topic's metadata, assigns nothing,
        # and rejoins when the metadata comes; if a poll's timeout ends while that second
        # join is in flight, it never applies the assignment the join brought (no
        # partitions, no heartbeats: the member expires). Under load that lost a test's
        # records for good. With the metadata first, the first join assigns the partitions.
        assert self.c.partitions_for_topic(topic), f"kafka-python has no metadata for {topic}"
        self.c.subscribe([topic])

    def poll(self) -> list[tuple[int, int]]:
        batches = self.c.poll(timeout_ms=1000)
        return [(m.partition, m.offset) for records in batches.values() for m in records]

    def assigned(self) -> set[int]:
        return {tp.partition for tp in self.c.assignment()}

    def commit(self, topic: str, offsets: dict[int, int]) -> None:
        from kafka import OffsetAndMetadata, TopicPartition

        self.c.commit(
            {TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()}
        )

    def close(self) -> None:
        self.c.close()


class Aio:
    """aiokafka, driven from a private event loop so the tests read the same for all."""

    name = "aiokafka"

    def __init__(self, cluster, group: str, topic: str) -> None:
        bootstrap = cluster.kafka_bootstrap
        from aiokafka import AIOKafkaConsumer

        self.loop = asyncio.new_event_loop()

        async def start() -> AIOKafkaConsumer:
            c = AIOKafkaConsumer(
                topic,
                bootstrap_servers=bootstrap.split(","),
                group_id=group,
                client_id=f"{self.name}-{group}",
                **PY_SETTINGS,
            )
            await c.start()
            return c

        self.c = self.loop.run_until_complete(start())

    def poll(self) -> list[tuple[int, int]]:
        batches = self.loop.run_until_complete(self.c.getmany(timeout_ms=200))
        return [(m.partition, m.offset) for records in batches.values() for m in records]

    def assigned(self) -> set[int]:
        return {tp.partition for tp in self.c.assignment()}

    def commit(self, topic: str, offsets: dict[int, int]) -> None:
        from aiokafka import TopicPartition

        self.loop.run_until_complete(
            self.c.commit({TopicPartition(topic, p): o for p, o in offsets.items()})
        )

    def close(self) -> None:
        self.loop.run_until_complete(self.c.stop())
        self.loop.close()


class Native:
    """Our own consumer on the native listener: the same group, the same bytes (Kafka's
    ConsumerProtocol), so it can share a group with stock clients."""

    name = "minibroker"

    def __init__(self, cluster, group: str, topic: str) -> None:
        settings = {
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
        }
        self.c = SyncConsumer(cluster.bootstrap, group_id=group, **settings)
        self.c.subscribe([topic])

    def poll(self) -> list[tuple[int, int]]:
        return [(r.partition, r.offset) for r in self.c.poll(timeout_ms=200)]

    def assigned(self) -> set[int]:
        return {tp.partition for tp in self.c.assignment()}

    def close(self) -> None:
        self.c.close()


CLIENTS = [Rd, Kp, Aio]


class Poller:
    """A member polled from its own thread, as applications do: a rebalance waits for
    every member to poll, so one thread taking turns could hold up the other's join."""

    def __init__(self, member) -> None:
        self.member = member
        self.records: list[tuple[int, int]] = []
        self.assigned: set[int] = set()
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.records += self.member.poll()
                self.assigned = self.member.assigned()
        except BaseException as exc:  # shown by close(), in the test's thread
            self.error = exc

    def close(self) -> None:
        self.stop.set()
        self.thread.join(BOUND_S)
        self.member.close()
        if self.error is not None:
            raise self.error


# --- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.name)
def test_a_group_consumer_commits_and_a_successor_resumes(cluster, client):
    topic, group = f"resume-{client.name}", f"g-resume-{client.name}"
    create_and_fill(cluster.kafka_bootstrap, topic, 1, 20)

    first = client(cluster, group, topic)
    try:
        seen: list[int] = []

        def got_ten() -> bool:
            seen.extend(offset for _, offset in first.poll())
            return len(seen) >= 10

        until(got_ten, "the first consumer's ten records")
        assert seen[:10] == list(range(10))
        first.commit(topic, {0: 10})  # the position after the tenth record, as Kafka's
        rows = describe(cluster, group)
        # TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
        assert [r[:5] for r in rows] == [[topic, "0", "10", "20", "10"]]
        assert rows[0][7] == f"{client.name}-{group}"  # the stock client is the member
    finally:
        first.close()

    second = client(cluster, group, topic)
    try:
        resumed: list[int] = []

        def got_rest() -> bool:
            resumed.extend(offset for _, offset in second.poll())
            return len(resumed) >= 10

        until(got_rest, "the second consumer's ten records")
        assert resumed == list(range(10, 20))  # from the commit: nothing before it again
        second.commit(topic, {0: 20})
    finally:
        second.close()
    assert [r[:5] for r in describe(cluster, group)] == [[topic, "0", "20", "20", "0"]]


@pytest.mark.parametrize(
    "pair",
    [(c, c) for c in CLIENTS] + [(Rd, Native)],
    ids=lambda pair: "+".join(c.name for c in pair),
)
def test_two_group_consumers_share_partitions_without_overlap(cluster, pair):
    name = "-".join(c.name for c in pair)
    topic, group = f"share-{name}", f"g-share-{name}"
    create_and_fill(cluster.kafka_bootstrap, topic, 4, 0)
    members = [Poller(pair[0](cluster, group, topic)), Poller(pair[1](cluster, group, topic))]
    a, b = members
    try:
        until(
            lambda: len(a.assigned) == 2 and len(b.assigned) == 2,
            "both members to hold two partitions each",
        )
        assert a.assigned.isdisjoint(b.assigned)
        assert a.records == b.records == []  # nothing produced yet

        producer = RdProducer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"})
        for p in range(4):
            for i in range(10):
                producer.produce(topic, b"%d-%d" % (p, i), partition=p)
        assert producer.flush(60) == 0

        until(lambda: len(a.records) + len(b.records) >= 40, "all 40 records")
        everything = a.records + b.records
        assert sorted(everything) == [(p, i) for p in range(4) for i in range(10)]
        assert {p for p, _ in a.records} == a.assigned
        assert {p for p, _ in b.records} == b.assigned
    finally:
        for member in members:
            member.close()


def test_kcat_consumes_as_a_group_member(cluster):
    kcat = shutil.which("kcat")
    assert kcat, "kcat is not installed: deploy/test.sh installs it (apt-get install kcat)"
    topic, group = "kcat-group", "g-kcat"
    create_and_fill(cluster.kafka_bootstrap, topic, 2, 5)
    out = subprocess.run(
        [kcat, "-b", cluster.kafka_bootstrap, "-G", group, topic, "-e",
         "-X", "auto.offset.reset=earliest", "-X", f"session.timeout.ms={SESSION_MS}",
         "-X", f"heartbeat.interval.ms={HEARTBEAT_MS}", "-f", "%p %o %s\\n"],
        capture_output=True, text=True, timeout=BOUND_S, check=True,
    ).stdout  # fmt: skip
    read = sorted(tuple(int(x) for x in line.split()[:2]) for line in out.splitlines())
    assert read == [(p, i) for p in range(2) for i in range(5)]
    # kcat commits what it consumed (enable.auto.commit, and on its way out).
    assert sorted(tuple(r[:5]) for r in describe(cluster, group)) == [
        (topic, "0", "5", "5", "0"),
        (topic, "1", "5", "5", "0"),
    ]
