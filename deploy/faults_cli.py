"""`minibroker faults delay-replication|drop-replication|delay-api|delay-request|fail-api|isolate|clear`.

Faults act on one broker, which must run with ``faults.enable=true`` (e.g.
``minibroker cluster up --set faults.enable=true``); ``isolate`` (a network partition)
acts on the broker and on every peer it is cut off from, and ``clear`` without
``--broker`` clears every broker.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import trio

from minibroker.client import Admin
from minibroker.deploy import exit_codes, isolation
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, KafkaError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def api_key(value: str) -> int:
    """``produce`` / ``PRODUCE`` / ``0`` -> 0."""
    if value.lstrip("-").isdigit():
        return int(value)
    try:
        return int(ApiKey[value.upper().replace("-", "_")])
    except KeyError:
        names = ", ".join(k.name.lower() for k in ApiKey)
        raise argparse.ArgumentTypeError(f"unknown API {value!r}; one of {names}") from None


def error_code(value: str) -> int:
    if value.lstrip("-").isdigit():
        return int(value)
    try:
        return int(ErrorCode[value.upper()])
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"unknown error code {value!r} (e.g. REQUEST_TIMED_OUT)"
        ) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    ops = p.add_subparsers(dest="fault", required=True, metavar="FAULT")

    def common(
        parser: argparse.ArgumentParser, broker_help: str | None = None
    ) -> argparse.ArgumentParser:
        parser.add_argument(
            "--bootstrap",
            default=os.environ.get("MINIBROKER_BOOTSTRAP", DEFAULT_BOOTSTRAP),
            metavar="HOST:PORT",
            help=f"a broker to start from (default: $MINIBROKER_BOOTSTRAP or {DEFAULT_BOOTSTRAP})",
        )
        parser.add_argument(
            "--broker",
            type=int,
            required=broker_help is None,
            help=broker_help or "id of the broker to act on",
        )
        parser.set_defaults(func=run)
        return parser

    def partition_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--topic", help="only this topic (default: all)")
        parser.add_argument(
            "--partition", type=int, default=-1, help="only this partition (default: all)"
        )

    d = common(ops.add_parser("delay-replication", help="delay this broker's replica fetches"))
    partition_args(d)
    d.add_argument(
        "--delay-ms", type=int, required=True, help="how long each replication fetch waits"
    )
    partition_args(
        common(
            ops.add_parser(
                "drop-replication", help="discard what this broker fetches as a follower"
            )
        )
    )
    a = common(ops.add_parser("delay-api", help="delay this broker's responses of one API"))
    a.add_argument("--api", type=api_key, required=True, help="e.g. produce, fetch, metadata")
    a.add_argument("--delay-ms", type=int, required=True, help="how long each response waits")
    r = common(
        ops.add_parser(
            "delay-request",
            help="hold one API's requests before handling them (the answer reflects the "
            "broker's state when it is handled)",
        )
    )
    r.add_argument("--api", type=api_key, required=True, help="e.g. heartbeat, sync-group")
    r.add_argument(
        "--delay-ms", type=int, required=True, help="how long each request waits to be handled"
    )
    f = common(ops.add_parser("fail-api", help="answer one API with an error code"))
    f.add_argument("--api", type=api_key, required=True, help="e.g. produce, fetch, metadata")
    f.add_argument("--error", type=error_code, required=True, help="e.g. REQUEST_TIMED_OUT")
    f.add_argument(
        "--count", type=int, default=-1, help="for the next N requests (default: until cleared)"
    )
    i = common(
        ops.add_parser(
            "isolate",
            help="drop all traffic between this broker and others (both ways) until cleared",
        )
    )
    i.add_argument(
        "--from",
        dest="peers",
        type=broker_ids,
        help="comma-separated broker ids to cut it off from (default: all others)",
    )
    common(
        ops.add_parser("clear", help="remove every fault (and isolation) from the broker"),
        "the broker to clear, and the others' isolation from it (default: every broker)",
    )


def broker_ids(value: str) -> list[int]:
    """``1,2`` -> [1, 2]."""
    try:
        ids = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected broker ids like 1,2, got {value!r}") from None
    if not ids or any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"expected broker ids like 1,2, got {value!r}")
    return ids


def spec_from(args: argparse.Namespace) -> dict:
    spec: dict = {}
    for name in ("topic", "partition", "delay_ms", "count"):
        value = getattr(args, name, None)
        if value is not None:
            spec[name] = value
    if getattr(args, "api", None) is not None:
        spec["api_key"] = args.api
    if getattr(args, "error", None) is not None:
        spec["error_code"] = args.error
    return spec


async def _apply(
    args: argparse.Namespace,
) -> tuple[dict[int, list[dict]], dict[int, KafkaError]]:
    """(active faults, errors) per broker involved."""
    async with Admin(args.bootstrap) as admin:
        if args.fault == "isolate":
            return await isolation.isolate(admin, args.broker, args.peers), {}
        if args.fault == "clear":
            return await isolation.clear(admin, args.broker)
        return {args.broker: await admin.faults(args.broker, args.fault, **spec_from(args))}, {}


def run(args: argparse.Namespace) -> int:
    try:
        per_broker, errors = trio.run(_apply, args)
    except (KafkaError, isolation.IsolationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.of(exc)  # IsolationError: nonsense broker ids, the user's
    for broker, active in sorted(per_broker.items()):
        print(f"broker {broker}: {len(active)} active fault(s)")
        for fault in active:
            print("  " + json.dumps(fault))
    for broker, error in sorted(errors.items()):
        print(f"error: broker {broker} was not cleared: {error}", file=sys.stderr)
    return exit_codes.CLUSTER_ERROR if errors else exit_codes.OK
