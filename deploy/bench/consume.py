"""`minibroker bench consume`: consumer throughput over records already in a topic.

Like Kafka's consumer-perf-test: read ``--records`` from the beginning of every
partition as fast as possible. Latency is per poll() call (the wait a caller sees).
Ends with one JSON line. Fill the topic first with `minibroker bench produce`.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import trio

from minibroker.client import Consumer
from minibroker.client.config import parse_properties
from minibroker.deploy.bench.common import (
    add_connection_arguments,
    bootstrap_of,
    percentile,
    report,
)

BENCH_DEFAULTS: dict[
    str, object
] = {}  # Kafka's defaults (500 records per poll, 1 MiB per partition) do well


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--records", type=int, default=1_000_000, help="records to read (default 1000000)"
    )
    p.add_argument("--topic", default="bench", help="topic to read (default bench)")
    add_connection_arguments(p, "consumer", BENCH_DEFAULTS)
    p.add_argument(
        "--timeout-ms", type=int, default=10000, help="give up after this long without records"
    )


async def consume(args: argparse.Namespace) -> dict[str, Any]:
    settings = {**BENCH_DEFAULTS, **parse_properties(args.property)}
    bootstrap = bootstrap_of(args)
    async with Consumer(bootstrap, settings) as consumer:
        count = await consumer.partitions_for(args.topic)
        if count is None:
            raise ValueError(
                f"topic '{args.topic}' does not exist: fill it with 'minibroker bench produce'"
            )
        parts = [(args.topic, p) for p in range(count)]
        ends = await consumer.end_offsets(parts)
        starts = await consumer.beginning_offsets(parts)
        available = sum(ends[tp] - starts[tp] for tp in ends)
        if available < args.records:
            raise ValueError(
                f"topic '{args.topic}' holds {available} records, fewer than --records {args.records}: "
                f"run 'minibroker bench produce --topic {args.topic} --records {args.records}' first"
            )
        consumer.assign(parts)
        consumer.seek_to_beginning()
        polls: list[float] = []
        seen = nbytes = 0
        start = time.monotonic()
        while seen < args.records:
            t = time.monotonic()
            records = await consumer.poll(
                timeout_ms=args.timeout_ms, max_records=args.records - seen
            )
            polls.append(time.monotonic() - t)
            if not records:
                raise ValueError(f"no records for {args.timeout_ms} ms after {seen} records")
            seen += len(records)
            nbytes += sum(len(r.value or b"") for r in records)
        elapsed = time.monotonic() - start
    ordered = sorted(polls)
    return {
        "benchmark": "consume",
        "records": seen,
        "elapsed_s": round(elapsed, 3),
        "records_per_sec": round(seen / elapsed, 1),
        "mb_per_sec": round(nbytes / elapsed / 1e6, 2),
        "latency_ms_p50": round(percentile(ordered, 0.50) * 1000, 2),
        "latency_ms_p99": round(percentile(ordered, 0.99) * 1000, 2),
        "latency_ms_max": round(ordered[-1] * 1000, 2),
        "latency_is": "per poll() call",
        "params": {"topic": args.topic, "bootstrap": bootstrap, "settings": settings},
    }


def run(args: argparse.Namespace) -> int:
    return report(lambda a: trio.run(consume, a), args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="minibroker bench consume")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
