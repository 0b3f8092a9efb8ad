"""`minibroker bench spark-read`: records/s read into a DataFrame, and written back, on Spark.

Fills ``--topic`` with ``--records`` records of ``--record-size`` bytes if it holds
fewer (the fill is not timed), then, in one SparkSession (``--master``, default
local[2]), times ``count()`` over a batch read of the whole topic and a write of
its key and value to ``TOPIC-copy`` (acks=all, idempotent producer), both topics
created with ``--replication-factor``. A small read first spawns Spark's Python
workers, so no figure includes that one-off cost (about 5 s).

Every Spark job has a fixed cost (planning, scheduling, a Python worker round trip:
about 0.4 s for a trivial Python data source, the floor of Spark's Python data source
API itself), so each of read and write is also timed on a tiny range (one record per
partition) and the JSON line gives the fixed cost apart from the per-record rate
``(records - tiny) / (time - tiny time)``. Needs the ``spark`` extra and Java 17.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import trio

from minibroker.client import Admin, Consumer, Producer
from minibroker.client.config import parse_properties
from minibroker.deploy.bench.common import (
    add_connection_arguments,
    bootstrap_of,
    ensure_topic,
    report,
)

FILL_SETTINGS = {"batch.size": 262144, "linger.ms": 5, "acks": 1}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--records", type=int, default=1_000_000, help="records to read (default 1000000)"
    )
    p.add_argument(
        "--record-size", type=int, default=100, help="value bytes when filling (default 100)"
    )
    p.add_argument("--topic", default="spark-bench", help="topic (default spark-bench)")
    p.add_argument(
        "--partitions", type=int, default=2, help="partitions when creating the topic (default 2)"
    )
    p.add_argument(
        "--replication-factor",
        type=int,
        default=-1,
        help="replication factor of the topics it creates (default: the broker's)",
    )
    add_connection_arguments(p)
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--no-write", action="store_true", help="time the read only")
    p.add_argument(
        "--write-option",
        action="append",
        metavar="KEY=VALUE",
        help="a sink option for the write, e.g. exactlyOnce=false (repeatable)",
    )


async def _fill(bootstrap: str, args: argparse.Namespace) -> int:
    """Top the topic up to --records records; returns how many it holds."""
    await ensure_topic(bootstrap, args.topic, args.partitions, args.replication_factor)
    async with Consumer(bootstrap) as consumer:
        count = await consumer.partitions_for(args.topic)
        parts = [(args.topic, p) for p in range(count)]
        ends, starts = await consumer.end_offsets(parts), await consumer.beginning_offsets(parts)
        have = sum(ends[tp] - starts[tp] for tp in ends)
    missing = args.records - have
    if missing > 0:
        value = os.urandom(args.record_size)
        async with Producer(bootstrap, FILL_SETTINGS) as producer:
            for i in range(missing):
                await producer.enqueue(args.topic, value, str(i).encode())
    return max(have, args.records)


def _session(master: str) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from minibroker.client.spark import register

    spark = (
        SparkSession.builder.master(master)
        .appName("minibroker-bench-spark-read")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def measure(args: argparse.Namespace) -> dict[str, Any]:
    bootstrap = bootstrap_of(args)
    sink_options = parse_properties(args.write_option, "--write-option")  # before any work
    available = trio.run(_fill, bootstrap, args)
    spark = _session(args.master)
    try:

        def source(**options: str) -> Any:
            # A DataFrameReader is mutable: each load gets its own.
            reader = spark.read.format("minibroker").option("kafka.bootstrap.servers", bootstrap)
            return reader.option("subscribe", args.topic).options(**options).load()

        tiny_range = json.dumps({args.topic: {str(p): 1 for p in range(args.partitions)}})
        source(endingOffsets=tiny_range).count()  # spawn the workers
        tiny_rows, tiny_read_s = _timed(lambda: source(endingOffsets=tiny_range).count())
        rows, read_s = _timed(lambda: source().count())
        figures: dict[str, Any] = {
            "benchmark": "spark-read",
            "records": rows,
            "read_s": round(read_s, 3),
            "read_records_per_sec": round(rows / read_s, 1),
            "read_fixed_cost_s": round(tiny_read_s, 3),
            "read_per_record_rate": _rate(rows - tiny_rows, read_s - tiny_read_s),
        }
        if not args.no_write:
            copy = f"{args.topic}-copy"
            trio.run(ensure_topic, bootstrap, copy, args.partitions, args.replication_factor)

            def write(**options: str) -> int:
                source(**options).select("key", "value").write.format("minibroker").mode(
                    "append"
                ).option("kafka.bootstrap.servers", bootstrap).option("topic", copy).options(
                    **sink_options
                ).save()
                return 0

            write(endingOffsets=tiny_range)  # the first write's one-off costs (workers, ids)
            _, tiny_write_s = _timed(lambda: write(endingOffsets=tiny_range))
            _, write_s = _timed(write)
            figures.update(
                write_s=round(write_s, 3),
                write_records_per_sec=round(rows / write_s, 1),
                write_fixed_cost_s=round(tiny_write_s, 3),
                write_per_record_rate=_rate(rows - tiny_rows, write_s - tiny_write_s),
                write_includes="reading the source again",
                write_acks="all",
                write_options=sink_options,
                write_replication_factor=trio.run(_replication_factor, bootstrap, copy),
            )
        figures["params"] = {
            "topic": args.topic,
            "partitions": args.partitions,
            "available": available,
            "master": args.master,
            "bootstrap": bootstrap,
        }
        return figures
    finally:
        spark.stop()


def _timed(work: Any) -> tuple[Any, float]:
    start = time.monotonic()
    result = work()
    return result, time.monotonic() - start


def _rate(records: int, seconds: float) -> float | None:
    return round(records / seconds, 1) if seconds > 0 else None


async def _replication_factor(bootstrap: str, topic: str) -> int:
    async with Admin(bootstrap) as admin:
        return len((await admin.describe_topics([topic]))[topic].partitions[0].replicas)


def run(args: argparse.Namespace) -> int:
    return report(measure, args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="minibroker bench spark-read")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
