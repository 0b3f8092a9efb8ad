"""`minibroker bench produce`: producer throughput and per-record ack latency.

Like Kafka's producer-perf-test: N records of a fixed size as fast as possible (or
at ``--throughput`` records/s); latency is send-to-ack per record. Ends with one
JSON line of figures and the parameters that produced them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from array import array
from collections import deque
from typing import Any

import trio

from minibroker.client import Producer
from minibroker.client.config import parse_properties
from minibroker.deploy.bench.common import (
    add_connection_arguments,
    bootstrap_of,
    ensure_topic,
    percentile,
    report,
)
from minibroker.protocol.errors import KafkaError

# Large batches make a Python producer fast; a small buffer keeps the backlog (and so the
# latency at full speed) short and the memory flat. --property overrides these.
BENCH_DEFAULTS = {"batch.size": 262144, "linger.ms": 5, "buffer.memory": 2097152}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--records", type=int, default=1_000_000, help="records to send (default 1000000)"
    )
    p.add_argument(
        "--record-size", type=int, default=100, help="value bytes per record (default 100)"
    )
    p.add_argument("--acks", default="1", choices=["all", "-1", "0", "1"], help="acks (default 1)")
    p.add_argument(
        "--throughput",
        type=float,
        default=-1,
        help="target records/s; -1 for as fast as possible (default)",
    )
    p.add_argument("--topic", default="bench", help="topic; created with --partitions if missing")
    p.add_argument(
        "--partitions", type=int, default=1, help="partitions when creating the topic (default 1)"
    )
    p.add_argument(
        "--replication-factor",
        type=int,
        default=-1,
        help="replication factor when creating the topic (default: the broker's)",
    )
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="topic setting when creating it, e.g. min.insync.replicas=2 (repeatable)",
    )
    p.add_argument(
        "--send-nowait",
        type=int,
        default=0,
        metavar="N",
        help="the README's batch path: send_nowait N records, then await each handle, "
        "and again (0, the default: await enqueue per record, collecting acks as they come)",
    )
    add_connection_arguments(p, "producer", BENCH_DEFAULTS)


# The throttle sleeps only once it is this far ahead of schedule: a trio sleep per record
# would cost more than the send itself and distort the very latency being measured.
MIN_SLEEP_S = 0.002


async def produce(args: argparse.Namespace) -> dict[str, Any]:
    if args.send_nowait and args.throughput > 0:
        raise ValueError("--send-nowait sends as fast as it can: drop --throughput")
    settings = {**BENCH_DEFAULTS, "acks": args.acks, **parse_properties(args.property)}
    bootstrap = bootstrap_of(args)
    await ensure_topic(
        bootstrap,
        args.topic,
        args.partitions,
        args.replication_factor,
        parse_properties(args.config, "--config"),
    )
    value = os.urandom(args.record_size)
    latencies = array("d")
    failures = 0
    pending: deque = deque()

    def collect(all_done: bool) -> None:
        nonlocal failures
        while pending and (all_done or pending[0][1].done()):
            sent_at, handle = pending.popleft()
            if handle.exception() is not None:
                failures += 1
            else:
                latencies.append(handle.acked_at - sent_at)

    async with Producer(bootstrap, settings) as producer:
        idempotence = producer.config["enable.idempotence"]
        start = time.monotonic()
        if args.send_nowait:
            failures = await _send_nowait_chunks(producer, args, value, latencies)
        else:
            interval = 1.0 / args.throughput if args.throughput > 0 else 0.0
            monotonic = time.monotonic
            enqueue = producer.enqueue
            topic = args.topic
            for i in range(args.records):
                if interval:
                    ahead = start + i * interval - monotonic()
                    if ahead > MIN_SLEEP_S:
                        await trio.sleep(ahead)
                pending.append((monotonic(), await enqueue(topic, value)))
                if not i & 0x3FF:
                    collect(False)
        await producer.flush()
        elapsed = time.monotonic() - start
        collect(True)
    ordered = sorted(latencies)
    return {
        "benchmark": "produce",
        "records": args.records,
        "failed": failures,
        "elapsed_s": round(elapsed, 3),
        "records_per_sec": round(args.records / elapsed, 1),
        "mb_per_sec": round(args.records * args.record_size / elapsed / 1e6, 2),
        "latency_ms_p50": round(percentile(ordered, 0.50) * 1000, 2),
        "latency_ms_p99": round(percentile(ordered, 0.99) * 1000, 2),
        "latency_ms_max": round((ordered[-1] if ordered else 0.0) * 1000, 2),
        "params": {
            "record_size": args.record_size,
            "acks": args.acks,
            "enable_idempotence": idempotence,
            "throughput": args.throughput,
            "send_nowait": args.send_nowait,
            "partitions": args.partitions,
            "replication_factor": args.replication_factor,
            "topic_config": args.config,
            "topic": args.topic,
            "bootstrap": bootstrap,
            "settings": settings,
        },
    }


async def _send_nowait_chunks(
    producer: Producer, args: argparse.Namespace, value: bytes, latencies: array
) -> int:
    """What a user writes from the README: ``handles = [producer.send_nowait(...) for ...]``
    then ``[await h for h in handles]``, chunk after chunk; returns the failures."""
    failures = 0
    send_nowait = producer.send_nowait
    topic = args.topic
    monotonic = time.monotonic
    left = args.records
    while left:
        n = min(left, args.send_nowait)
        left -= n
        sent_at = monotonic()
        handles = [send_nowait(topic, value) for _ in range(n)]
        for handle in handles:
            try:
                await handle
            except KafkaError:
                failures += 1
            else:
                latencies.append(handle.acked_at - sent_at)
    return failures


def run(args: argparse.Namespace) -> int:
    return report(lambda a: trio.run(produce, a), args, lambda figures: figures["failed"] > 0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="minibroker bench produce")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
