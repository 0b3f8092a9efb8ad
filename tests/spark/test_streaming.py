"""Structured Streaming: availableNow with maxOffsetsPerTrigger, restarts, new partitions, data loss."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from minibroker.client import SyncAdmin, SyncConsumer, TopicPartition

from .streaming_wait import wait_until_collected

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000


def run_available_now(spark, broker, checkpoint, **options) -> list[list[tuple]]:
    """Run one availableNow query to its end; the rows of each non-empty micro-batch."""
    batches: dict[int, list[tuple]] = {}

    def collect(df, batch_id: int) -> None:
        rows = df.select("topic", "partition", "offset", "value").collect()
        if rows:
            batches[batch_id] = sorted((r.topic, r.partition, r.offset, r.value) for r in rows)

    reader = spark.readStream.format("minibroker").option("kafka.bootstrap.servers", broker)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the availableNow query did not finish"
    finally:
        query.stop()
    if query.exception() is not None:
        raise query.exception()
    return [batches[k] for k in sorted(batches)]


def test_kafka_group_id_reports_progress_to_groups_describe_without_driving(
    spark, broker, new_topic, produce, tmp_path
):
    """spark-sql-kafka's kafka.group.id, as issue 28 wants it: each finished micro-batch's
    end offsets are committed to the group (so `groups describe` shows the query's lag),
    and nothing is read back from it."""
    topic = new_topic(2)
    produce(topic, [(i % 2, None, f"v{i}".encode(), T0 + i) for i in range(10)])
    group = f"spark-progress-{time.monotonic_ns()}"
    options = {
        "subscribe": topic,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "6",
        "kafka.group.id": group,
    }
    assert sum(map(len, run_available_now(spark, broker, tmp_path / "cp", **options))) == 10
    with SyncAdmin(broker) as admin:
        committed = admin.list_consumer_group_offsets(group)
    assert committed == {TopicPartition(topic, 0): 5, TopicPartition(topic, 1): 5}

    produce(topic, [(0, None, b"unread", T0 + 99)] * 3)
    cli = [sys.executable, "-m", "minibroker.deploy.cli", "groups", "describe", group]
    describe = subprocess.run(
        [*cli, "--bootstrap", broker],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    rows = [line.split()[:5] for line in describe.splitlines()[2:]]
    assert rows == [[topic, "0", "5", "8", "3"], [topic, "1", "5", "5", "0"]]

    # Reporting, not driving: a new query on the same group starts at startingOffsets.
    again = run_available_now(spark, broker, tmp_path / "cp2", **options)
    assert sum(map(len, again)) == 13


def test_available_now_rate_limit_restart_and_new_partitions(
    spark, broker, new_topic, produce, tmp_path
):
    prefix = f"stream{time.monotonic_ns()}"
    first = new_topic(2, prefix=prefix)
    produce(first, [(i % 2, None, f"a{i}".encode(), T0 + i) for i in range(12)])
    options = {
        "subscribePattern": f"{prefix}-.*",
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "5",
    }

    run1 = run_available_now(spark, broker, tmp_path / "cp", **options)
    assert [len(b) for b in run1] == [5, 5, 2]
    seen = [row for batch in run1 for row in batch]
    assert sorted(seen) == sorted((first, i % 2, i // 2, f"a{i}".encode()) for i in range(12))

    # New data in the old topic and a new matching topic (new partitions) while stopped.
    produce(first, [(i % 2, None, f"b{i}".encode(), T0 + i) for i in range(4)])
    second = new_topic(1, prefix=prefix)
    produce(second, [(0, None, f"c{i}".encode(), T0 + i) for i in range(3)])
    run2 = run_available_now(spark, broker, tmp_path / "cp", **options)
    assert [len(b) for b in run2] == [5, 2]
    again = [row for batch in run2 for row in batch]
    assert sorted(again) == sorted(
        [(first, i % 2, 6 + i // 2, f"b{i}".encode()) for i in range(4)]
        + [(second, 0, i, f"c{i}".encode()) for i in range(3)]
    )

    # Nothing new: a restart reads nothing.
    assert run_available_now(spark, broker, tmp_path / "cp", **options) == []


def test_streaming_starts_at_latest_by_default(spark, broker, new_topic, produce, tmp_path):
    topic = new_topic(1)
    produce(topic, [(0, None, b"old", T0)])
    assert run_available_now(spark, broker, tmp_path / "cp", subscribe=topic) == []
    produce(topic, [(0, None, b"new", T0)])
    assert run_available_now(spark, broker, tmp_path / "cp", subscribe=topic) == [
        [(topic, 0, 1, b"new")]
    ]


def test_a_new_query_can_start_at_a_time(spark, broker, new_topic, produce, tmp_path):
    topic = new_topic(1)
    produce(topic, [(0, None, f"v{i}".encode(), T0 + i * 1000) for i in range(5)])
    rows = run_available_now(
        spark, broker, tmp_path / "cp", subscribe=topic, startingTimestamp=str(T0 + 2500)
    )
    assert [r[3] for batch in rows for r in batch] == [b"v3", b"v4"]


def wait_for_retention(broker: str, topic: str, at_least: int) -> int:
    """Wait (bounded) until retention moved partition 0's log start to ``at_least`` or beyond."""
    deadline = time.monotonic() + 30
    with SyncConsumer(broker) as consumer:
        while True:
            start = consumer.beginning_offsets([(topic, 0)])[(topic, 0)]
            if start >= at_least or time.monotonic() > deadline:
                return start
            time.sleep(0.1)


def test_data_loss_fails_the_query_unless_told_otherwise(
    spark, broker, new_topic, produce, source, tmp_path
):
    topic = new_topic(1, **{"internal.segment.bytes": "1024", "retention.bytes": "1"})
    for n in range(3):  # separate produce calls: separate batches, and segments roll between them
        produce(topic, [(0, None, b"x" * 300 + bytes([n]) * 4, T0 + n * 10 + i) for i in range(3)])
    # Each batch fills its own segment; retention.bytes=1 deletes every segment but the
    # active one, so the log start settles at 6. Waiting for that final state (not just
    # the first deletion) keeps retention from moving it again under the reads below.
    log_start = wait_for_retention(broker, topic, 6)
    assert log_start == 6, "retention did not delete the two sealed segments"

    from_zero = json.dumps({topic: {"0": 0}})
    with pytest.raises(Exception, match="failOnDataLoss"):
        source(subscribe=topic, startingOffsets=from_zero).collect()
    assert (
        source(subscribe=topic, startingOffsets=from_zero, failOnDataLoss="false").count()
        == 9 - log_start
    )

    with pytest.raises(Exception, match="failOnDataLoss"):
        run_available_now(
            spark, broker, tmp_path / "cp1", subscribe=topic, startingOffsets=from_zero
        )
    rows = run_available_now(
        spark,
        broker,
        tmp_path / "cp2",
        subscribe=topic,
        startingOffsets=from_zero,
        failOnDataLoss="false",
    )
    assert [r[2] for batch in rows for r in batch] == list(range(log_start, 9))


def test_min_offsets_per_trigger_holds_a_trigger_until_max_trigger_delay(
    spark, broker, new_topic, produce, tmp_path
):
    topic = new_topic(1)
    produce(topic, [(0, None, b"a", T0), (0, None, b"b", T0)])
    seen: list[tuple[float, list[bytes]]] = []

    def collect(df, batch_id: int) -> None:
        started = time.monotonic()  # as near to the trigger as foreachBatch gets
        values = [r.value for r in df.select("value").collect()]
        if values:
            seen.append((started, values))

    query = (
        spark.readStream.format("minibroker")
        .option("kafka.bootstrap.servers", broker)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("minOffsetsPerTrigger", "5")
        .option("maxTriggerDelay", "6s")
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        wait_until_collected(query, seen, 1)  # the first trigger is never held (as Kafka's)
        assert seen[0][1] == [b"a", b"b"]
        produce(topic, [(0, None, b"c", T0), (0, None, b"d", T0)])  # 2 < 5: held
        wait_until_collected(query, seen, 2)
        assert seen[1][1] == [b"c", b"d"]
        # Released by maxTriggerDelay (6 s after the first trigger), never earlier: a lower
        # bound, with 3 s left for the first batch's planning before foreachBatch ran.
        assert seen[1][0] - seen[0][0] >= 3.0
    finally:
        query.stop()
