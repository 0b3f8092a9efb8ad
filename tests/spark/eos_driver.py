"""A Spark driver that the exactly-once tests run as a process of their own, so that
they can kill -9 it mid-batch and start it again on the same checkpoint.

    python eos_driver.py MODE BROKER INPUT OUTPUT WORKDIR

MODE ``stream``: a streaming query copies INPUT to OUTPUT with the minibroker sink.
``foreachBatch``: the same through foreachBatch and a batch save named by
txnAppId/txnVersion. ``at-least-once``: ``stream`` with exactlyOnce=false (the control).
``retry``: a batch copy (local[2,2]: Spark retries a failed task once); the test makes
the broker fail one Produce once part of the records is stored.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession

from minibroker.client.spark import register

# The sink hears of rows in Arrow batches of this many; small, so a task has stored some
# of its records long before it has seen them all.
ARROW_ROWS = 500
SINK = {"kafka.batch.size": "2048", "kafka.request.timeout.ms": "20000"}


def main(mode: str, broker: str, source: str, target: str, workdir: str) -> None:
    spark = (
        SparkSession.builder.master("local[2,2]" if mode == "retry" else "local[2]")
        .appName(f"eos-{mode}")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(ARROW_ROWS))
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    if mode == "retry":
        copy_batch(spark, broker, source, target)
    else:
        copy_stream(spark, mode, broker, source, target, Path(workdir) / "checkpoint")
    spark.stop()


def copy_stream(spark, mode: str, broker: str, source: str, target: str, checkpoint: Path):
    rows = (
        spark.readStream.format("minibroker")
        .option("kafka.bootstrap.servers", broker)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("key", "value")
    )
    writer = rows.writeStream.option("checkpointLocation", str(checkpoint))
    if mode == "foreachBatch":

        def save(batch, batch_id: int) -> None:
            out = batch.write.format("minibroker").option("kafka.bootstrap.servers", broker)
            out = out.option("topic", target).options(**SINK)
            out.option("txnAppId", "eos-copy").option("txnVersion", batch_id).mode("append").save()

        writer = writer.foreachBatch(save)
    else:
        writer = writer.format("minibroker").option("kafka.bootstrap.servers", broker)
        writer = writer.option("topic", target).options(**SINK)
        if mode == "at-least-once":
            writer = writer.option("exactlyOnce", "false")
    writer.trigger(availableNow=True).start().awaitTermination()


def copy_batch(spark, broker: str, source: str, target: str) -> None:
    """A batch copy; prints how many task attempts failed (the test fails one through the
    broker, and Spark's local[2,2] retries it once)."""
    rows = (
        spark.read.format("minibroker")
        .option("kafka.bootstrap.servers", broker)
        .option("subscribe", source)
        .load()
        .selectExpr("key", "value")
    )
    out = rows.write.format("minibroker").option("kafka.bootstrap.servers", broker)
    out.option("topic", target).options(**SINK).mode("append").save()
    tracker = spark.sparkContext.statusTracker()
    failed = 0
    for job in tracker.getJobIdsForGroup(None):
        for stage in tracker.getJobInfo(job).stageIds:
            info = tracker.getStageInfo(stage)
            failed += info.numFailedTasks if info else 0
    print(json.dumps({"failed_tasks": failed}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
