"""`minibroker`: the one command (broker, cluster, topics, produce, consume, bench, ...).

Every failure a user can cause ends as one line on stderr that says what to do and a
non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

# Every command is imported by name: a module that fails to import stops the CLI with
# its traceback instead of quietly vanishing from --help.
from minibroker.deploy import (
    broker_cli,
    chaos_cli,
    client_cli,
    cluster_cli,
    faults_cli,
    groups_cli,
    leaders_cli,
    stats_cli,
)
from minibroker.deploy.bench import (
    compare,
    consume,
    failover,
    groups,
    kafka_clients,
    longpoll,
    produce,
    purgatory,
    requests,
    spark_read,
    startup,
)
from minibroker.deploy.broker_cli import CommandError
from minibroker.deploy.pipes import run_piped

# Each adds its subcommands with add_subcommands(sub).
COMMAND_GROUPS: Sequence[ModuleType] = (
    client_cli,
    groups_cli,
    leaders_cli,
    cluster_cli,
    faults_cli,
    chaos_cli,
    stats_cli,
)

# name -> (module with add_arguments(parser) and run(args), help line)
BENCHMARKS: dict[str, tuple[ModuleType, str]] = {
    "purgatory": (purgatory, "the seed's purgatory experiment (wheel vs heap vs trio tasks)"),
    "produce": (produce, "producer throughput and ack latency against a running broker"),
    "consume": (consume, "consumer throughput against a running broker"),
    "failover": (failover, "kill -9 the active controller: time until a topic can be created"),
    "longpoll": (longpoll, "thousands of connections each holding a long-poll fetch"),
    "groups": (groups, "consumer groups: rebalance after a leave; 10k members' heartbeats"),
    "requests": (requests, "plain request rate, pipelined (ApiVersions or an empty fetch)"),
    "kafka-clients": (
        kafka_clients,
        "confluent-kafka, kafka-python or aiokafka through the Kafka listener (or librdkafka's mock)",
    ),
    "spark-read": (spark_read, "records/s read into a Spark DataFrame and written back"),
    "compare": (compare, "the working tree against a git revision: medians and ratios"),
    "startup": (startup, "cluster cold start, its phases, and the pytest fixture's setup/teardown"),
}


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks; each prints one JSON line of figures")
    benches = p.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    p.set_defaults(bench_parser=p)  # bench compare checks the benches it is to run with it
    for name, (module, doc) in BENCHMARKS.items():
        bp = benches.add_parser(name, help=doc)
        module.add_arguments(bp)
        bp.set_defaults(func=module.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minibroker", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    broker_cli.add_arguments(sub.add_parser("broker", help="run one broker in the foreground"))
    for module in COMMAND_GROUPS:
        module.add_subcommands(sub)
    _add_bench(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_piped(lambda: _run(argv))


def _run(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args) or 0
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
