"""Request metrics (Kafka's RequestMetrics) and the Prometheus endpoint (``metrics.port``)."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from minibroker.client import Admin, Consumer, NewTopic, Producer
from minibroker.deploy.launcher import free_port

pytestmark = pytest.mark.integration


async def _traffic(address: str) -> None:
    async with Admin(address) as admin:
        await admin.create_topics([NewTopic("m", 1, 1)])
    async with Producer(address, acks="all") as producer:
        await producer.send("m", b"x")
    async with Consumer(address, **{"fetch.max.wait.ms": 300}) as consumer:
        consumer.assign([("m", 0)])
        consumer.seek_to_end()
        assert await consumer.poll(timeout_ms=1000) == []  # parks, then expires


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return answer.read().decode()


def _value(text: str, name: str, **labels: str) -> float:
    """The sample ``name`` whose labels include ``labels`` (parsed by prometheus-client)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return sample.value
    raise AssertionError(f"no sample {name} with {labels}")


async def test_prometheus_endpoint_serves_requests_purgatories_and_partitions(broker_factory):
    port = free_port()
    proc = broker_factory({"metrics.port": port})
    await _traffic(proc.address)
    async with Admin(proc.address) as admin:
        await admin.list_topics()  # one connection open while scraping
        text = await trio.to_thread.run_sync(_scrape, port)
    assert _value(text, "minibroker_requests_total", broker="0", api="PRODUCE") >= 1
    # The fetch that expired was parked: its time went to the remote (purgatory) phase.
    remote = {"api": "FETCH", "phase": "remote", "le": "+Inf"}
    assert _value(text, "minibroker_request_time_seconds_bucket", **remote) >= 1
    late = "minibroker_purgatory_expiry_lateness_seconds_count"
    assert _value(text, late, purgatory="Fetch") >= 1
    hw = "minibroker_partition_high_watermark"
    assert _value(text, hw, topic="m", partition="0") == 1
    assert _value(text, "minibroker_connections") >= 1


async def test_stats_shows_request_times_per_api(broker_process):
    await _traffic(broker_process.address)
    async with Admin(broker_process.address) as admin:
        stats = (await admin.broker_stats())["stats"]
    produce = stats["requests"]["PRODUCE"]
    assert produce["requests"] >= 1 and produce["total"]["p99_ms_le"] is not None
    assert stats["purgatory"]["fetch"]["expiry_lateness"]["count"] >= 1
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "minibroker.deploy.cli",
            "stats",
            "--bootstrap",
            broker_process.address,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "PRODUCE" in out.stdout and "late p99" in out.stdout


def test_a_taken_metrics_port_stops_the_broker_with_one_line(broker_factory, tmp_path):
    taken = broker_factory()  # its port is in use now
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "minibroker.deploy.cli",
            "broker",
            "--data-dir",
            str(tmp_path / "second"),
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--set",
            f"metrics.port={taken.port}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0
    assert f"metrics.port {taken.port}" in run.stderr and "Traceback" not in run.stderr
