"""`minibroker bench compare`: the working tree against a git revision, in one sitting.

    minibroker bench compare --baseline e90d03f --rounds 5 -- \\
        produce --acks all --records 200000 --replication-factor 3 \\
        --config min.insync.replicas=2 --then consume --records 200000

Comparing each change with the commit just before it hides a regression that arrives in
small steps; comparing against a release point in one sitting does not. On a shared
machine a figure moves with the neighbours' load by more than most regressions, so the
two builds (each a non-editable install in a venv of its own, builds.py: both pay the
same to import) alternate run by run, the first of each round swaps every round (neither
always runs after the other), and what is quoted is each figure's median over the runs.

Every run gets a fresh ``cluster up`` (``--brokers``, default 3) on free ports below the
ephemeral range, in a temporary directory that is also every command's working
directory: brokers start as ``python -m ...``, which puts the current directory on
sys.path, so a build run from a checkout would import that checkout's code. The benches
of a run (``--then`` separates them) share its cluster, so ``consume`` reads what
``produce`` wrote; a ``kafka-clients`` step gets the cluster's Kafka listeners (on free
ports too) as its bootstrap. Besides each bench's own figures, a run records the CPU seconds its
brokers and its bench process spent: steadier than wall-clock rates on a busy machine.

Progress goes to stderr, one JSON line a run; the result is one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from minibroker.deploy.bench import builds
from minibroker.deploy.bench.builds import Build
from minibroker.deploy.bench.load import raise_fd_limit
from minibroker.deploy.broker_cli import CommandError
from minibroker.deploy.launcher import free_port_range

THEN = "--then"
SIDES = ("baseline", "working")
# What a bench echoes of its own arguments: not a figure.
NOT_FIGURES = frozenset({"params"})
# Benches of stock Kafka clients: their cluster gets Kafka listeners and they are
# pointed at them.
KAFKA_BENCHES = frozenset({"kafka-clients", "transactions"})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--baseline", required=True, metavar="REV", help="git revision to compare against"
    )
    p.add_argument("--rounds", type=int, default=3, help="runs of each build (default 3)")
    p.add_argument(
        "--brokers", type=int, default=3, help="brokers in each run's fresh cluster (default 3)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="broker setting for both builds' clusters (repeatable)",
    )
    p.add_argument(
        "--timeout", type=float, default=600, help="seconds any one command may take (default 600)"
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help=f"where built revisions are kept (default {builds.default_cache_dir()})",
    )
    p.add_argument(
        "chain",
        nargs=argparse.REMAINDER,
        metavar="-- BENCH ARGS [--then BENCH ARGS ...]",
        help="the benches each run performs, in order, on its cluster (no --bootstrap)",
    )


@dataclass(frozen=True)
class Step:
    """One bench of a run: ``name`` prefixes its figures (the bench's own name, numbered
    from the second time it appears), ``argv`` is the bench and its arguments;
    ``cluster``: whether it measures a running cluster (False: an in-process bench such
    as ``purgatory``, run as it is, with no cluster started for it)."""

    name: str
    argv: tuple[str, ...]
    cluster: bool = True
    produced_mb: float | None = None  # what the step produces, when it is a producing bench


def parse_steps(words: Sequence[str]) -> list[Step]:
    """The benches after ``--``, separated by ``--then``."""
    words = list(words[1:] if words[:1] == ["--"] else words)
    segments: list[list[str]] = [[]]
    for word in words:
        if word == THEN:
            segments.append([])
        else:
            segments[-1].append(word)
    steps = []
    seen: Counter[str] = Counter()
    for segment in segments:
        if not segment or segment[0].startswith("-"):
            raise CommandError(
                "name a bench after '--' and after each --then, e.g. "
                "'-- produce --records 200000 --then consume --records 200000'"
            )
        bench = segment[0]
        if bench == "compare":
            raise CommandError("bench compare cannot run itself")
        if any(word.split("=", 1)[0] == "--bootstrap" for word in segment):
            raise CommandError(
                "no --bootstrap: every run starts its own cluster and points each bench at it"
            )
        seen[bench] += 1
        steps.append(Step(bench if seen[bench] == 1 else f"{bench}{seen[bench]}", tuple(segment)))
    return steps


def check_arguments(
    steps: Sequence[Step], bench_parser: Callable[[Sequence[str]], argparse.ArgumentParser]
) -> list[Step]:
    """Parse each bench's arguments with the working tree's ``bench`` parser now, not after
    the baseline was built and a cluster started: a typo should cost nothing. Returns the
    steps, each marked with whether it measures a cluster (a bench without ``--bootstrap``
    does not). (The CLI hands over its function that builds the parser for one bench's
    arguments: it imports this module, so this module cannot import it.)"""
    checked = []
    for step in steps:
        argv = [*step.argv, "--bootstrap", "127.0.0.1:1"]
        parsed, extra = bench_parser(argv).parse_known_args(argv)
        cluster = "--bootstrap" not in extra
        extra = [word for word in extra if word not in argv[-2:]]
        if extra:
            raise CommandError(f"bench {step.argv[0]}: unrecognized arguments: {' '.join(extra)}")
        checked.append(Step(step.name, step.argv, cluster, produced_mb(step.argv[0], parsed)))
    return checked


# The producing benches, by the option holding each record's value size.
_VALUE_SIZE = {"produce": "record_size", "kafka-clients": "size"}


def produced_mb(bench: str, args: argparse.Namespace) -> float | None:
    """Megabytes of values a producing bench sends (a paced second pass counted too), read
    from its arguments so a baseline build that does not report it is measured alike."""
    size = _VALUE_SIZE.get(bench)
    if size is None:
        return None
    passes = 2 if getattr(args, "rate_of_max", 0) else 1
    return args.records * getattr(args, size) * passes / 1e6


def run_order(rounds: int) -> list[str]:
    """Which build runs when: both every round, the first swapped each round."""
    order: list[str] = []
    for r in range(rounds):
        order.extend(SIDES if r % 2 == 0 else reversed(SIDES))
    return order


def flatten_figures(figures: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """Every number in a bench's JSON line, nested names joined with dots (``produce.
    latency_ms_p99``, ``longpoll.expiry_lateness_ms.p99``); booleans, lists and the echoed
    parameters are not figures."""
    out: dict[str, float] = {}
    for key, value in figures.items():
        name = f"{prefix}.{key}"
        if key in NOT_FIGURES or isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            out[name] = float(value)
        elif isinstance(value, Mapping):
            out.update(flatten_figures(value, name))
    return out


def _rounded(value: float) -> float:
    """Three decimals, but never fewer than four significant digits: a small figure (CPU
    seconds per MB, a ratio of 0.025 between a cold run and a warm one) keeps the precision
    its ratio is computed with."""
    return round(value, 3) if abs(value) >= 1 else float(f"{value:.4g}")


def summarize(
    baseline: Sequence[Mapping[str, float]], working: Sequence[Mapping[str, float]]
) -> dict[str, dict[str, Any]]:
    """Per figure: each side's median, working / baseline, and the runs behind them. A
    figure only one build reports keeps its median; its ratio is null."""
    names = dict.fromkeys(name for run in (*baseline, *working) for name in run)
    out = {}
    for name in names:
        runs = {
            "baseline": [run[name] for run in baseline if name in run],
            "working": [run[name] for run in working if name in run],
        }
        medians = {side: statistics.median(v) if v else None for side, v in runs.items()}
        b, w = medians["baseline"], medians["working"]
        out[name] = {
            "baseline": None if b is None else _rounded(b),
            "working": None if w is None else _rounded(w),
            "ratio": _rounded(w / b) if b and w is not None else None,
            "runs": runs,
        }
    return out


def last_json_line(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


# --- one run -------------------------------------------------------------------------


def _environment() -> dict[str, str]:
    """Nothing of the caller's shell reaches a build's imports or a bench's target."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MINIBROKER_BOOTSTRAP")}
    env["PYTHONSAFEPATH"] = "1"  # and -m does not put the working directory on sys.path
    return env


