"""`minibroker`: the one command (broker, cluster, topics, produce, consume, bench, ...).

Every failure a user can cause ends as one line on stderr that says what to do and a
non-zero exit, never a traceback.

Commands are registered by module name and only the one being run is imported: a
`minibroker topics list` must not pay for the chaos runner, the broker's coordinator or
Spark (importing every command module cost ~0.37 s of CPU per command, and a bigger
heap that every full garbage collection of a consuming process walks again).
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from minibroker.deploy import exit_codes, interrupt
from minibroker.deploy.broker_cli import CommandError
from minibroker.deploy.pipes import run_piped

# command -> (module, its function that adds the command's arguments, help line). The
# module is imported only when the command is run or its own --help asked for; a module
# that fails to import then fails with its traceback, and --help, which lists this table,
# cannot lose a command (tests/unit/test_cli_registry.py imports every entry).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "broker": ("minibroker.deploy.broker_cli", "add_arguments", "run one broker in the foreground"),
    "topics": (
        "minibroker.deploy.client_cli",
        "add_topics_arguments",
        "create, delete, list, describe and alter topics",
    ),
    "produce": (
        "minibroker.deploy.client_cli",
        "add_produce_arguments",
        "send stdin lines as records, one per line",
    ),
    "consume": (
        "minibroker.deploy.client_cli",
        "add_consume_arguments",
        "print records, one value per line",
    ),
    "groups": (
        "minibroker.deploy.groups_cli",
        "add_arguments",
        "list, describe, delete consumer groups",
    ),
    "transactions": (
        "minibroker.deploy.transactions_cli",
        "add_arguments",
        "list and describe transactions (kafka-transactions.sh)",
    ),
    "configs": (
        "minibroker.deploy.configs_cli",
        "add_arguments",
        "describe and alter topic and broker configs and client quotas (kafka-configs.sh)",
    ),
    "leaders": (
        "minibroker.deploy.leaders_cli",
        "add_arguments",
        "elect partition leaders (preferred, unclean)",
    ),
    "cluster": (
        "minibroker.deploy.cluster_cli",
        "add_arguments",
        "run and control a local multi-process cluster",
    ),
    "faults": (
        "minibroker.deploy.faults_cli",
        "add_arguments",
        "inject faults into a broker started with faults.enable=true",
    ),
    "chaos": (
        "minibroker.deploy.chaos_cli",
        "add_arguments",
        "acks=all producers and a consumer under a seeded nemesis; check Kafka's promises",
    ),
    "stats": (
        "minibroker.deploy.stats_cli",
        "add_arguments",
        "a broker's purgatory metrics and partition states",
    ),
}

# bench name -> (module with add_arguments(parser) and run(args), help line); loaded as above.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "purgatory": (
        "minibroker.deploy.bench.purgatory",
        "the seed's purgatory experiment (wheel vs heap vs trio tasks)",
    ),
    "produce": (
        "minibroker.deploy.bench.produce",
        "producer throughput and ack latency against a running broker",
    ),
    "consume": ("minibroker.deploy.bench.consume", "consumer throughput against a running broker"),
    "failover": (
        "minibroker.deploy.bench.failover",
        "kill -9 the active controller: time until a topic can be created",
    ),
    "longpoll": (
        "minibroker.deploy.bench.longpoll",
        "thousands of connections each holding a long-poll fetch",
    ),
    "groups": (
        "minibroker.deploy.bench.groups",
        "consumer groups: rebalance after a leave; 10k members' heartbeats",
    ),
    "requests": (
        "minibroker.deploy.bench.requests",
        "plain request rate, pipelined (ApiVersions or an empty fetch)",
    ),
    "spark-read": (
        "minibroker.deploy.bench.spark_read",
        "records/s read into a Spark DataFrame and written back",
    ),
    "compare": (
        "minibroker.deploy.bench.compare",
        "the working tree against a git revision: medians and ratios",
    ),
    "kafka-clients": (
        "minibroker.deploy.bench.kafka_clients",
        "confluent-kafka, kafka-python or aiokafka through the Kafka listener (or librdkafka's mock)",
    ),
    "cleaner": (
        "minibroker.deploy.bench.cleaner",
        "a log cleaner pass: its time and the broker loop's stall, worker thread vs on the loop",
    ),
    "validate": (
        "minibroker.deploy.bench.validate",
        "the leader's per-record validation of a produced batch, per codec, against its CRC",
    ),
    "quotas": (
        "minibroker.deploy.bench.quotas",
        "10k throttled connections on the shared timer; Kafka's rate held to the quota",
    ),
    "transactions": (
        "minibroker.deploy.bench.transactions",
        "exactly-once with confluent-kafka: transactional vs idempotent, read_committed, commits",
    ),
    "startup": (
        "minibroker.deploy.bench.startup",
        "cluster cold start, its phases, and the pytest fixture's setup/teardown",
    ),
}


class DefaultsFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the help already names it (in
    words, as "default: $MINIBROKER_BOOTSTRAP or ..." does) or there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in (None, False, [], argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


class RootFormatter(argparse.RawDescriptionHelpFormatter, DefaultsFormatter):
    """The top-level help: its epilog (the exit statuses) is a table, kept as written."""


class Parser(argparse.ArgumentParser):
    """Shows defaults; ``add_subparsers`` builds every command's parser with this class,
    so the commands' own modules need not ask for it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)


