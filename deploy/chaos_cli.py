"""`minibroker chaos --duration S [--brokers 3] [--seed N] [--data-dir DIR]`.

Prints what it does as it goes, then the checker's findings, then one JSON line of
counts. Exit 0: no violation; 1: a violation; 2: the run itself could not be done.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from protocol.errors import KafkaError

from .chaos import ChaosRun
from .chaos_check import PLANTS, check, plant
from .cluster import ClusterError
from .launcher import BrokerStartError


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chaos",
        help="acks=all producers and a consumer under a seeded nemesis; check Kafka's promises",
    )
    p.add_argument("--duration", type=float, default=30, help="seconds of chaos (default 30)")
    p.add_argument("--brokers", type=int, default=3, help="brokers, at least 2 (default 3)")
    p.add_argument("--seed", type=int, default=0, help="nemesis seed (default 0)")
    p.add_argument(
        "--data-dir", type=Path, help="where the cluster lives (default: a temporary dir, removed)"
    )
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument(
        "--plant",
        choices=PLANTS,
        help="doctor the history with one violation before checking (tests the checker)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.brokers < 2 or args.duration <= 0 or args.partitions < 1:
        print(
            "error: chaos needs --brokers >= 2, --duration > 0, --partitions >= 1", file=sys.stderr
        )
        return 2
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="minibroker-chaos-"))
    if (data_dir / "cluster.json").exists():
        print(
            f"error: {data_dir} already holds a cluster; use an empty --data-dir", file=sys.stderr
        )
        return 2
    chaos = ChaosRun(data_dir, args.brokers, args.seed, args.duration, args.partitions)
    print(
        f"chaos: seed {args.seed}, {args.duration:g}s, {args.brokers} brokers, "
        f"data in {data_dir}; never faulting the controller (broker 0)",
        flush=True,
    )
    try:
        history = chaos.run()
    except (ClusterError, BrokerStartError, KafkaError, OSError) as exc:
        print(f"error: the chaos run failed: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    if args.plant:
        plant(history, args.plant)
        print(f"planted a '{args.plant}' violation in the history")
    verdict = check(history)
    print()
    for rule, items in verdict.violations.items():
        print(f"{rule:<15} {'ok' if not items else f'{len(items)} VIOLATION(S)'}")
        for item in items[:20]:
            print(f"    {item}")
    c = verdict.counts
    print(
        f"\n{c['acknowledged']} acknowledged, {c['failed']} failed "
        f"({c['failed_but_present']} of them written anyway, as a timeout allows), "
        f"{c['duplicates']} duplicate(s) from retries, {c['consumed']} consumed live, "
        f"{c['final_records']} in the final log"
    )
    print("verdict:", "no violation" if verdict.ok else "VIOLATIONS FOUND")
    print(json.dumps({"seed": args.seed, "duration_s": args.duration, **c}), flush=True)
    return 0 if verdict.ok else 1
