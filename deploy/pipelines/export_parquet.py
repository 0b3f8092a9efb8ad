"""Batch job: export a topic (all partitions, or an offset range) to Parquet.

    python -m deploy.pipelines.export_parquet --bootstrap 127.0.0.1:9092 --topic events \
        --output /tmp/events-parquet [--starting-offsets JSON] [--ending-offsets JSON] [--text]

Writes one row per record with the source's columns (key, value, topic, partition,
offset, timestamp, timestampType, headers), partitioned by ``partition``. ``--text``
decodes key and value as UTF-8 strings. The read is bounded by each partition's high
watermark when the job starts, so it ends even while producers keep writing.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from minibroker.deploy.pipelines.session import add_spark_arguments, spark_session


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_spark_arguments(p)
    p.add_argument("--topic", required=True, help="topic to export")
    p.add_argument("--output", required=True, help="Parquet directory (replaced)")
    p.add_argument(
        "--starting-offsets", default="earliest", help="earliest or JSON (default earliest)"
    )
    p.add_argument("--ending-offsets", default="latest", help="latest or JSON (default latest)")
    p.add_argument("--text", action="store_true", help="store key and value as UTF-8 strings")


def export(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Run the export; returns what was written (rows, per-partition offset bounds)."""
    from pyspark.sql import functions as F

    df = (
        spark.read.format("minibroker")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", args.starting_offsets)
        .option("endingOffsets", args.ending_offsets)
        .option("includeHeaders", "true")
        .load()
    )
    if args.text:
        df = df.withColumn("key", F.col("key").cast("string")).withColumn(
            "value", F.col("value").cast("string")
        )
    df.write.mode("overwrite").partitionBy("partition").parquet(args.output)
    written = spark.read.parquet(args.output)
    bounds = (
        written.groupBy("partition").agg(F.min("offset"), F.max("offset"), F.count("*")).collect()
    )
    return {
        "rows": sum(r[3] for r in bounds),
        "partitions": {
            str(r[0]): {"first": r[1], "last": r[2], "rows": r[3]} for r in sorted(bounds)
        },
        "output": args.output,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.pipelines.export_parquet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    spark = spark_session("minibroker-export-parquet", args.master)
    try:
        print(json.dumps(export(spark, args)))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
