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
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import trio

from protocol import ApiKey, FrameDecoder, encode_request

from ..cluster import ClusterState
from ..launcher import free_port_range
from .common import ensure_topic, report

APIS = ("api-versions", "empty-fetch")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api", choices=APIS, default="api-versions")
    p.add_argument("--connections", type=int, default=4, help="connections (default 4)")
    p.add_argument(
        "--pipeline", type=int, default=64, help="requests in flight per connection (default 64)"
    )
    p.add_argument("--duration", type=float, default=5, help="seconds (default 5)")
    p.add_argument("--client-processes", type=int, default=2, help="client processes (default 2)")
    p.add_argument(
        "--bootstrap",
        default=None,
        metavar="HOST:PORT",
        help="a running broker to measure (default: start one in a temporary directory)",
    )
    p.add_argument("--topic", default="requests", help="topic for empty-fetch (one partition)")


def run(args: argparse.Namespace) -> int:
    return report(measure, args)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.connections < 1 or args.pipeline < 1 or args.duration <= 0:
        raise ValueError("--connections and --pipeline must be >= 1, --duration > 0")
    if args.bootstrap:
        return _measure(args, args.bootstrap, None)
    with tempfile.TemporaryDirectory(prefix="minibroker-requests-") as tmp:
        state = ClusterState(Path(tmp), free_port_range(1), 1, {})
        state.start_all()
        try:
            return _measure(args, state.bootstrap, state.process(0))
        finally:
            state.stop_all()


def _measure(args: argparse.Namespace, bootstrap: str, broker: psutil.Process | None):
    trio.run(ensure_topic, bootstrap, args.topic, 1, 1)
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    processes = max(1, min(args.client_processes, args.connections))
    ctx = multiprocessing.get_context("spawn")
    children = []
    for i in range(processes):
        share = args.connections // processes + (i < args.connections % processes)
        parent_end, child_end = ctx.Pipe()
        conf = (host, int(port), args.topic, args.api, share, args.pipeline)
        proc = ctx.Process(target=_child, args=(conf, child_end), daemon=True)
        proc.start()
        children.append((proc, parent_end))
    try:
        for _, pipe in children:
            if not pipe.poll(60):
                raise ValueError("a client process did not connect within 60 s")
            pipe.recv()
        go = time.monotonic() + 0.3
        stop = go + args.duration
        for _, pipe in children:
            pipe.send((go, stop))
        time.sleep(max(0.0, go - time.monotonic()))
        before = broker.cpu_times() if broker else None
        time.sleep(max(0.0, stop - time.monotonic()))
        after = broker.cpu_times() if broker else None
        results = []
        for proc, pipe in children:
            if not pipe.poll(args.duration + 60):
                raise ValueError("a client process did not report")
            results.append(pipe.recv())
            proc.join(10)
    finally:
        for proc, _ in children:
            if proc.is_alive():
                proc.kill()
    answered = sum(r["answered"] for r in results)
    broker_cpu = None
    if before is not None:
        used = (after.user + after.system) - (before.user + before.system)
        broker_cpu = round(100 * used / args.duration, 1)
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
        "load_average": [round(x, 2) for x in psutil.getloadavg()],
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