def _cli(build: Build, cwd: Path, args: Sequence[str], timeout: float) -> tuple[int, str]:
    try:
        proc = subprocess.run(
            build.command(*args),
            cwd=cwd,
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise CommandError(
            f"{build.label}: '{' '.join(args[:2])}' took over {timeout:.0f} s"
        ) from None
    if proc.returncode != 0 and last_json_line(proc.stdout) is None:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or ["no output"]
        raise CommandError(
            f"{build.label}: '{' '.join(args[:2])}' exited {proc.returncode}: {lines[-1]}"
        )
    return proc.returncode, proc.stdout


def _broker_processes(data_dir: Path) -> list[psutil.Process]:
    """By the pids ``cluster up`` recorded (every revision's cluster.json has them)."""
    pids = json.loads((data_dir / "cluster.json").read_text()).get("pids", {})
    return [psutil.Process(int(pid)) for pid in pids.values()]


def _cpu_seconds(processes: Sequence[psutil.Process]) -> float:
    try:
        return sum(t.user + t.system for t in (p.cpu_times() for p in processes))
    except psutil.Error as exc:
        raise CommandError(f"a broker of the run's cluster is gone: {exc}") from None


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _bench(
    build: Build,
    cwd: Path,
    step: Step,
    bootstrap: str | None,
    brokers: Sequence[psutil.Process],
    timeout: float,
) -> dict[str, float]:
    """One bench's figures, plus the CPU seconds its brokers (if it has a cluster) and its
    own process spent."""
    broker_cpu, client_cpu = _cpu_seconds(brokers), _children_cpu_seconds()
    target = ["--bootstrap", bootstrap] if step.cluster else []
    _, out = _cli(build, cwd, ["bench", *step.argv, *target], timeout)
    figures = flatten_figures(last_json_line(out) or {}, step.name)
    if step.cluster:
        cpu = _cpu_seconds(brokers) - broker_cpu
        figures[f"{step.name}.broker_cpu_s"] = round(cpu, 3)
        if step.produced_mb:  # everything the brokers did in the step, per MB produced
            figures[f"{step.name}.broker_cpu_s_per_mb"] = round(cpu / step.produced_mb, 4)
    figures[f"{step.name}.client_cpu_s"] = round(_children_cpu_seconds() - client_cpu, 3)
    return figures


def has_kafka_listener(build: Build, timeout: float) -> bool:
    """Whether ``build``'s ``cluster up`` starts Kafka listeners (takes --kafka-base-port):
    builds from before the listener do not know the flag."""
    with tempfile.TemporaryDirectory(prefix="minibroker-compare-") as tmp:
        _, out = _cli(build, Path(tmp), ["cluster", "up", "--help"], timeout)
    return "--kafka-base-port" in out


def run_once(
    build: Build, steps: Sequence[Step], args: argparse.Namespace, kafka_listener: bool
) -> dict[str, float]:
    """Every step against a fresh cluster of ``build``, stopped afterwards whatever happens
    (no cluster when no step measures one)."""
    with tempfile.TemporaryDirectory(prefix="minibroker-compare-") as tmp:
        cwd = Path(tmp)
        if not any(step.cluster for step in steps):
            return _run_steps(build, cwd, steps, {}, [], args.timeout)
        data_dir = cwd / "cluster"
        base_port = free_port_range(args.brokers)
        up = ["cluster", "up", "--detach", "--data-dir", str(data_dir)]
        up += ["--brokers", str(args.brokers), "--base-port", str(base_port)]
        bootstrap = {False: f"127.0.0.1:{base_port}"}
        # Kafka listener ports checked free whether a step uses them or not: left to
        # `cluster up`, they are base + 100, which nothing checked.
        if kafka_listener or any(step.argv[0] in KAFKA_BENCHES for step in steps):
            kafka_base = free_port_range(args.brokers)
            up += ["--kafka-base-port", str(kafka_base)]
            bootstrap[True] = ",".join(f"127.0.0.1:{kafka_base + i}" for i in range(args.brokers))
        brokers: list[psutil.Process] = []
        try:
            _cli(build, cwd, [*up, *(f"--set={s}" for s in args.set)], args.timeout)
            brokers = _broker_processes(data_dir)
            return _run_steps(build, cwd, steps, bootstrap, brokers, args.timeout)
        finally:
            _stop_cluster(build, cwd, data_dir, brokers)


def _run_steps(
    build: Build,
    cwd: Path,
    steps: Sequence[Step],
    bootstrap: Mapping[bool, str],
    brokers: Sequence[psutil.Process],
    timeout: float,
) -> dict[str, float]:
    """Each step in order; ``bootstrap`` by whether the step is a Kafka-client bench."""
    figures: dict[str, float] = {}
    for step in steps:
        target = bootstrap.get(step.argv[0] in KAFKA_BENCHES)
        figures |= _bench(build, cwd, step, target, brokers, timeout)
    return figures


def _stop_cluster(
    build: Build, cwd: Path, data_dir: Path, brokers: Sequence[psutil.Process]
) -> None:
    """``cluster down``; a broker still alive after it (or after its timeout) is killed by
    the pid this run recorded when it started it."""
    if (data_dir / "cluster.json").exists():
        try:
            _cli(build, cwd, ["cluster", "down", "--data-dir", str(data_dir)], 60)
        except CommandError as exc:
            print(f"bench compare: {exc}", file=sys.stderr)
    for process in brokers:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


# --- the command ---------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    steps = parse_steps(args.chain)
    if args.rounds < 1 or args.brokers < 1:
        raise CommandError("--rounds and --brokers must be at least 1")
    steps = check_arguments(steps, args.bench_parser)
    raise_fd_limit()  # inherited by every cluster's brokers: a long-poll bench needs thousands
    repo = builds.source_repo()
    cache_dir = args.cache_dir or builds.default_cache_dir()
    sides = {
        "baseline": builds.revision(repo, args.baseline, cache_dir),
        "working": builds.working_tree(repo, cache_dir),
    }
    if any(step.argv[0] in KAFKA_BENCHES for step in steps):
        for build in sides.values():
            builds.with_stock_clients(build, cache_dir)
    kafka_listener = {
        side: has_kafka_listener(build, args.timeout) for side, build in sides.items()
    }
    load_start = psutil.getloadavg()
    started = time.monotonic()
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for i, side in enumerate(run_order(args.rounds)):
        figures = run_once(sides[side], steps, args, kafka_listener[side])
        runs[side].append(figures)
        progress = {"round": i // 2 + 1, "build": side, "figures": figures}
        print(json.dumps(progress), file=sys.stderr, flush=True)
    result = {
        "benchmark": "compare",
        "bench": f" {THEN} ".join(shlex.join(step.argv) for step in steps),
        "baseline": {"rev": args.baseline, "commit": sides["baseline"].commit},
        "working": {"label": sides["working"].label, "commit": sides["working"].commit},
        "rounds": args.rounds,
        "brokers": args.brokers,
        "ratio_is": "working / baseline (medians)",
        "figures": summarize(runs["baseline"], runs["working"]),
        "load_average": {
            "start": [round(x, 2) for x in load_start],
            "end": [round(x, 2) for x in psutil.getloadavg()],
        },
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result), flush=True)
    return 0
