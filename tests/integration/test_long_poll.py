"""Long-poll fetches park in the broker's fetch purgatory: woken by data, or expired."""

from __future__ import annotations

import time

import pytest
import trio

from minibroker.client import Admin, Consumer, NewTopic, Producer

pytestmark = pytest.mark.integration


async def test_long_poll_returns_when_data_arrives_and_empty_after_max_wait(broker):
    async with Admin(broker) as admin:
        await admin.create_topics([NewTopic("lp", 1, 1)])
        stats_before = (await admin.broker_stats())["stats"]["purgatory"]["fetch"]
    async with Consumer(broker, **{"fetch.max.wait.ms": 600, "fetch.min.bytes": 1}) as consumer:
        consumer.assign([("lp", 0)])
        consumer.seek_to_end()
        await consumer.position(("lp", 0))

        t0 = time.monotonic()
        # Wait past the broker's 600 ms: a client that gave up first would close its
        # connection, and the parked fetch would end with it instead of expiring.
        assert await consumer.poll(timeout_ms=1500) == []
        empty_wait = time.monotonic() - t0
        assert empty_wait >= 0.5  # the broker held the fetch for max_wait, not a busy loop

    async with Consumer(broker, **{"fetch.max.wait.ms": 30000, "fetch.min.bytes": 1}) as consumer:
        consumer.assign([("lp", 0)])
        consumer.seek(("lp", 0), 0)
        result = {}

        async def poll():
            t = time.monotonic()
            result["records"] = await consumer.poll(timeout_ms=30000)
            result["done"] = time.monotonic()
            result["waited"] = time.monotonic() - t

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            await trio.sleep(0.3)
            async with Producer(broker, acks=1) as producer:
                await producer.send("lp", b"now")
            sent = time.monotonic()
    assert [r.value for r in result["records"]] == [b"now"]
    assert result["done"] - sent < 5  # answered by the append, far before the 30 s max wait
    async with Admin(broker) as admin:
        stats = (await admin.broker_stats())["stats"]["purgatory"]["fetch"]
    assert stats["expired"] > stats_before["expired"]
    assert stats["completed"] > stats_before["completed"]


def test_stats_command_shows_purgatory_metrics(broker):
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "minibroker.deploy.cli", "stats", "--bootstrap", broker]
    table = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert table.returncode == 0, table.stderr
    assert "purgatory" in table.stdout and "fetch" in table.stdout
    body = json.loads(
        subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=30).stdout
    )
    assert set(body["stats"]["purgatory"]["fetch"]) >= {
        "pending",
        "watched",
        "completed",
        "expired",
        "purges",
    }
    down = subprocess.run([*cmd[:-1], "127.0.0.1:1"], capture_output=True, text=True, timeout=30)
    assert down.returncode != 0 and down.stderr.count("\n") == 1 and "127.0.0.1:1" in down.stderr
