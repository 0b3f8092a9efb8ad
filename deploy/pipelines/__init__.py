"""Example Spark jobs over minibroker topics (need the ``spark`` extra and Java 17).

- ``events_windowed``: Structured Streaming, per-key event-time windows with a
  watermark, results to a topic and to Parquet.
- ``export_parquet``: batch export of a topic to Parquet.

Each is ``python -m deploy.pipelines.<name> --help``; the functions that build the
queries take a SparkSession, so tests run them in a shared one.
"""
