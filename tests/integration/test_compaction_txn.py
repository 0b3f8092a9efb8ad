"""The log cleaner and transactions on real brokers: a compacted topic written by a stock
client's transactional producer loses its aborted records and, once nothing of their
transactions is left and delete.retention.ms has passed, their markers, on every replica;
read_committed and read_uncommitted consumers from the start read exactly the committed
latest values, across markers the cleaner stamped with their delete horizon."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol import iter_batches
from minibroker.protocol.batch import CONTROL_FLAG
from tests.integration.cluster_helpers import read_segments

pytestmark = pytest.mark.integration

TOPIC = "txn-compacted"
KEYS = 5
ROUNDS = 8  # each round: an aborted transaction, then a committed one, over every key


def scan(directory: Path) -> tuple[int, int]:
    """A replica's control batches and last offset, read from its segment files."""
    count, last = 0, -1
    for data in read_segments(directory):
        for _, header in iter_batches(data):
            count += bool(header.attributes & CONTROL_FLAG)
            last = max(last, header.next_offset - 1)
    return count, last


def read_all(bootstrap: str, isolation: str, last: int) -> dict[bytes, bytes]:
    """Each key's value as a consumer from the start reads it, up to offset ``last``."""
    consumer = RdConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{isolation}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    seen: dict[bytes, bytes] = {}
    try:
        consumer.assign([RdTopicPartition(TOPIC, 0, 0)])
        deadline = time.monotonic() + 60
        offset = -1
        while offset < last:
            assert time.monotonic() < deadline, (isolation, offset, last)
            message = consumer.poll(1.0)
            if message is None or message.error():
                continue
            seen[message.key()] = message.value()
            offset = message.offset()
    finally:
        consumer.close()
    return seen


def test_the_cleaner_removes_aborted_records_then_markers_on_every_replica(tmp_path):
    config = {
        **DEFAULT_CONFIG,
        "log.cleaner.backoff.ms": 100,
        "transaction.state.log.num.partitions": 1,
    }
    cluster = start_cluster(tmp_path, 3, config)
    try:
        admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
        topic_config = {
            "cleanup.policy": "compact",
            "internal.segment.bytes": "1024",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "1000",
        }
        admin.create_topics([NewTopic(TOPIC, 1, 3, config=topic_config)])[TOPIC].result(30)
        cluster.wait_for_leader(TOPIC)
        producer = RdProducer(
            {"bootstrap.servers": cluster.kafka_bootstrap, "transactional.id": "cleaned-txn"}
        )
        producer.init_transactions(30)
        latest: dict[bytes, bytes] = {}
        for r in range(ROUNDS):
            for commit in (False, True):
                producer.begin_transaction()
                for k in range(KEYS):
                    key = f"k{k}".encode()
                    value = f"{'committed' if commit else 'aborted'}-{r}-{k}".encode()
                    producer.produce(TOPIC, value, key=key, partition=0)
                    if commit:
                        latest[key] = value
                producer.flush(30)
                if commit:
                    producer.commit_transaction(30)
                else:
                    producer.abort_transaction(30)
        written = 2 * ROUNDS  # markers
        txn_end = written * (KEYS + 1)  # the offset after the last marker
        dirs = sorted(Path(cluster.data_dir).rglob(f"{TOPIC}-0"))
        assert len(dirs) == 3

        def cleaned(directory: Path) -> bool:
            """Copied past the transactions (a follower catching up has few markers
            too), and most markers gone."""
            count, last = scan(directory)
            return last >= txn_end and count <= written // 4

        # Plain records keep the log rolling and dirty (a pass needs dirty data) until
        # every replica's cleaner has removed most markers: the aborted records went in
        # one pass, their markers are stamped in a later one, and go after the horizon.
        filler = RdProducer({"bootstrap.servers": cluster.kafka_bootstrap, "linger.ms": 0})
        deadline = time.monotonic() + 120
        n = 0
        while not all(cleaned(d) for d in dirs):
            assert time.monotonic() < deadline, [scan(d) for d in dirs]
            filler.produce(TOPIC, b"f", key=b"filler-%d" % (n % 20), partition=0)
            filler.flush(30)
            n += 1
            time.sleep(0.05)
        for d in dirs:  # no aborted-transactions index of a segment that is gone
            bases = {p.stem for p in d.glob("*.log")}
            assert {p.stem for p in d.glob("*.txnindex")} <= bases
        with_filler = {**latest, **{b"filler-%d" % i: b"f" for i in range(min(n, 20))}}
        last = txn_end + n - 1  # the last filler record (in the active segment: kept)
        for isolation in ("read_committed", "read_uncommitted"):
            seen = read_all(cluster.kafka_bootstrap, isolation, last)
            assert seen == with_filler, isolation
    finally:
        cluster.close()