def _first_word(argv: Sequence[str]) -> str | None:
    """The subcommand a parser with no options of its own (only -h) will pick."""
    return next((word for word in argv if not word.startswith("-")), None)


def add_benchmarks(p: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """The benchmarks as subcommands of ``p``; only the one ``argv`` names is loaded."""
    benches = p.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    chosen = _first_word(argv)
    for name, (module, doc) in BENCHMARKS.items():
        bp = benches.add_parser(name, help=doc)
        if name == chosen:
            loaded = importlib.import_module(module)
            loaded.add_arguments(bp)
            bp.set_defaults(func=loaded.run)


def bench_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """A `minibroker bench` parser for one bench's arguments (bench compare checks the
    benches it is to run with it before it builds or starts anything)."""
    p = Parser(prog="minibroker bench")
    add_benchmarks(p, argv)
    return p


def installed_version() -> str:
    """The installed distribution's version (pyproject.toml's, via its metadata): what
    `pip show minibroker` says, so a bug report names the code that ran."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("minibroker")
    except PackageNotFoundError:  # run from a checkout that was never pip-installed
        return "(not installed: run 'pip install -e .')"


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser for ``argv``: every command listed, the one ``argv`` names loaded."""
    parser = Parser(
        prog="minibroker",
        description=__doc__.splitlines()[0],
        epilog=exit_codes.epilog(),
        formatter_class=RootFormatter,
    )
    parser.add_argument("--version", action="version", version=f"minibroker {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = _first_word(argv)
    for name, (module, adder, doc) in COMMANDS.items():
        p = sub.add_parser(name, help=doc)
        if name == chosen:
            getattr(importlib.import_module(module), adder)(p)
    bench = sub.add_parser("bench", help="benchmarks; each prints one JSON line of figures")
    if chosen == "bench":
        add_benchmarks(bench, argv[argv.index("bench") + 1 :])
        bench.set_defaults(bench_parser=bench_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    interrupt.note_signals()
    try:
        return run_piped(lambda: _run(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # Ctrl-C in a command that runs with Python's own handler
        return interrupt.exit_status(signal.SIGINT)
    finally:
        interrupt.ignore_late_signals()


def _run(argv: Sequence[str]) -> int:
    args = build_parser(argv).parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    if not interrupt.handles(func):
        interrupt.default_signals()  # from here a signal interrupts it as Python's would
        if (status := interrupt.noted_status()) is not None:
            return status  # one came while it was starting: never started
    try:
        return func(args) or 0
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.CLUSTER_ERROR


if __name__ == "__main__":
    sys.exit(main())
