"""What the client benchmarks share: connection options, topic set-up, percentiles, and
the one JSON line each ends with (or a one-line error)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from minibroker.client import Admin, NewTopic
from minibroker.protocol.errors import KafkaError


def add_connection_arguments(
    p: argparse.ArgumentParser, role: str | None = None, defaults: Mapping[str, Any] = {}
) -> None:
    """``--bootstrap``, and ``--property`` for a client of ``role`` if given."""
    p.add_argument(
        "--bootstrap",
        default=None,
        metavar="HOST:PORT",
        help="a broker (default: $MINIBROKER_BOOTSTRAP or 127.0.0.1:9092)",
    )
    if role is not None:
        p.add_argument(
            "--property",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=f"{role} setting by Kafka name (bench defaults: {dict(defaults)})",
        )


def bootstrap_of(args: argparse.Namespace) -> str:
    return args.bootstrap or os.environ.get("MINIBROKER_BOOTSTRAP") or "127.0.0.1:9092"


def load_average() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages: on a shared machine a figure moves
    with them, so every bench that quotes a rate says what they were."""
    return [round(x, 2) for x in os.getloadavg()]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (0.0 for none)."""
    if not sorted_values:
        return 0.0
    return float(sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))])


async def ensure_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    replication_factor: int = -1,
    configs: dict[str, str] | None = None,
) -> None:
    async with Admin(bootstrap) as admin:
        if topic not in await admin.list_topics():
            new = NewTopic(topic, partitions, replication_factor, configs or {})
            await admin.create_topics([new])


def report(
    measure: Callable[[argparse.Namespace], dict[str, Any]],
    args: argparse.Namespace,
    failed: Callable[[dict[str, Any]], bool] = lambda figures: False,
) -> int:
    """Print the figures as one JSON line: exit 0, or 3 if ``failed``; errors: one line, 1."""
    try:
        figures = measure(args)
    except (KafkaError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(figures))
    return 3 if failed(figures) else 0
