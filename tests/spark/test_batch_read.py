"""Batch reads: exactly what was produced, offset ranges, JSON offsets, partition planning."""

from __future__ import annotations

import json

import pytest

from .conftest import rows_by_offset

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000


def test_batch_read_equals_what_was_produced(source, new_topic, produce):
    topic = new_topic(3)
    records = [
        (
            i % 3,
            None if i % 5 == 0 else f"k{i}".encode(),
            b"" if i == 7 else f"value-{i}".encode() * (i % 4 + 1),
            T0 + i * 1000,
            {"n": str(i).encode(), "empty": None} if i % 2 else None,
        )
        for i in range(60)
    ]
    metas = produce(topic, records)
    expected = {
        (topic, m.partition, m.offset): (r[1], r[2], r[3])
        for m, r in zip(metas, records, strict=True)
    }
    # A record without headers reads back with null headers, as spark-sql-kafka's does.
    expected_headers = {
        (m.partition, m.offset): None if r[4] is None else sorted(r[4].items())
        for m, r in zip(metas, records, strict=True)
    }

    df = source(subscribe=topic, includeHeaders="true")
    assert [f.name for f in df.schema.fields] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert rows_by_offset(df) == expected
    rows = df.orderBy("partition", "offset").collect()  # orderBy reads each partition twice
    assert [(r.partition, r.offset) for r in rows] == sorted((p, o) for _, p, o in expected)
    assert {r.timestampType for r in rows} == {0}
    assert {
        (r.partition, r.offset): None
        if r.headers is None
        else sorted((h.key, h.value) for h in r.headers)
        for r in rows
    } == expected_headers
    assert "headers" not in source(subscribe=topic).columns


def test_offset_ranges_json_offsets_and_subscriptions(source, new_topic, produce):
    topic = new_topic(2)
    produce(topic, [(i % 2, None, f"v{i}".encode(), T0 + i) for i in range(20)])  # 10 per partition
    everything = rows_by_offset(source(subscribe=topic))
    assert len(everything) == 20

    def offsets(df) -> list[tuple[int, int]]:
        return sorted((p, o) for _, p, o in rows_by_offset(df))

    ranged = source(
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": 3, "1": -2}}),
        endingOffsets=json.dumps({topic: {"0": 6, "1": -1}}),
    )
    assert offsets(ranged) == [(0, 3), (0, 4), (0, 5)] + [(1, o) for o in range(10)]
    assigned = source(assign=json.dumps({topic: [1]}), endingOffsets=json.dumps({topic: {"1": 4}}))
    assert offsets(assigned) == [(1, o) for o in range(4)]
    by_pattern = source(subscribePattern=f"{topic}|no-such-topic-[0-9]+")
    assert rows_by_offset(by_pattern) == everything
    empty = source(subscribe=topic, startingOffsets=json.dumps({topic: {"0": 10, "1": 10}}))
    assert empty.count() == 0

    # As spark-sql-kafka: JSON offsets must name every partition read, and a streaming-only
    # option in a batch read is ignored.
    with pytest.raises(Exception, match="must specify all TopicPartitions"):
        source(subscribe=topic, startingOffsets=json.dumps({topic: {"0": 3}})).count()
    assert source(subscribe=topic, maxOffsetsPerTrigger="1").count() == 20

    split = source(subscribe=topic, minPartitions="6")
    assert split.rdd.getNumPartitions() >= 6
    assert rows_by_offset(split) == everything


def test_offsets_by_timestamp_are_exact_to_the_record(source, new_topic, produce):
    topic = new_topic(2)
    # One produce call per partition: each partition's 10 records share one batch, so the
    # broker's batch-level answer must be refined to the record.
    for p in (0, 1):
        produce(topic, [(p, None, f"p{p}-{i}".encode(), T0 + i * 1000) for i in range(10)])

    def offsets(df) -> list[tuple[int, int]]:
        return sorted((p, o) for _, p, o in rows_by_offset(df))

    # Kafka's semantics: start at the first record at or after the time, end before it.
    from_4s = source(subscribe=topic, startingTimestamp=str(T0 + 3500))
    assert offsets(from_4s) == [(p, o) for p in (0, 1) for o in range(4, 10)]
    window = source(
        subscribe=topic,
        startingOffsetsByTimestamp=json.dumps({topic: {"0": T0 + 2000, "1": T0}}),
        endingOffsetsByTimestamp=json.dumps({topic: {"0": T0 + 5000, "1": T0 + 99_000}}),
    )
    assert offsets(window) == [(0, o) for o in range(2, 5)] + [(1, o) for o in range(10)]
    # startingTimestamp wins over startingOffsetsByTimestamp, and both over startingOffsets.
    both = source(
        subscribe=topic,
        startingTimestamp=str(T0 + 9000),
        startingOffsetsByTimestamp=json.dumps({topic: {"0": T0, "1": T0}}),
        startingOffsets="earliest",
    )
    assert offsets(both) == [(0, 9), (1, 9)]
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy=latest"):
        source(subscribe=topic, startingTimestamp=str(T0 + 60_000)).count()
    late = source(
        subscribe=topic,
        startingTimestamp=str(T0 + 60_000),
        startingOffsetsByTimestampStrategy="latest",
    )
    assert late.count() == 0


def test_empty_topic_reads_as_empty(source, new_topic):
    assert source(subscribe=new_topic(2)).count() == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t", "kafka.bootstrap.servers": None}, "kafka.bootstrap.servers"),
        ({}, "subscribe"),
        ({"subscribe": "t", "assign": '{"t": [0]}'}, "exactly one of"),
        ({"subscribe": "t", "startingOffset": "earliest"}, "did you mean 'startingOffsets'"),
        ({"subscribe": "t", "startingOffsets": "latest"}, "startingOffsets"),
        ({"subscribe": "t", "endingOffsets": "{not json"}, "endingOffsets"),
        ({"subscribe": "t", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"subscribe": "t", "minPartitions": "0"}, "minPartitions"),
        ({"subscribe": "t", "kafka.fetch.max.wait.ms": "soon"}, "fetch.max.wait.ms"),
        ({"subscribe": "t", "startingTimestamp": "soon"}, "startingTimestamp"),
        ({"subscribe": "no-such-topic"}, "no-such-topic"),
    ],
)
def test_a_wrong_or_missing_option_fails_planning_naming_it(spark, broker, options, message):
    reader = spark.read.format("minibroker")
    if options.pop("kafka.bootstrap.servers", "given") is not None:
        reader = reader.option("kafka.bootstrap.servers", broker)
    for key, value in options.items():
        reader = reader.option(key, value)
    with pytest.raises(Exception, match=message):
        reader.load().collect()
