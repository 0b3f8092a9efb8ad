"""The Spark recipes of docs/spark.md and the README's tour run as written (the docs test
marks them skipped for needing Java): only the broker address and /tmp paths are moved to
the test's own, so a developer's cluster on 9092 and their files are untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minibroker.client import SyncConsumer
from tests.integration.test_readme_commands import ROOT, readme_block

pytestmark = pytest.mark.spark
SPARK_PAGE = "docs/spark.md"


def _ensure(broker: str, name: str, partitions: int) -> None:
    from minibroker.deploy.pipelines.session import ensure_topic

    ensure_topic(broker, name, partitions)


def _read_all(broker: str, topic: str, partitions: int) -> list:
    with SyncConsumer(broker) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        out = []
        while batch := consumer.poll(timeout_ms=1500):
            out += batch
    return out


def test_the_readme_tour_reads_a_topic_into_a_dataframe(spark, broker, produce, capsys):
    _ensure(broker, "orders", 3)  # as the README's tour creates it
    produce("orders", [(p, f"k{p}".encode(), f"order {p}".encode(), 0) for p in range(3)])
    code = readme_block("### Spark", "python").replace("127.0.0.1:9092", broker)
    exec(compile(code, "README.md (Spark)", "exec"), {})
    assert "order 0" in capsys.readouterr().out


def test_the_python_recipe_runs_as_written(spark, broker, produce):
    _ensure(broker, "orders", 3)  # as the README's command-line tour creates it
    produce("orders", [(p, f"k{p}".encode(), f"order {p}".encode(), 0) for p in range(3)])
    code = readme_block("# Spark", "python", SPARK_PAGE).replace("127.0.0.1:9092", broker)
    exec(compile(code, "docs/spark.md", "exec"), {"spark": spark})
    values = sorted(r.value for r in _read_all(broker, "orders-upper", 3))
    # Every order upper-cased once: ours, and any an earlier test of the session wrote.
    orders = sorted(r.value.upper() for r in _read_all(broker, "orders", 3))
    assert values == orders and {b"ORDER 0", b"ORDER 1", b"ORDER 2"} <= set(values)


def test_the_foreach_batch_recipe_runs_as_written(spark, broker, produce, tmp_path):
    _ensure(broker, "orders", 3)
    namespace = {"spark": spark}
    for heading in ("# Spark", "## Exactly once"):
        code = readme_block(heading, "python", SPARK_PAGE).replace("127.0.0.1:9092", broker)
        code = code.replace("/tmp/", f"{tmp_path}/")
        exec(compile(code, f"docs/spark.md ({heading})", "exec"), namespace)
    query = namespace["query"]
    try:
        query.processAllAvailable()  # the stream starts at latest: only what comes next
        produce("orders", [(p, None, f"late order {p}".encode(), 0) for p in range(3)])
        query.processAllAvailable()
    finally:
        query.stop()
    values = [r.value for r in _read_all(broker, "orders-upper", 3)]
    assert sorted(v for v in values if v.startswith(b"LATE")) == [
        b"LATE ORDER 0",
        b"LATE ORDER 1",
        b"LATE ORDER 2",
    ]


def test_the_example_job_commands_run_as_written(broker, produce, tmp_path):
    _ensure(broker, "events", 2)

    def event(user: str, seconds: int) -> bytes:
        when = f"2024-05-01T12:{seconds // 60:02d}:{seconds % 60:02d}Z"
        return json.dumps({"user": user, "amount": 2, "event_time": when}).encode()

    # Event time reaches 100 s: the 30 s watermark closes the window [0, 60) only.
    produce("events", [(0, b"a", event("alice", 5), 0), (1, b"b", event("bob", 10), 0)])
    produce("events", [(0, b"a", event("alice", 100), 0)])
    block = readme_block("## Example jobs", "bash", SPARK_PAGE).replace("127.0.0.1:9092", broker)
    block = block.replace("/tmp/", f"{tmp_path}/")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = subprocess.run(
        ["bash", "-e", "-c", block], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    windows = [json.loads(r.value) for r in _read_all(broker, "events_per_window", 1)]
    assert sorted((w["user"], w["events"]) for w in windows) == [("alice", 1), ("bob", 1)]
    assert list((tmp_path / "events-out" / "windows").glob("*.parquet"))
    assert list((tmp_path / "events-parquet").rglob("*.parquet"))
