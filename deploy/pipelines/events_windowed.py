"""Streaming job: per-key event counts and amount sums in event-time windows, with a watermark.

Reads JSON events ``{"user": "alice", "amount": 3, "event_time": "2024-05-01T12:00:03Z"}``
from a topic (the record key is not needed: ``user`` is the grouping key), groups by
``user`` and tumbling ``--window``, and once the watermark (max event time seen minus
``--watermark``) passes a window's end, emits that window exactly once, both to
``--output-topic`` (key = user, value = JSON) and as Parquet files under
``--output``. Events later than the watermark are dropped, as Spark does. The output
topic is created when it does not exist.

    python -m deploy.pipelines.events_windowed --bootstrap 127.0.0.1:9092 \
        --output /tmp/events-out --trigger available-now

Each sink has its own checkpoint under ``--checkpoint`` (default OUTPUT/_checkpoints),
so a restart carries on where the previous run stopped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from minibroker.deploy.pipelines.session import add_spark_arguments, ensure_topic, spark_session

EVENT_SCHEMA = "user STRING, amount BIGINT, event_time TIMESTAMP"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_spark_arguments(p)
    p.add_argument("--topic", default="events", help="topic to read (default events)")
    p.add_argument(
        "--output-topic",
        default="events_per_window",
        help="topic for the window results (default events_per_window)",
    )
    p.add_argument("--output", required=True, help="directory for the Parquet results")
    p.add_argument(
        "--checkpoint", default=None, help="checkpoint directory (default OUTPUT/_checkpoints)"
    )
    p.add_argument(
        "--window", default="1 minute", help="tumbling window length (default '1 minute')"
    )
    p.add_argument(
        "--watermark", default="30 seconds", help="allowed lateness (default '30 seconds')"
    )
    p.add_argument(
        "--starting-offsets", default="earliest", help="for a new query (default earliest)"
    )
    p.add_argument(
        "--max-offsets-per-trigger", type=int, default=None, help="records per micro-batch"
    )
    p.add_argument(
        "--trigger",
        default="available-now",
        choices=("available-now", "continuous"),
        help="available-now: process what is there and stop; continuous: run until killed",
    )


def windowed_counts(events: Any, window: str, watermark: str) -> Any:
    """Kafka-shaped rows -> (window_start, window_end, user, events, amount), append-mode safe."""
    from pyspark.sql import functions as F

    parsed = events.select(
        F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e")
    ).select("e.*")
    return (
        parsed.where(F.col("user").isNotNull() & F.col("event_time").isNotNull())
        .withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", window), F.col("user"))
        .agg(F.count("*").alias("events"), F.sum("amount").alias("amount"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "user",
            "events",
            "amount",
        )
    )


def start_queries(spark: Any, args: argparse.Namespace) -> list[Any]:
    """Start the topic and the Parquet query; the caller awaits them. The output topic is
    created if missing (one partition: a window's results are few)."""
    from pyspark.sql import functions as F

    ensure_topic(args.bootstrap, args.output_topic)
    reader = (
        spark.readStream.format("minibroker")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", args.starting_offsets)
    )
    if args.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", args.max_offsets_per_trigger)
    results = windowed_counts(reader.load(), args.window, args.watermark)
    checkpoint = Path(args.checkpoint or Path(args.output) / "_checkpoints")

    def trigger(writer: Any) -> Any:
        return writer.trigger(availableNow=True) if args.trigger == "available-now" else writer

    to_topic = trigger(
        results.select(
            F.col("user").alias("key"),
            F.to_json(F.struct("window_start", "window_end", "user", "events", "amount")).alias(
                "value"
            ),
        )
        .writeStream.format("minibroker")
        .outputMode("append")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("topic", args.output_topic)
        .option("checkpointLocation", str(checkpoint / "topic"))
    ).start()
    to_parquet = trigger(
        results.writeStream.format("parquet")
        .outputMode("append")
        .option("path", str(Path(args.output) / "windows"))
        .option("checkpointLocation", str(checkpoint / "parquet"))
    ).start()
    return [to_topic, to_parquet]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.pipelines.events_windowed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    spark = spark_session("minibroker-events-windowed", args.master)
    try:
        queries = start_queries(spark, args)
        for query in queries:
            query.awaitTermination()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
