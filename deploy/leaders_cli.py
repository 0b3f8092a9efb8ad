"""`minibroker leaders elect`: Kafka's kafka-leader-election on the command line.

``--election-type preferred`` moves leadership back to each partition's preferred replica
(the first of its replica list) when it is alive and in the ISR; the active controller
also does this by itself (auto.leader.rebalance.enable). ``unclean`` elects a leader for
partitions that have none.
"""

from __future__ import annotations

import argparse
import sys

from minibroker.client import Admin
from minibroker.deploy import exit_codes
from minibroker.deploy.client_cli import CliError, _cmd, _common, _settings
from minibroker.protocol.errors import ElectionNotNeeded


def add_arguments(leaders: argparse.ArgumentParser) -> None:
    """`minibroker leaders elect` (the `leaders` parser is made by deploy/cli.py)."""
    lsub = leaders.add_subparsers(dest="leaders_command", required=True, metavar="ACTION")
    elect = lsub.add_parser(
        "elect", help="move leadership to the preferred replica (like kafka-leader-election)"
    )
    elect.add_argument(
        "--election-type",
        choices=["preferred", "unclean"],
        default="preferred",
        help="preferred: the first replica, if alive and in the ISR (default); "
        "unclean: a leader for partitions that have none",
    )
    which = elect.add_mutually_exclusive_group()
    which.add_argument("--topic", help="only this topic (default: every partition)")
    which.add_argument(
        "--all-topic-partitions",
        action="store_true",
        help="every partition of every topic (the default; kafka-leader-election's flag)",
    )
    elect.add_argument("--partition", type=int, help="only this partition of --topic")
    _common(elect)
    elect.set_defaults(func=_cmd(_elect))


async def _elect(args: argparse.Namespace) -> int:
    if args.partition is not None and args.topic is None:
        raise CliError("--partition needs --topic")
    async with Admin(config=_settings(args)) as admin:
        partitions = None
        if args.topic is not None:
            if args.partition is not None:
                numbers = [args.partition]
            else:
                desc = await admin.describe_topics([args.topic])
                numbers = [p.partition for p in desc[args.topic].partitions]
            partitions = [(args.topic, p) for p in numbers]
        outcome = await admin.elect_leaders(args.election_type, partitions)
    kind = args.election_type.upper()
    elected = [tp for tp, error in outcome.items() if error is None]
    already = [tp for tp, error in outcome.items() if isinstance(error, ElectionNotNeeded)]
    failed = {tp: e for tp, e in outcome.items() if e is not None and tp not in already}
    if elected:
        print(f"Successfully completed leader election ({kind}) for partitions {_names(elected)}")
    if already:
        print(f"Valid replica already elected for partitions {_names(already)}")
    if not outcome:
        print(f"No partition needed a {args.election_type} leader election")
    for (topic, partition), error in failed.items():
        print(
            f"Error completing leader election ({kind}) for partition {topic}-{partition}: {error}",
            file=sys.stderr,
        )
    if failed:
        print(f"error: {len(failed)} replica(s) could not be elected", file=sys.stderr)
        # A partition that does not exist is the command's mistake (1); one whose
        # preferred replica is down or out of the ISR is the cluster's state (2).
        return min(exit_codes.of(e) for e in failed.values())
    return 0


def _names(partitions: list[tuple[str, int]]) -> str:
    return ", ".join(f"{t}-{p}" for t, p in sorted(partitions))
