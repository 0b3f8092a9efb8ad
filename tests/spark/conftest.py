"""One local[2] SparkSession and one broker for every Spark test (both cost seconds to start).

The Python workers must run this venv's interpreter (pyarrow lives here), so
PYSPARK_PYTHON is set before the session starts. Each test uses its own topics.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from minibroker.client import NewTopic, SyncAdmin, SyncProducer
from minibroker.deploy.launcher import BrokerProcess, free_port

_names = itertools.count()


@pytest.fixture(scope="session")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from minibroker.client.spark import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("minibroker-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@contextlib.contextmanager
def single_broker(directory, config: dict) -> Iterator[str]:
    """A one-broker cluster of our own; its address while the block runs."""
    proc = BrokerProcess(0, free_port(), directory, config)
    proc.start()
    try:
        proc.wait_ready()
        yield proc.address
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """A single broker whose retention can be made to bite (for the data-loss test)."""
    config = {"log.retention.check.interval.ms": 100}
    with single_broker(tmp_path_factory.mktemp("spark-broker"), config) as address:
        yield address


@pytest.fixture
def new_topic(broker):
    """``new_topic(partitions=2, prefix="spark", **configs)`` -> a fresh topic's name."""

    def make(partitions: int = 2, prefix: str = "spark", **configs: str) -> str:
        name = f"{prefix}-{next(_names)}"
        with SyncAdmin(broker) as admin:
            admin.create_topics([NewTopic(name, partitions, 1, dict(configs))])
        return name

    return make


@pytest.fixture
def produce(broker):
    """``produce(topic, [(partition, key, value, timestamp_ms, headers?), ...])`` -> metadata."""

    def send(topic: str, records) -> list:
        items = []
        for rec in records:
            partition, key, value, timestamp, *rest = rec
            item = {"value": value, "key": key, "partition": partition, "timestamp": timestamp}
            if rest and rest[0]:
                item["headers"] = rest[0]
            items.append(item)
        with SyncProducer(broker, acks="all") as producer:
            handles = producer.send_many(topic, items)
            producer.flush()
            return [h.result(10) for h in handles]

    return send


@pytest.fixture
def source(spark, broker):
    """``source(**options)`` -> a batch DataFrame of the minibroker source on the test broker."""

    def load(**options: str):
        reader = spark.read.format("minibroker").option("kafka.bootstrap.servers", broker)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    return load


def rows_by_offset(df) -> dict:
    """``{(topic, partition, offset): (key, value, timestamp_ms)}`` of a source DataFrame."""
    rows = df.selectExpr(
        "topic", "partition", "offset", "key", "value", "unix_millis(timestamp) AS ts"
    ).collect()
    return {(r.topic, r.partition, r.offset): (r.key, r.value, r.ts) for r in rows}
