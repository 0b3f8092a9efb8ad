"""`minibroker bench validate`: what the leader's record walk costs, per batch and record.

Builds one v2 batch of ``--batch-bytes`` of ``--record-bytes`` records (keyless, as
librdkafka's bench sends them) in each codec and runs, ``--iterations`` times each:
the batch's CRC-32C check (what a produce cost before every record was walked: the
reference), wrapping it as the broker stores it (``wrap_kafka_batch``) and checking the
stored batch as a follower's append and recovery do (``check_batch``), then
``record_stream.walk_records`` (LogValidator's walk; for compressed
batches it includes decompressing in the fixed window), then ``iter_records`` (the
log cleaner's reader, building each record).

Ends with one JSON line: per codec, microseconds per batch and records per second.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from minibroker.deploy.bench.common import report
from minibroker.protocol.batch import check_batch, wrap_kafka_batch
from minibroker.protocol.kafka import record_stream
from minibroker.protocol.kafka import records as kafka_records


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-bytes", type=int, default=16384, help="batch size (16384)")
    p.add_argument("--record-bytes", type=int, default=100, help="value bytes (100)")
    p.add_argument("--iterations", type=int, default=2000, help="walks of each batch (2000)")
    p.add_argument(
        "--python", action="store_true", help="the Python loop even where the C one is built"
    )


def run(args: argparse.Namespace) -> int:
    return report(measure, args)


def _time(fn: Callable[[], Any], iterations: int) -> float:
    """Best of three runs: seconds per call (the machine is shared; the best is the cost)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        best = min(best, (time.perf_counter() - start) / iterations)
    return best


def measure(args: argparse.Namespace) -> dict:
    if args.python:
        record_stream._scan = None  # this process only: the fallback's cost
    count = max(1, args.batch_bytes // (args.record_bytes + 10))
    now = int(time.time() * 1000)
    rows = [(now + i // 20, None, b"v" * args.record_bytes, []) for i in range(count)]
    out: dict[str, Any] = {
        "records_per_batch": count,
        "iterations": args.iterations,
        # The walk's hot loop: the C extension, or the Python loop where it is not built.
        "walk": "python" if record_stream._scan is None else "c",
    }
    for codec, name in kafka_records.CODEC_NAMES.items():
        batch = kafka_records.encode_batch(rows, compression=codec)
        crc = _time(lambda b=batch: kafka_records.check_batch(b, 0, len(b)), args.iterations)
        header = kafka_records.check_batch(batch, 0, len(batch))
        wrap = _time(lambda b=batch, h=header: wrap_kafka_batch(b, 0, h), args.iterations)
        stored = wrap_kafka_batch(batch, 0, header)
        stored_check = _time(lambda b=stored: check_batch(b, 0, len(b)), args.iterations)
        walk = _time(
            lambda b=batch: record_stream.walk_records(b, now_ms=now, after_max_ms=3_600_000),
            args.iterations,
        )
        read = _time(
            lambda b=batch: sum(1 for _ in record_stream.iter_records(b)),
            max(1, args.iterations // 4),
        )
        out[name] = {
            "batch_bytes": len(batch),
            "crc_us": round(crc * 1e6, 1),
            "wrap_us": round(wrap * 1e6, 1),
            "stored_check_us": round(stored_check * 1e6, 1),
            "walk_us": round(walk * 1e6, 1),
            "walk_records_per_s": round(count / walk),
            "walk_ns_per_record": round(walk * 1e9 / count),
            "iter_records_per_s": round(count / read),
        }
    return out
