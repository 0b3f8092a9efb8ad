"""`minibroker bench requests`: plain request rate, pipelined, on a few connections.

Measures the per-request cost of the broker's connection path and dispatch without a
purgatory: ``--api api-versions`` (the cheapest request there is) or ``--api
empty-fetch`` (a Fetch at the log end with max.wait 0, answered at once with no
records). Each of ``--connections`` raw connections keeps ``--pipeline`` requests in
flight for ``--duration`` seconds, from ``--client-processes`` processes; the JSON line
gives requests/s, the broker's CPU % and the clients' (if the clients are near 100 %,
they, not the broker, are the bottleneck).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psutil
import trio

from minibroker.deploy.bench.common import ensure_topic, load_average, report
from minibroker.deploy.bench.load import (
    ClientProcesses,
    add_broker_under_test_argument,
    broker_under_test,
    cpu_seconds,
    shares,
)
from minibroker.protocol import ApiKey, FrameDecoder, encode_request

APIS = ("api-versions", "empty-fetch")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--api",
        choices=APIS,
        default="api-versions",
        help="the request: ApiVersions, or a fetch that finds nothing new",
    )
    p.add_argument("--connections", type=int, default=4, help="connections (default 4)")
    p.add_argument(
        "--pipeline", type=int, default=64, help="requests in flight per connection (default 64)"
    )
    p.add_argument("--duration", type=float, default=5, help="seconds (default 5)")
    p.add_argument("--client-processes", type=int, default=2, help="client processes (default 2)")
    add_broker_under_test_argument(p)
    p.add_argument("--topic", default="requests", help="topic for empty-fetch (one partition)")


def run(args: argparse.Namespace) -> int:
    return report(measure, args)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.connections < 1 or args.pipeline < 1 or args.duration <= 0:
        raise ValueError("--connections and --pipeline must be >= 1, --duration > 0")
    with broker_under_test(args.bootstrap, "minibroker-requests-") as (bootstrap, broker):
        return _measure(args, bootstrap, broker)


def _measure(args: argparse.Namespace, bootstrap: str, broker: psutil.Process | None):
    trio.run(ensure_topic, bootstrap, args.topic, 1, 1)
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    processes = max(1, min(args.client_processes, args.connections))
    confs = [
        (host, int(port), args.topic, args.api, share, args.pipeline)
        for share in shares(args.connections, processes)
    ]
    with ClientProcesses(_child, confs) as clients:
        clients.wait_connected(60)
        go = time.monotonic() + 0.3
        stop = go + args.duration
        clients.start((go, stop))
        time.sleep(max(0.0, go - time.monotonic()))
        before = cpu_seconds(broker)
        time.sleep(max(0.0, stop - time.monotonic()))
        after = cpu_seconds(broker)
        results = clients.results(args.duration + 60)
    answered = sum(r["answered"] for r in results)
    broker_cpu = None
    if before is not None:
        broker_cpu = round(100 * (after - before) / args.duration, 1)
    return {
        "benchmark": "requests",
        "api": args.api,
        "connections": args.connections,
        "pipeline": args.pipeline,
        "duration_s": args.duration,
        "requests_per_s": round(answered / args.duration, 1),
        "errors": sum(r["errors"] for r in results),
        "broker_cpu_percent": broker_cpu,
        "client_processes": processes,
        "client_cpu_percent": [round(100 * r["cpu_s"] / args.duration, 1) for r in results],
        "load_average": load_average(),
    }


def _child(conf: tuple, pipe: Any) -> None:
    trio.run(_child_main, conf, pipe)


async def _child_main(conf: tuple, pipe: Any) -> None:
    host, port, topic, api, count, pipeline = conf
    streams = [await trio.open_tcp_stream(host, port) for _ in range(count)]
    if api == "api-versions":
        key, body = ApiKey.API_VERSIONS, {}
    else:
        key = ApiKey.FETCH
        body = {
            "max_wait_ms": 0,
            "min_bytes": 1,
            "topics": [{"name": topic, "partitions": [{"partition": 0, "fetch_offset": 0}]}],
        }
    frame = encode_request(key, 0, 1, "bench", body)  # one correlation id: never matched
    pipe.send("connected")
    go, stop = await trio.to_thread.run_sync(pipe.recv)
    stats = {"answered": 0, "errors": 0}
    await trio.sleep(max(0.0, go - time.monotonic()))
    cpu = time.process_time()
    with trio.move_on_after(stop - time.monotonic()):
        async with trio.open_nursery() as nursery:
            for stream in streams:
                nursery.start_soon(_pump, stream, frame, pipeline, stats)
    stats["cpu_s"] = time.process_time() - cpu
    pipe.send(stats)


async def _pump(stream: trio.SocketStream, frame: bytes, pipeline: int, stats: dict) -> None:
    """Keep ``pipeline`` requests in flight: send one more for each answer."""
    decoder = FrameDecoder(1 << 24)
    await stream.send_all(frame * pipeline)
    while True:
        data = await stream.receive_some(1 << 18)
        if not data:
            stats["errors"] += 1
            return
        answers = len(decoder.feed(data))
        stats["answered"] += answers
        if answers:
            await stream.send_all(frame * answers)
