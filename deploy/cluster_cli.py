"""`minibroker cluster up|status|pause|resume|kill|restart|down`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from minibroker.deploy.cluster import (
    DEFAULT_BASE_PORT,
    DEFAULT_DATA_DIR,
    KAFKA_PORT_OFFSET,
    LOCAL_CLUSTER_CONFIG,
    ClusterError,
    ClusterState,
    data_dir_holders,
)
from minibroker.deploy.cluster_ops import (
    active_controller,
    first_acks_all_write,
    gather_status,
    render_status,
    run_demo,
)
from minibroker.deploy.forkserver import fork_server
from minibroker.protocol.errors import KafkaError


def add_arguments(p: argparse.ArgumentParser) -> None:
    ops = p.add_subparsers(dest="op", required=True, metavar="OP")

    def common(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser.add_argument(
            "--data-dir",
            type=Path,
            default=DEFAULT_DATA_DIR,
            help=f"cluster directory (default ./{DEFAULT_DATA_DIR})",
        )
        return parser

    up = common(
        ops.add_parser("up", help="start N brokers on 127.0.0.1 and wait for an acks=all write")
    )
    up.add_argument("--brokers", type=int, default=3, help="how many brokers to run")
    up.add_argument(
        "--base-port",
        type=int,
        default=DEFAULT_BASE_PORT,
        help="broker N's native listener is on this port + N (keep it below 32768)",
    )
    up.add_argument(
        "--kafka-base-port",
        type=int,
        default=None,
        help=f"first Kafka-protocol listener port, for stock Kafka clients (default: base port "
        f"+ {KAFKA_PORT_OFFSET}; 0: off)",
    )
    up.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="broker setting passed to every broker (repeatable); without one, "
        "leader.imbalance.check.interval.seconds is 5 (Kafka: 300)",
    )
    up.add_argument("--detach", action="store_true", help="leave the brokers running and return")
    up.add_argument("--fresh", action="store_true", help="delete the data dir first")
    up.add_argument(
        "--demo",
        action="store_true",
        help="then create a 'demo' topic, produce and consume a few records, print the status",
    )
    up.set_defaults(func=cmd_up)

    status = common(ops.add_parser("status", help="brokers (pid, state, RSS, CPU) and partitions"))
    status.add_argument("--json", action="store_true", help="the same figures as one JSON object")
    status.set_defaults(func=cmd_status)

    for name, doc in (
        ("pause", "SIGSTOP a broker"),
        ("resume", "SIGCONT a broker"),
        ("kill", "SIGKILL a broker"),
        ("restart", "start a broker again (data kept)"),
    ):
        op = common(ops.add_parser(name, help=doc))
        op.add_argument("id", type=int, help="the broker's id (0 .. brokers-1)")
        op.set_defaults(func=cmd_control)
    common(ops.add_parser("down", help="stop every broker cleanly")).set_defaults(func=cmd_down)


def typed(path: Path) -> str:
    """A data dir as the user can type it here: relative when it is under the current
    directory, else absolute (quickstart.sh passes the repository's own, absolute)."""
    absolute = path.absolute()
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def _fail(exc: Exception) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return 2


def cmd_up(args: argparse.Namespace) -> int:
    from minibroker.broker.common.config import ConfigError, load_config, parse_set_options

    # The warm parent boots (imports the broker) while we check the settings and the
    # data dir; counted in the cold start, which runs from here.
    t0 = time.monotonic()
    # From here a SIGTERM is an interrupt like Ctrl-C: brokers started are stopped, not
    # left running by this process ending at once (the exit code says which: 130, 143).
    interrupted_by = interrupt_on_sigterm()
    fork_server()

    try:
        sets = parse_set_options(args.set)
        load_config(None, sets)  # fail here, once, rather than in N broker logs
    except ConfigError as exc:
        return _fail(exc)
    if args.brokers < 1:
        return _fail(ValueError("--brokers must be at least 1"))
    data_dir: Path = args.data_dir
    try:
        existing = ClusterState.load(data_dir)
    except ClusterError:
        existing = None
    if existing is not None and any(existing.process(i) for i in range(existing.brokers)):
        return _fail(
            ClusterError(
                f"a cluster is already running in {typed(data_dir)}{dead_brokers_hint(existing)}; "
                f"'minibroker cluster down --data-dir {typed(data_dir)}' to stop it"
            )
        )
    holders = data_dir_holders(data_dir)
    if holders:
        # Whoever they are (this cluster.json may not list them): --fresh would delete the
        # data under running brokers, and a broker started there would not get its lock.
        return _fail(ClusterError(in_use_message(data_dir, holders, args.fresh)))
    kafka_base = args.kafka_base_port
    if kafka_base is None:
        kafka_base = args.base_port + KAFKA_PORT_OFFSET
    state = ClusterState(
        data_dir,
        args.base_port,
        args.brokers,
        {**LOCAL_CLUSTER_CONFIG, **sets},
        kafka_base_port=kafka_base,
    )
    try:
        state.check_ports(list(range(state.brokers)))  # before --fresh deletes anything
    except ClusterError as exc:
        return _fail(exc)
    if args.fresh and data_dir.exists():
        shutil.rmtree(data_dir)
    previous = _read(state.path)
    t0 = time.monotonic()
    try:
        state.start_all()
        first_acks_all_write(state)
    except (ClusterError, OSError, KeyboardInterrupt) as exc:
        # Nothing left behind that says a cluster is here: its brokers are stopped and
        # cluster.json is what it was (the brokers' logs stay, for the reason).
        state.stop_all()
        _restore(state.path, previous)
        if isinstance(exc, KeyboardInterrupt):
            return 128 + interrupted_by[0]
        return _fail(exc)
    cold_ms = (time.monotonic() - t0) * 1000
    noun = "broker" if state.brokers == 1 else "brokers"
    print(
        f"cluster up: {state.brokers} {noun}, bootstrap {state.bootstrap}, data in {typed(data_dir)}"
    )
    if state.kafka_bootstrap:
        print(f"Kafka clients: bootstrap.servers={state.kafka_bootstrap}")
    print(auto_create_line(state.config))
    # The figure depends on the machine's load far more than on minibroker: show both.
    print(
        f"cold start (start to first acks=all write acknowledged): {cold_ms:.0f} ms "
        f"({machine_load()})"
    )
    print(
        f"try: export MINIBROKER_BOOTSTRAP={state.bootstrap}; "
        f"minibroker cluster status --data-dir {typed(data_dir)}"
    )
    sys.stdout.flush()
    if args.demo:
        try:
            for line in run_demo(state):
                print("  " + line)
        except KafkaError as exc:
            print(f"demo failed: {exc}", file=sys.stderr)
        print()
        print(render_status(gather_status(state)))
        print()
        sys.stdout.flush()
    if args.detach:
        return 0
    return supervise(state, interrupted_by)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _restore(path: Path, body: bytes | None) -> None:
    if body is None:
        path.unlink(missing_ok=True)
    else:
        path.write_bytes(body)


def in_use_message(data_dir: Path, holders: dict[Path, int], fresh: bool) -> str:
    """``data dir X is in use: its lock is held by pid 12 (broker-0), ...``: one line."""
    names = ", ".join(
        f"{f'pid {pid}' if pid else 'a process'} ({d.name if d != data_dir else typed(d)})"
        for d, pid in holders.items()
    )
    what = (
        "--fresh would delete the data under them" if fresh else "a broker started there would fail"
    )
    return (
        f"data dir {typed(data_dir)} is in use: locks held by {names}; {what}; stop them "
        f"first ('minibroker cluster down --data-dir {typed(data_dir)}' stops this cluster's)"
    )


def auto_create_line(config: dict[str, str]) -> str:
    """The one setting that changes what a client sees for a topic nobody created: a
    stream framework may wait silently on it when off, a typo creates a topic when on."""
    from minibroker.broker.common.config import load_config

    on = load_config(None, config)["auto.create.topics.enable"]
    if on:
        return (
            "topics: auto.create.topics.enable=true (created on first produce or metadata request)"
        )
    return (
        "topics: auto.create.topics.enable=false (Kafka: true): create topics first "
        "('minibroker topics create'), or --set auto.create.topics.enable=true"
    )


def machine_load() -> str:
    """``load average 1.52 on 2 CPUs``: what a cold-start time should be read against."""
    try:
        one_minute = os.getloadavg()[0]
    except OSError:
        return "load average unknown"
    return f"load average {one_minute:.2f} on {os.cpu_count() or 1} CPUs"


def dead_brokers_hint(state: ClusterState) -> str:
    """``, but broker 0 is dead ('minibroker cluster restart 0 ...' brings it back)``, or ''."""
    down = {i: st for i in range(state.brokers) if (st := state.status_of(i)) in _NOT_RUNNING}
    if not down:
        return ""
    if len(down) == 1:
        [(i, st)] = down.items()
        return (
            f", but broker {i} is {st} ('minibroker cluster restart {i} "
            f"--data-dir {typed(state.data_dir)}' brings it back)"
        )
    return (
        f", but brokers {', '.join(f'{i} ({st})' for i, st in down.items())} are not running "
        f"('minibroker cluster restart N --data-dir {typed(state.data_dir)}' brings broker N back)"
    )


_NOT_RUNNING = ("stopped", "dead")


def interrupt_on_sigterm() -> list[signal.Signals]:
    """Make SIGTERM raise KeyboardInterrupt as SIGINT does; the returned list's one item
    says which of the two came (SIGINT until a SIGTERM does)."""
    came = [signal.SIGINT]

    def on_sigterm(*_: object) -> None:
        came[0] = signal.SIGTERM
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    return came


def supervise(state: ClusterState, interrupted_by: list[signal.Signals]) -> int:
    """Foreground: report brokers that stop or die; Ctrl-C (or SIGTERM) stops them all
    cleanly, and the exit code says which (130, 143) unless one would not stop (2)."""
    reported: set[int] = set()
    try:
        print("supervising; Ctrl-C stops the cluster", flush=True)
        while True:
            time.sleep(0.5)
            fresh = ClusterState.load(state.data_dir)  # other shells may restart brokers
            for i in range(fresh.brokers):
                status = fresh.status_of(i)
                if status in _NOT_RUNNING and i not in reported:
                    print(
                        f"broker {i} is not running ({status}; restart: minibroker cluster "
                        f"restart {i} --data-dir {typed(state.data_dir)})",
                        flush=True,
                    )
                    reported.add(i)
                elif status not in _NOT_RUNNING:
                    reported.discard(i)
    except KeyboardInterrupt:
        print("stopping brokers...", flush=True)
        code = cmd_down(argparse.Namespace(data_dir=state.data_dir))
        return code or 128 + interrupted_by[0]


def cmd_status(args: argparse.Namespace) -> int:
    try:
        state = ClusterState.load(args.data_dir)
    except ClusterError as exc:
        return _fail(exc)
    status = gather_status(state)
    if args.json:
        print(json.dumps(status))
    else:
        print(render_status(status))
        running = any(x["state"] not in _NOT_RUNNING for x in status["brokers"])
        for b in status["brokers"]:
            if b["state"] in _NOT_RUNNING and running:
                print(
                    f"broker {b['id']} is {b['state']}: 'minibroker cluster restart {b['id']} "
                    f"--data-dir {typed(args.data_dir)}' brings it back"
                )
    return 0


def cmd_control(args: argparse.Namespace) -> int:
    try:
        state = ClusterState.load(args.data_dir)
        state.check_id(args.id)
        if args.op == "pause":
            state.signal(args.id, signal.SIGSTOP)
        elif args.op == "resume":
            state.signal(args.id, signal.SIGCONT)
        elif args.op == "kill":
            state.kill(args.id)
        else:
            state.restart(args.id)
        state.save()
    except ClusterError as exc:
        return _fail(exc)
    print(f"broker {args.id}: {args.op} done ({state.status_of(args.id)})")
    return 0


# What each outcome of ClusterState.stop_all is called in `cluster down`'s report.
_DOWN_OUTCOMES = {
    "stopped": "stopped cleanly",
    "exited": "exited, but not cleanly: see its broker.log",
    "killed": "killed: no clean shutdown within 15 s",
    "running": "STILL RUNNING after SIGKILL",
}


def cmd_down(args: argparse.Namespace) -> int:
    """Stop every broker, wait for each to exit and say how each went; exit 2 if any is
    still running (its pid stays in cluster.json, so status and down still find it)."""
    try:
        state = ClusterState.load(args.data_dir)
    except ClusterError as exc:
        return _fail(exc)
    outcomes = state.stop_all(active_controller(state))
    state.remember_running()
    state.save()
    left = []
    for i, outcome in outcomes.items():
        if outcome == "not running":
            text = f"was not running ({state.status_of(i)})"
        else:
            text = _DOWN_OUTCOMES[outcome]
        proc = state.process(i)
        if proc is not None:
            left.append(i)
            if outcome != "running":
                text += f"; now running again as pid {proc.pid}"
        print(f"broker {i}: {text}")
    holders = {
        d: pid
        for d, pid in data_dir_holders(state.root).items()
        if d not in {state.broker_dir(i) for i in left}
    }
    if left or holders:
        named = [f"broker {i} (pid {state.pids[i]})" for i in left]
        named += [f"pid {pid or '?'} holding {d}" for d, pid in holders.items()]
        print(
            f"error: cluster in {typed(args.data_dir)} is not stopped: {', '.join(named)} "
            "still running",
            file=sys.stderr,
        )
        return 2
    print(f"cluster in {typed(args.data_dir)} stopped (data kept)")
    return 0
