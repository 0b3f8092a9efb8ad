"""`minibroker bench cleaner`: what a log cleaner pass costs the broker's trio loop.

Builds a compacted log (``--records`` records over ``--keys`` keys, 50 to a batch, all in
sealed segments) and cleans it, alternating two ways per round: the broker's way
(``LogCleanerManager``: the work in a worker thread, the loop only plans and renames)
and the same pass run on the loop (``cleaner.clean_now``), the baseline the worker
thread is there to beat. Throughout, a task sleeps 1 ms at a time and records how late
it wakes: the loop's stall. The switch interval is the broker's (one timer tick).

``--bomb-mb N`` puts a compression bomb first in the log: a stock client's zstd batch of
one record (key ``key-0``, overwritten later) whose value is N MiB of zeros, a few KB on
disk (issue 34). The cleaner streams it with its values skipped and copies it as it is.

Ends with one JSON line: per way, medians over the rounds of the pass time, the
lateness p99 and max, the process's resident size growth during the pass, and the log's
size before and after.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import trio
import zstandard
from crc32c import crc32c

from minibroker.broker.purgatory.system_timer import switch_interval_for
from minibroker.broker.storage import Log, LogConfig, cleaner
from minibroker.broker.storage.cleaner_manager import LogCleanerManager
from minibroker.deploy.bench.common import percentile, report
from minibroker.protocol import encode_batch
from minibroker.protocol.batch import wrap_kafka_batch
from minibroker.protocol.kafka import records as kafka_records
from minibroker.protocol.kafka.messages import write_varint


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records", type=int, default=200_000, help="records written (200000)")
    p.add_argument("--keys", type=int, default=5000, help="distinct keys (5000)")
    p.add_argument("--value-bytes", type=int, default=200, help="bytes per value (200)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each way (3)")
    p.add_argument(
        "--bomb-mb", type=int, default=0, help="MiB of zeros in a zstd bomb batch first (0: none)"
    )


def run(args: argparse.Namespace) -> int:
    return report(measure, args)


class _Quiet:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def _build(path: Path, args: argparse.Namespace) -> Log:
    config = LogConfig(segment_bytes=8 << 20, cleanup_policy="compact")
    log = Log.open(path, config, logger=_Quiet())
    if args.bomb_mb:
        log.append_as_leader(_bomb(args.bomb_mb << 20), 1)
    value = b"x" * args.value_bytes
    rows = []
    for i in range(args.records):
        rows.append((1000, b"key-%d" % (i % args.keys), value, ()))
        if len(rows) == 50:
            log.append_as_leader(encode_batch(rows), 1)
            rows = []
    if rows:
        log.append_as_leader(encode_batch(rows), 1)
    log.roll()
    return log


def _bomb(zeros: int) -> bytearray:
    """One zstd v2 record batch: key ``key-0``, a value of ``zeros`` zero bytes."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    head = bytearray(b"\x00\x00\x00\x0akey-0")  # attributes, deltas, key length 5, key
    write_varint(head, zeros)
    rec = bytearray()
    write_varint(rec, len(head) + zeros + 1)
    parts = [compressor.compress(bytes(rec + head))]
    block = bytes(min(zeros, 64 << 20))
    left = zeros
    while left:
        parts.append(compressor.compress(block[: min(left, len(block))]))
        left -= min(left, len(block))
    parts += [compressor.compress(b"\x00"), compressor.flush()]  # no headers
    raw = kafka_records.encode_batch([(1000, b"key-0", b"", ())], compression=kafka_records.ZSTD)
    header = kafka_records.unpack_header(raw)
    body = b"".join(parts)
    raw = bytearray(raw[: kafka_records.HEADER_SIZE] + body)
    struct.pack_into(">i", raw, 8, len(raw) - kafka_records.LOG_OVERHEAD)
    crc = crc32c(memoryview(raw)[kafka_records.CRC_START :])
    struct.pack_into(">I", raw, kafka_records.CRC_AT, crc)
    return wrap_kafka_batch(raw, 0, header._replace(batch_length=len(raw) - 12))


async def _one(way: str, args: argparse.Namespace) -> dict[str, float]:
    directory = Path(tempfile.mkdtemp(prefix="bench-cleaner-"))
    try:
        log = _build(directory / "p", args)
        before = log.size_bytes
        late: list[float] = []
        done = trio.Event()
        process = psutil.Process()
        rss_before = rss_peak = process.memory_info().rss

        async def watch() -> None:
            nonlocal rss_peak
            while not done.is_set():
                start = time.perf_counter()
                await trio.sleep(0.001)
                late.append((time.perf_counter() - start) * 1000 - 1)
                rss_peak = max(rss_peak, process.memory_info().rss)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await trio.sleep(0.02)
            start = time.perf_counter()
            if way == "worker_thread":
                manager = LogCleanerManager(lambda: [(log, log.log_end_offset)], 60_000, _Quiet())
                await manager.clean_filthiest()
            else:
                plan = cleaner.plan(log, log.log_end_offset, log.now_ms())
                assert plan is not None
                cleaner.clean_now(plan)
            took = time.perf_counter() - start
            done.set()
        late.sort()
        after = log.size_bytes
        log.close()
        return {
            "pass_s": took,
            "lateness_p99_ms": percentile(late, 0.99),
            "lateness_max_ms": late[-1] if late else 0.0,
            "rss_grown_mb": (rss_peak - rss_before) / 2**20,
            "mb_before": before / 1e6,
            "mb_after": after / 1e6,
        }
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    sys.setswitchinterval(switch_interval_for(1))
    runs: dict[str, list[dict[str, float]]] = {"worker_thread": [], "on_loop": []}
    for _ in range(args.rounds):
        for way, results in runs.items():
            results.append(trio.run(_one, way, args))
    return {
        "bench": "cleaner",
        "records": args.records,
        "keys": args.keys,
        "bomb_mb": args.bomb_mb,
        **{
            way: {key: round(statistics.median(r[key] for r in results), 3) for key in results[0]}
            for way, results in runs.items()
        },
    }
