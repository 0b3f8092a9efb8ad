"""`minibroker stats`: one broker's own figures (purgatories, partitions), from any shell."""

from __future__ import annotations

import argparse
import json
import os
import sys

import trio

from minibroker.client import Admin
from minibroker.deploy import exit_codes
from minibroker.deploy.client_cli import describe_error
from minibroker.protocol.errors import KafkaError

PURGATORY_FIELDS = ("pending", "watched", "completed", "expired", "purges")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap",
        default=os.environ.get("MINIBROKER_BOOTSTRAP", "127.0.0.1:9092"),
        metavar="HOST:PORT[,HOST:PORT...]",
        help="brokers to start from, each tried in turn (default: $MINIBROKER_BOOTSTRAP)",
    )
    p.add_argument("--broker", type=int, help="broker id (default: the bootstrap broker's answer)")
    p.add_argument("--json", action="store_true", help="the same figures as one JSON object")
    p.set_defaults(func=run)


async def _fetch(args: argparse.Namespace) -> dict:
    async with Admin(args.bootstrap) as admin:
        return await admin.broker_stats(args.broker)


def _ms(bound: float | None) -> str:
    """A histogram bucket bound: the quantile is at most this."""
    if bound is None:
        return "-"
    return "<=" + (f"{bound:g}ms" if bound != float("inf") else "inf")


def _quota_lines(stats: dict) -> list[str]:
    """Client quotas: each entity's bound, rate and throttling (docs/quotas.md)."""
    quotas = stats.get("quotas") or {}
    entities = [
        (k, e)
        for k, v in quotas.items()
        if k not in ("throttler", "replication", "entities")
        for e in v
    ]
    replication = quotas.get("replication") or {}
    if not entities and not replication:
        return []
    throttler = quotas.get("throttler", {})
    lines = [
        "",
        f"quotas  connections throttled {stats.get('connections_throttled', 0)}  "
        f"throttles {throttler.get('throttled', 0)}  unmute late p99 "
        f"{_ms(throttler.get('unmute_lateness', {}).get('p99_ms_le'))}",
        f"{'quota':<20} {'user':<12} {'client-id':<16} {'limit':>12} {'rate':>12} "
        f"{'throttled':>9} {'throttle ms':>11}",
    ]
    for key, count in (quotas.get("entities") or {}).items():
        if count > len(quotas.get(key) or ()):
            lines.append(f"{key}: the {len(quotas[key])} of {count} entities given most throttle")
    for key, e in entities:
        lines.append(
            f"{key:<20} {e['user'] or '-':<12} {e['client_id'] or '-':<16} {e['quota']:>12g} "
            f"{e['rate']:>12g} {e['throttled']:>9} {e['throttle_time_ms_total']:>11}"
        )
    for side, r in replication.items():
        lines.append(
            f"{side}.replication.throttled.rate {r['bound']}  rate {r['rate']:g}  "
            f"waited {r['throttled_ms']} ms"
        )
    return lines


def render(body: dict) -> str:
    stats = body["stats"]
    lines = [
        f"broker {body['broker_id']}  uptime {stats['uptime_ms'] / 1000:.1f}s  "
        f"controller {stats['controller_id']}  connections {stats['connections']}",
        "",
        f"{'purgatory':<10}" + "".join(f"{f:>11}" for f in PURGATORY_FIELDS) + "  late p99",
    ]
    for name, figures in stats["purgatory"].items():
        late = figures.get("expiry_lateness", {}).get("p99_ms_le")
        lines.append(
            f"{name:<10}"
            + "".join(f"{figures[f]:>11}" for f in PURGATORY_FIELDS)
            + f"  {_ms(late)}"
        )
    sessions = stats.get("fetch_sessions")  # the Kafka listener's (KIP-227)
    if sessions:
        lines += [
            "",
            f"kafka fetch sessions {sessions['sessions']}  partitions cached "
            f"{sessions['partitions_cached']}  created {sessions['created']}  "
            f"evicted {sessions['evictions']}",
        ]
    followers = stats.get("replica_fetch_sessions")  # followers' (fetch_sessions.py)
    if followers and followers["sessions"]:
        lines.append(
            f"follower fetch sessions {followers['sessions']}  partitions cached "
            f"{followers['partitions_cached']}  fetches full {followers['full_fetches']}  "
            f"incremental {followers['incremental_fetches']}"
        )
    requests = stats.get("requests") or {}
    if requests:
        lines += [
            "",
            f"{'api':<24} {'requests':>9} {'total p50':>10} {'total p99':>10} "
            f"{'local p99':>10} {'remote p99':>10}",
        ]
        for api, r in requests.items():
            lines.append(
                f"{api:<24} {r['requests']:>9} {_ms(r['total']['p50_ms_le']):>10} "
                f"{_ms(r['total']['p99_ms_le']):>10} {_ms(r['local']['p99_ms_le']):>10} "
                f"{_ms(r['remote']['p99_ms_le']):>10}"
            )
    lines += _quota_lines(stats)
    lines += [
        "",
        f"{'topic-partition':<28} {'leader':>6} {'epoch':>5} {'isr':<12} {'hw':>8} {'leo':>8} "
        f"{'producers':>9}",
    ]
    for p in stats["partitions"]:
        lines.append(
            f"{p['topic'] + '-' + str(p['partition']):<28} {p['leader']:>6} {p['leader_epoch']:>5} "
            f"{','.join(map(str, p['isr'])):<12} {p['high_watermark']:>8} {p['log_end_offset']:>8} "
            f"{p.get('producers', 0):>9}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        body = trio.run(_fetch, args)
    except (KafkaError, ValueError) as exc:
        print(f"error: {describe_error(exc, args)}", file=sys.stderr)
        return exit_codes.of(exc)
    print(json.dumps(body) if args.json else render(body))
    return 0
