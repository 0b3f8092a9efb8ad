"""Read topics into Spark DataFrames and write DataFrames to topics: the ``minibroker`` data source.

``from client.spark import register; register(spark)``, then
``spark.read.format("minibroker").option("kafka.bootstrap.servers", ...)`` with the
options of Spark's Kafka source (see ``options``). Needs the ``spark`` extra
(pyspark >= 4.2 and pyarrow). This package is the only part of ``client`` that
imports pyspark, and ``import client`` never imports it.
"""

from __future__ import annotations

from typing import Any

from minibroker.client.spark.fetch import DataLossError
from minibroker.client.spark.options import OptionError
from minibroker.client.spark.source import NAME, MinibrokerDataSource


def register(spark: Any) -> None:
    """Make ``format("minibroker")`` available in this SparkSession (idempotent per session)."""
    spark.dataSource.register(MinibrokerDataSource)


__all__ = ["NAME", "DataLossError", "MinibrokerDataSource", "OptionError", "register"]
