"""A SparkSession for the example jobs, with the minibroker source registered."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def add_spark_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap",
        default=os.environ.get("MINIBROKER_BOOTSTRAP", "127.0.0.1:9092"),
        metavar="HOST:PORT",
        help="brokers (default: $MINIBROKER_BOOTSTRAP or 127.0.0.1:9092)",
    )
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")


def spark_session(app_name: str, master: str) -> Any:
    """Workers must run this interpreter (it has pyarrow), hence PYSPARK_PYTHON."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from minibroker.client.spark import register

    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    register(spark)
    return spark


def ensure_topic(bootstrap: str, name: str, partitions: int = 1) -> bool:
    """Create ``name`` (the broker's default replication factor) unless it exists.

    Topics are not auto-created (``auto.create.topics.enable`` is false, see docs/semantics.md), so a
    job writing results to a topic of its own creates it, and runs as its recipe in docs/spark.md
    is written. Returns True if it created the topic.
    """
    from minibroker.client import NewTopic, SyncAdmin
    from minibroker.client.errors import TopicAlreadyExists

    with SyncAdmin(bootstrap) as admin:
        if name in admin.list_topics():
            return False
        try:
            admin.create_topics([NewTopic(name, partitions, -1)])
        except TopicAlreadyExists:  # created meanwhile by another run
            return False
    return True
