"""`minibroker bench startup`: what a cluster costs to start, for `cluster up` and per test.

Per round, three figures:

- ``cold_start_s``: from launching 3 brokers with no warm parent (the fork server starts
  and imports the broker, as in a fresh `minibroker cluster up`) to the first acks=all
  write acknowledged, with its phases read back from the brokers' own logs: processes up
  (every broker answers), quorum leader (``active_controller``), brokers registered (the
  last ``registered_with_controller``), first ISR (the health topic created with its full
  ISR, ``topic_created``) and first ack.
- ``fixture_setup_s`` / ``fixture_teardown_s``: the pytest plugin's per-test cluster
  (``minibroker_cluster``: start_cluster then close) with the fork server already warm,
  as for every test after a session's first.
- ``shared_reset_s``: ``LocalCluster.reset()`` of the shared cluster after a test that
  created a topic (``minibroker_shared_cluster``).

Ends with one JSON line: medians (and min/max) over the rounds, the load average before
and after (the figures depend on it far more than on minibroker), and the CPU count.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import trio

from minibroker.deploy import forkserver
from minibroker.deploy.bench.common import report
from minibroker.deploy.broker_cli import CommandError
from minibroker.deploy.cluster import ClusterState
from minibroker.deploy.cluster_ops import acks_all_write
from minibroker.deploy.launcher import free_port_range

# The phases, in order, and the log event that ends each (None: measured here).
PHASES = {
    "processes_up": None,
    "quorum_leader": "active_controller",
    "brokers_registered": "registered_with_controller",
    "first_isr": "topic_created",
    "first_ack": None,
}
_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT[\d:.]+)Z \[\s*\w+\s*\] (\w+)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=5, help="rounds of each figure (default 5)")
    p.add_argument("--brokers", type=int, default=3, help="brokers per cluster (default 3)")


def run(args: argparse.Namespace) -> int:
    return report(measure, args)


def _events(log: Path) -> dict[str, list[float]]:
    """Wall-clock times of each log event (console format, UTC timestamps)."""
    out: dict[str, list[float]] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = _LINE.match(line)
        if match:
            when = datetime.fromisoformat(match.group(1) + "+00:00").timestamp()
            out.setdefault(match.group(2), []).append(when)
    return out


def cold_start(root: Path, brokers: int) -> dict[str, float]:
    """One cold start; seconds from launch to each phase's end."""
    forkserver.shutdown()  # no warm parent: the start pays for importing the broker
    state = ClusterState(root, free_port_range(brokers), brokers)
    wall0, t0 = time.time(), time.monotonic()
    try:
        state.start_all()
        up = time.monotonic() - t0
        trio.run(acks_all_write, state.bootstrap, min(brokers, 3))
        acked = time.monotonic() - t0
    finally:
        state.stop_all()
    logs = [_events(root / f"broker-{b}" / "broker.log") for b in range(brokers)]
    phases = {"processes_up": up, "first_ack": acked}
    for phase, event in PHASES.items():
        if event is None:
            continue
        times = [t for events in logs for t in events.get(event, ())]
        if not times:
            raise ValueError(f"no '{event}' in the brokers' logs under {root}")
        # Registered: the last broker to register; the others: the first time it happened.
        when = max(times) if phase == "brokers_registered" else min(times)
        phases[phase] = when - wall0
    return phases


def fixture_round(root: Path, brokers: int) -> tuple[float, float, float]:
    """(setup, teardown, shared reset) seconds, the fork server warm."""
    try:
        # The pytest plugin's own code, so its figures are the fixture's: it needs pytest.
        from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
    except ModuleNotFoundError as exc:
        raise CommandError(
            f"bench startup times the pytest fixture and needs {exc.name}: "
            "pip install 'minibroker[test]'"
        ) from None
    t0 = time.monotonic()
    cluster = start_cluster(root / "per-test", brokers, DEFAULT_CONFIG)
    setup = time.monotonic() - t0
    try:
        cluster.create_topic("bench-startup")
        t1 = time.monotonic()
        cluster.reset()
        reset = time.monotonic() - t1
    finally:
        t2 = time.monotonic()
        cluster.close()
        teardown = time.monotonic() - t2
    return setup, teardown, reset


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.rounds < 1 or args.brokers < 1:
        raise ValueError("--rounds and --brokers must be at least 1")
    load_before = os.getloadavg()
    colds: list[dict[str, float]] = []
    setups, teardowns, resets = [], [], []
    with tempfile.TemporaryDirectory(prefix="minibroker-startup-") as tmp:
        for n in range(args.rounds):
            colds.append(cold_start(Path(tmp) / f"cold-{n}", args.brokers))
        forkserver.fork_server()  # warm, as in a pytest session after its first cluster
        for n in range(args.rounds):
            setup, teardown, reset = fixture_round(Path(tmp) / f"fixture-{n}", args.brokers)
            setups.append(setup)
            teardowns.append(teardown)
            resets.append(reset)
    return {
        "bench": "startup",
        "brokers": args.brokers,
        "rounds": args.rounds,
        "cold_start_s": _summary([c["first_ack"] for c in colds]),
        "phases_s": {phase: _summary([c[phase] for c in colds]) for phase in PHASES},
        "fixture_setup_s": _summary(setups),
        "fixture_teardown_s": _summary(teardowns),
        "shared_reset_s": _summary(resets),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
