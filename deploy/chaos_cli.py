"""`minibroker chaos --duration S [--brokers 3] [--seed N] [--data-dir DIR] [--faults ...]
[--spare-controller | --target-controller] [--workload groups [--members N]
[--confluent-members K] | --workload transactions [--confluent-producers K]]` and `minibroker chaos --check-history FILE`.

Prints what it does as it goes, then the checker's findings (each violation under the
name of the rule that fired), then one JSON line of counts. The history is written to
``DIR/history.json.gz``; on a violation the whole data directory (history, broker logs,
segments) is kept and its path printed, so a rare failure can be studied and judged
again. Exit 0: no violation; 1: a violation; 2: the run itself could not be done;
130/143: SIGINT/SIGTERM stopped it (after stopping every broker and member it started).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

from minibroker.deploy import interrupt
from minibroker.deploy.chaos import (
    CONTROLLER_FAILOVER,
    FAULT_KINDS,
    GROUP_FAULT_KINDS,
    TXN_FAULT_KINDS,
    ChaosRun,
)
from minibroker.deploy.chaos_check import PLANTS, Verdict, check, load_history, plant, save_history
from minibroker.deploy.cluster import ClusterError
from minibroker.deploy.launcher import BrokerStartError
from minibroker.protocol.errors import KafkaError

HISTORY_FILE = "history.json.gz"
TXN_PRODUCERS = 3  # the transactional workload's producers (ChaosRun's ``producers``)
SHOWN = 50  # violations printed; all of them go to violations.txt


def fault_kinds(value: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in value.split(",") if k.strip())
    unknown = [k for k in kinds if k not in (*GROUP_FAULT_KINDS, *TXN_FAULT_KINDS)]
    if not kinds or unknown:
        raise argparse.ArgumentTypeError(
            f"expected some of {','.join(FAULT_KINDS)} (with --workload groups also "
            "fail-heartbeats, slow-heartbeats; with --workload transactions also "
            f"slow-commits), got {value!r}"
        )
    return kinds


# The faults that only a workload's clients notice: the workload they need.
WORKLOAD_OF_FAULT = {
    "fail-heartbeats": "groups",
    "slow-heartbeats": "groups",
    "slow-commits": "transactions",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=30, help="seconds of chaos (default 30)")
    p.add_argument("--brokers", type=int, default=3, help="brokers, at least 2 (default 3)")
    p.add_argument("--seed", type=int, default=0, help="nemesis seed (default 0)")
    p.add_argument(
        "--data-dir",
        type=Path,
        help="where the cluster lives (default: a temporary dir, removed unless a violation)",
    )
    p.add_argument("--partitions", type=int, default=3, help="partitions of the chaos topic")
    p.add_argument(
        "--faults",
        type=fault_kinds,
        default=FAULT_KINDS,
        help=f"the nemesis' faults, comma-separated (default {','.join(FAULT_KINDS)}; with "
        "--workload groups also fail-heartbeats: the group coordinator answers heartbeats "
        "NOT_COORDINATOR; and slow-heartbeats: it holds Heartbeat and SyncGroup requests "
        "1.5 s while a member leaves and later a new one joins; with --workload "
        "transactions also slow-commits: a transaction coordinator holds EndTxn 2.5 s)",
    )
    target = p.add_mutually_exclusive_group()
    target.add_argument(
        "--spare-controller",
        dest="target_controller",
        action="store_false",
        help="fault brokers by id only, never 'whoever is the active controller now'",
    )
    target.add_argument(
        "--target-controller",
        dest="target_controller",
        action="store_true",
        help="also fault whoever is the active controller when a fault starts (the default)",
    )
    p.add_argument(
        "--no-idempotence",
        dest="idempotence",
        action="store_false",
        help="producers with enable.idempotence=false: retries may store a record twice, "
        "which is then reported, not judged",
    )
    p.add_argument(
        "--workload",
        choices=("producers", "groups", "transactions"),
        default="producers",
        help="groups: also a consumer group whose member processes consume and commit "
        "while the nemesis faults the group coordinator too and pauses members; "
        "transactions: three transactional producers (some transactions aborted on "
        "purpose) and a read_committed consumer on a topic of their own, while the "
        "nemesis faults the transaction coordinators and that topic's leaders too",
    )
    p.add_argument("--members", type=int, default=3, help="group members (default 3)")
    p.add_argument(
        "--confluent-members",
        type=int,
        default=1,
        help="how many of the members are confluent-kafka consumers on the Kafka listener "
        "(default 1; the rest use the bundled client)",
    )
    p.add_argument(
        "--confluent-producers",
        type=int,
        default=1,
        help="with --workload transactions: how many of the three transactional producers "
        "are confluent-kafka ones on the Kafka listener (default 1; the rest use the "
        "bundled client)",
    )
    p.add_argument(
        "--plant",
        choices=PLANTS,
        help="doctor the history with one violation before checking (tests the checker)",
    )
    p.add_argument(
        "--check-history",
        type=Path,
        metavar="FILE",
        help="judge a history kept by an earlier run again (no cluster is started)",
    )
    p.set_defaults(func=run, target_controller=CONTROLLER_FAILOVER)


@interrupt.handles_signals
def run(args: argparse.Namespace) -> int:
    """A chaos run (or a kept history judged again). SIGINT/SIGTERM stop the run and the
    processes it started: exit 130/143, no verdict."""
    if args.check_history is not None:
        return recheck(args.check_history)
    if args.brokers < 2 or args.duration <= 0 or args.partitions < 1 or args.members < 1:
        print(
            "error: chaos needs --brokers >= 2, --duration > 0, --partitions >= 1, --members >= 1",
            file=sys.stderr,
        )
        return 2
    for kind in args.faults:
        needed = WORKLOAD_OF_FAULT.get(kind, args.workload)
        if needed != args.workload:
            print(f"error: --faults {kind} needs --workload {needed}", file=sys.stderr)
            return 2
    if not 0 <= args.confluent_members <= args.members:
        print("error: --confluent-members must be between 0 and --members", file=sys.stderr)
        return 2
    if not 0 <= args.confluent_producers <= TXN_PRODUCERS:
        print(
            f"error: --confluent-producers must be between 0 and {TXN_PRODUCERS}", file=sys.stderr
        )
        return 2
    confluent = args.confluent_members if args.workload == "groups" else 0
    confluent_producers = args.confluent_producers if args.workload == "transactions" else 0
    if (confluent or confluent_producers) and importlib.util.find_spec("confluent_kafka") is None:
        flag = "--confluent-members" if confluent else "--confluent-producers"
        print(
            "error: confluent-kafka clients need the confluent-kafka package (pip install "
            f"'minibroker[test]'), or {flag} 0",
            file=sys.stderr,
        )
        return 2
    temporary = args.data_dir is None
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="minibroker-chaos-"))
    if (data_dir / "cluster.json").exists():
        print(
            f"error: {data_dir} already holds a cluster; use an empty --data-dir", file=sys.stderr
        )
        return 2
    chaos = ChaosRun(
        data_dir,
        args.brokers,
        args.seed,
        args.duration,
        args.partitions,
        kinds=args.faults,
        target_controller=args.target_controller,
        idempotence=args.idempotence,
        workload=args.workload,
        members=args.members,
        confluent_members=confluent,
        confluent_producers=confluent_producers,
    )
    targets = (
        "any broker, the active controller included"
        if args.target_controller
        else "never the controller (broker 0)"
    )
    print(
        f"chaos: seed {args.seed}, {args.duration:g}s, {args.brokers} brokers, "
        f"faults {','.join(chaos.kinds)} on {targets}, workload {args.workload}; "
        f"data in {data_dir}",
        flush=True,
    )
    try:
        history = chaos.run()
    except BrokenPipeError:
        raise  # stdout's reader left: a quiet exit (deploy/pipes.py), not a failed run
    except (ClusterError, BrokerStartError, KafkaError, OSError) as exc:
        print(f"error: the chaos run failed: {exc} (data kept in {data_dir})", file=sys.stderr)
        return 2
    if history is None:  # SIGINT/SIGTERM: the brokers and members are stopped already
        print("chaos: interrupted; every broker and member it started is stopped", file=sys.stderr)
        if temporary:
            shutil.rmtree(data_dir, ignore_errors=True)
        return chaos.signal_status
    history_path = data_dir / HISTORY_FILE
    save_history(history, history_path)
    if args.plant:
        plant(history, args.plant)
        print(f"planted a '{args.plant}' violation in the history")
    verdict = check(history)
    report(verdict, data_dir)
    kept = not verdict.ok and not args.plant
    if kept or not temporary:
        print(f"history kept in {history_path} (broker logs in {data_dir}/broker-*/)")
        if kept:
            print(f"judge it again: minibroker chaos --check-history {history_path}")
    else:
        shutil.rmtree(data_dir, ignore_errors=True)
    summary = {
        "seed": args.seed,
        "duration_s": args.duration,
        "target_controller": args.target_controller,
        "workload": args.workload,
        **verdict.counts,
        "history": str(history_path) if kept or not temporary else None,
    }
    print(json.dumps(summary), flush=True)
    return 0 if verdict.ok else 1


def report(verdict: Verdict, data_dir: Path | None = None) -> None:
    """Per rule ok or how many fired; then every violation named by its rule."""
    print()
    for rule, items in verdict.violations.items():
        print(f"{rule:<18} {'ok' if not items else f'{len(items)} VIOLATION(S)'}")
    lines = verdict.lines()
    for line in lines[:SHOWN]:
        print(f"    {line}")
    if data_dir is not None and lines:
        (data_dir / "violations.txt").write_text("\n".join(lines) + "\n")
        if len(lines) > SHOWN:
            print(f"    ... {len(lines) - SHOWN} more in {data_dir / 'violations.txt'}")
    c = verdict.counts
    print(
        f"\n{c['acknowledged']} acknowledged ({c['acked_per_s']}/s), {c['failed']} failed "
        f"({c['failed_but_present']} of them written anyway, as a timeout allows), "
        f"{c['duplicates']} duplicate(s) from retries, {c['consumed']} consumed live, "
        f"{c['final_records']} in the final log; nemesis {c['nemesis']}"
    )
    if "group_consumed" in c:
        print(
            f"group: {c['group_consumed']} consumed by the members ({c['group_redelivered']} "
            f"redelivered), {c['group_generations']} generations, {c['group_commits']} commits "
            f"({c['group_commit_failures']} refused), {c['group_stale_answers_ignored']} stale "
            f"answers ignored, settled {c['group_settle_s']}s after the heal; member nemesis "
            f"{c['group_nemesis']}; consumed by client {c['group_consumed_by']}"
        )
    if "txns" in c:
        print(
            f"transactions: {c['txns']} ({c['txn_committed']} committed, {c['txn_aborted']} "
            f"aborted, {c['txn_unknown']} unknown of which {c['txn_unknown_committed']} "
            f"visible whole), {c['txn_records_visible']} records visible read_committed, "
            f"{c['txn_aborted_records_written']} aborted records in the log, "
            f"{c['txn_live_read']} read live; transactions by client {c['txn_by_client']}"
        )
    print("verdict:", "no violation" if verdict.ok else "VIOLATIONS FOUND")


def recheck(path: Path) -> int:
    try:
        history = load_history(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: cannot read the history {path}: {exc}", file=sys.stderr)
        return 2
    for t, text in history.events:
        print(f"[{t:6.2f}s] {text}")
    verdict = check(history)
    report(verdict)
    print(json.dumps({"history": str(path), **verdict.counts}), flush=True)
    return 0 if verdict.ok else 1
