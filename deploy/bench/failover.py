"""`minibroker bench failover`: how long the cluster is without a controller after kill -9.

Starts its own cluster (default: 3 brokers, every one a voter, as `cluster up`) in a
temporary directory, then per round: find the active controller, SIGKILL it, and time
(a) until another voter is the active controller with its epoch committed and (b) until
``CreateTopics`` succeeds through the survivors, which is what a user notices. The killed
broker is restarted (and caught up) before the next round, so every round starts from a
full quorum. Ends with one JSON line: per-round figures, their median and max, and the
quorum timeouts in force.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from minibroker.client import Admin, NewTopic
from minibroker.client.config import parse_properties
from minibroker.deploy.bench.common import report
from minibroker.deploy.cluster import ClusterState
from minibroker.deploy.cluster_ops import acks_all_write, broker_stats_of, quorum_view
from minibroker.deploy.launcher import free_port_range
from minibroker.protocol.errors import KafkaError

POLL_S = 0.01


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--brokers", type=int, default=3, help="voters in the cluster (default 3)")
    p.add_argument("--rounds", type=int, default=5, help="controller kills (default 5)")
    p.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="broker setting for every broker, e.g. controller.quorum.fetch.timeout.ms=2000",
    )


def run(args: argparse.Namespace) -> int:
    return report(measure, args)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.brokers < 3:
        raise ValueError("--brokers must be at least 3: a smaller quorum cannot lose a voter")
    config = {str(k): str(v) for k, v in parse_properties(args.property).items()}
    with tempfile.TemporaryDirectory(prefix="minibroker-failover-") as tmp:
        state = ClusterState(Path(tmp), free_port_range(args.brokers), args.brokers, config)
        state.start_all()
        try:
            rounds = trio.run(_rounds, state, args.rounds)
        finally:
            state.stop_all()
    elected = sorted(r["controller_elected_s"] for r in rounds)
    created = sorted(r["topic_created_s"] for r in rounds)
    return {
        "bench": "failover",
        "brokers": args.brokers,
        "rounds": rounds,
        "controller_elected_s": {"median": statistics.median(elected), "max": elected[-1]},
        "topic_created_s": {"median": statistics.median(created), "max": created[-1]},
        "config": config,
    }


async def _active_controller(state: ClusterState, alive: list[int]) -> int | None:
    """The voter every live broker agrees is the active controller, or None yet."""
    stats = await broker_stats_of(state, alive)
    view = quorum_view(stats)
    leader = view["active_controller"]
    if leader is None or len(stats) < len(alive):
        return None
    agree = all(s["quorum"]["leader_id"] == leader for s in stats.values())
    return leader if agree else None


async def _wait(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await condition()
        if value is not None and value is not False:
            return value
        await trio.sleep(POLL_S)
    raise ValueError(f"timed out after {timeout:.0f}s waiting for {what}")


async def _rounds(state: ClusterState, count: int) -> list[dict[str, Any]]:
    everyone = list(range(state.brokers))
    await acks_all_write(state.bootstrap, min(state.brokers, 3))
    rounds = []
    for n in range(count):
        controller = await _wait(lambda: _active_controller(state, everyone), 30, "a controller")
        alive = [b for b in everyone if b != controller]
        survivors = ",".join(f"{state.host}:{state.port(b)}" for b in alive)
        state.kill(controller)
        t0 = time.monotonic()

        async def new_controller(alive: list[int] = alive) -> int | None:
            return await _active_controller(state, alive)

        async def topic_created(survivors: str = survivors, n: int = n) -> bool:
            try:
                async with Admin(survivors) as admin:
                    result = await admin.create_topics(
                        [NewTopic(f"failover-{n}", 1, 2)], raise_errors=False
                    )
            except KafkaError:  # the client's metadata still names the dead controller
                return False
            return result[f"failover-{n}"] is None

        elected_to = await _wait(new_controller, 30, "a new active controller")
        elected_s = time.monotonic() - t0
        await _wait(topic_created, 30, "CreateTopics on the new controller")
        created_s = time.monotonic() - t0
        rounds.append(
            {
                "killed": controller,
                "new_controller": elected_to,
                "controller_elected_s": round(elected_s, 3),
                "topic_created_s": round(created_s, 3),
            }
        )
        # Back to a full quorum before the next kill: restart and wait until it follows.
        state.restart(controller)
        await _wait(lambda: _active_controller(state, everyone), 30, "the restarted voter")
    return rounds
