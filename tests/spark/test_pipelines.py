"""The example jobs in deploy/pipelines, end to end against the test broker, results checked exactly."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest

from minibroker.deploy.pipelines import events_windowed, export_parquet

pytestmark = pytest.mark.spark

BASE = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def event(user: str, amount: int, seconds: float) -> bytes:
    when = (BASE + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return json.dumps({"user": user, "amount": amount, "event_time": when}).encode()


def parse(argv: list[str], module) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(argv)


def run_windowed(spark, args) -> None:
    queries = events_windowed.start_queries(spark, args)
    try:
        for query in queries:
            assert query.awaitTermination(120), "the availableNow pipeline did not finish"
            assert query.exception() is None, query.exception()
    finally:
        for query in queries:
            query.stop()


def test_events_windowed_pipeline(spark, broker, new_topic, produce, source, tmp_path):
    events, results = new_topic(2), new_topic(1)
    # (user, amount, seconds after BASE): 1-minute windows, 30 s watermark.
    plan = [
        ("alice", 1, 5),
        ("bob", 2, 10),
        ("alice", 3, 50),
        ("carol", 4, 59.9),
        ("bob", 5, 61),
        ("alice", 6, 75),
        ("bob", 7, 119),
        ("alice", 8, 130),
        ("carol", 9, 140),
    ]
    produce(events, [(i % 2, u.encode(), event(u, a, s), 0) for i, (u, a, s) in enumerate(plan)])
    # Max event time 140 s: watermark 110 s closes the windows [0, 60) only.
    args = parse(
        [
            "--bootstrap",
            broker,
            "--topic",
            events,
            "--output-topic",
            results,
            "--output",
            str(tmp_path / "out"),
            "--max-offsets-per-trigger",
            "4",
        ],
        events_windowed,
    )
    run_windowed(spark, args)

    # A restart: a late event for the closed first window is dropped, and an event at 200 s
    # moves the watermark to 170 s, closing [60, 120).
    produce(
        events, [(0, b"alice", event("alice", 100, 20), 0), (1, b"dave", event("dave", 1, 200), 0)]
    )
    run_windowed(spark, args)

    expected: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for user, amount, seconds in plan:
        if seconds < 120:
            window = int(seconds // 60) * 60
            expected[(window, user)][0] += 1
            expected[(window, user)][1] += amount
    expected_rows = sorted((w, u, n, a) for (w, u), (n, a) in expected.items())

    parquet = spark.read.parquet(str(tmp_path / "out" / "windows")).collect()
    got = sorted(
        (
            int((r.window_start.replace(tzinfo=UTC) - BASE).total_seconds()),
            r.user,
            r.events,
            r.amount,
        )
        for r in parquet
    )
    assert got == expected_rows
    assert all((r.window_end - r.window_start) == timedelta(minutes=1) for r in parquet)

    out = source(subscribe=results).collect()
    from_topic = []
    for r in out:
        value = json.loads(r.value)
        assert r.key.decode() == value["user"]
        start = datetime.fromisoformat(value["window_start"].replace("Z", "+00:00"))
        from_topic.append(
            (int((start - BASE).total_seconds()), value["user"], value["events"], value["amount"])
        )
    assert sorted(from_topic) == expected_rows


def test_export_parquet_pipeline(spark, broker, new_topic, produce, tmp_path):
    topic = new_topic(3)
    produce(
        topic,
        [(i % 3, f"k{i}".encode(), f"v{i}".encode(), 1_000 + i, {"h": b"1"}) for i in range(30)],
    )
    args = parse(
        [
            "--bootstrap",
            broker,
            "--topic",
            topic,
            "--output",
            str(tmp_path / "export"),
            "--text",
            "--ending-offsets",
            json.dumps({topic: {"0": 8, "1": -1, "2": -1}}),
        ],
        export_parquet,
    )
    summary = export_parquet.export(spark, args)
    assert summary["rows"] == 28
    assert summary["partitions"]["0"] == {"first": 0, "last": 7, "rows": 8}
    rows = spark.read.parquet(str(tmp_path / "export")).collect()
    assert sorted((r.key, r.value) for r in rows) == sorted(
        (f"k{i}", f"v{i}") for i in range(30) if not (i % 3 == 0 and i // 3 >= 8)
    )
    assert all([(h.key, h.value) for h in r.headers] == [("h", b"1")] for r in rows)
