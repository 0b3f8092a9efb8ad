"""Waiting on cluster state with a generous bound (never sleep-and-hope)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from confluent_kafka.admin import AdminClient

from minibroker.client import Admin
from minibroker.deploy.cluster import ClusterState

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess:
    """``minibroker ARGS`` as a user runs it, from the repo, with no bootstrap from the
    environment (each test names its cluster's)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MINIBROKER_BOOTSTRAP", None)
    return subprocess.run(
        [sys.executable, "-m", "minibroker.deploy.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )


def rd_admin(cluster: Any) -> AdminClient:
    """confluent-kafka's admin client on the cluster's Kafka listener (keep the handle
    while its futures are pending: a destroyed one fails them)."""
    return AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})


async def wait_for(check: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    with trio.move_on_after(timeout):
        while True:
            result = await check()
            if result:
                return result
            await trio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def broker_stats(state: ClusterState, broker_id: int) -> dict:
    async with Admin(f"{state.host}:{state.port(broker_id)}") as admin:
        return (await admin.broker_stats(broker_id))["stats"]


async def partition_view(
    state: ClusterState, broker_id: int, topic: str, partition: int
) -> dict | None:
    for p in (await broker_stats(state, broker_id))["partitions"]:
        if p["topic"] == topic and p["partition"] == partition:
            return p
    return None


async def isr_of(state: ClusterState, topic: str, partition: int) -> list[int]:
    async with Admin(state.bootstrap) as admin:
        desc = (await admin.describe_topics([topic]))[topic]
    return sorted(desc.partitions[partition].isr)


def read_segments(directory: Path, look: Callable[[Path], Any] = Path.read_bytes) -> list:
    """``look`` at each segment file of a live partition directory, in offset order. A
    broker's cleaner or retention swaps segments in and deletes old ones meanwhile: a
    file listed and gone before it was looked at means every file is looked at again."""
    for _ in range(100):
        try:
            return [look(path) for path in sorted(directory.glob("*.log"))]
        except FileNotFoundError:
            continue
    raise AssertionError(f"{directory}'s segments changed under 100 reads in a row")


def segment_bytes(state: ClusterState, broker_id: int, topic: str, partition: int) -> bytes:
    directory = Path(state.data_dir) / f"broker-{broker_id}" / f"{topic}-{partition}"
    return b"".join(read_segments(directory))


async def leader_of(state: ClusterState, topic: str, partition: int) -> int:
    async with Admin(state.bootstrap) as admin:
        return (await admin.describe_topics([topic]))[topic].partitions[partition].leader


async def partition_led_by(state: ClusterState, topic: str, wanted: Callable[[int], bool]) -> int:
    """The first partition of ``topic`` whose leader satisfies ``wanted``: placement is
    random (broker/controller/placement.py), so tests look a suitable partition up."""
    async with Admin(state.bootstrap) as admin:
        partitions = (await admin.describe_topics([topic]))[topic].partitions
    for index, p in enumerate(partitions):
        if wanted(p.leader):
            return index
    raise AssertionError(f"no partition of {topic} has a suitable leader: {partitions}")
