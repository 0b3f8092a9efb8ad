"""The sink: batch writes round-trip through a topic; planning refuses a DataFrame it cannot send."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark


def write(df, broker, **options) -> None:
    writer = df.write.format("minibroker").mode("append").option("kafka.bootstrap.servers", broker)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def test_sink_round_trip_with_topic_partition_and_headers_columns(spark, broker, new_topic, source):
    a, b = new_topic(2), new_topic(3)
    rows = [
        (
            a if i % 3 else b,
            f"k{i}" if i % 4 else None,
            f"v{i}".encode(),
            i % 2,
            [("n", str(i).encode())],
        )
        for i in range(30)
    ]
    df = spark.createDataFrame(
        rows,
        "topic STRING, key STRING, value BINARY, partition INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>",
    )
    write(df, broker)
    got = source(subscribe=f"{a},{b}", includeHeaders="true").collect()
    written = {
        (r.topic, r.key, r.value, r.partition, tuple((h.key, h.value) for h in r.headers))
        for r in got
    }
    assert len(got) == len(rows)
    assert written == {(t, k.encode() if k else None, v, p, tuple(h)) for t, k, v, p, h in rows}


def test_topic_option_overrides_the_column_and_keys_pick_partitions(
    spark, broker, new_topic, source
):
    target = new_topic(3)
    df = spark.createDataFrame(
        [("elsewhere", f"k{i % 5}", f"v{i}") for i in range(50)],
        "topic STRING, key STRING, value STRING",
    )
    write(df, broker, topic=target)
    got = (
        source(subscribe=target)
        .selectExpr("CAST(key AS STRING) k", "CAST(value AS STRING) v", "partition")
        .collect()
    )
    assert sorted(r.v for r in got) == sorted(f"v{i}" for i in range(50))
    assert all(len({r.partition for r in got if r.k == key}) == 1 for key in {r.k for r in got})


def test_read_write_read_copies_a_topic(spark, broker, new_topic, produce, source):
    src, dst = new_topic(2), new_topic(2)
    produce(src, [(i % 2, f"k{i}".encode(), f"v{i}".encode(), 1_000 + i) for i in range(40)])
    write(source(subscribe=src).select("key", "value", "partition"), broker, topic=dst)

    def content(topic):
        return sorted((r.partition, r.key, r.value) for r in source(subscribe=topic).collect())

    assert content(dst) == content(src)


@pytest.mark.parametrize(
    ("columns", "options", "message"),
    [
        ("key STRING, topic STRING", {}, "'value' column"),
        ("value STRING", {}, "'topic'"),
        ("value INT, topic STRING", {}, "column 'value' is int"),
        ("value STRING, partition STRING", {"topic": "t"}, "column 'partition'"),
        ("value STRING", {"topic": "t", "kafka.acks": "most"}, "acks"),
        ("value STRING", {"topic": "t", "subscribe": "t"}, "unknown option 'subscribe'"),
    ],
)
def test_sink_planning_errors_name_the_problem(spark, broker, columns, options, message):
    df = spark.createDataFrame([], columns)
    with pytest.raises(Exception, match=message):
        write(df, broker, **options)


def test_overwrite_mode_is_refused(spark, broker):
    df = spark.createDataFrame([("v",)], "value STRING")
    with pytest.raises(Exception, match="append"):
        df.write.format("minibroker").mode("overwrite").option(
            "kafka.bootstrap.servers", broker
        ).option("topic", "t").save()
