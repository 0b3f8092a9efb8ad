"""`minibroker bench longpoll`: thousands of connections, each holding a long-poll fetch.

The seeds' scale for the purgatory (operations in flight "with the number of
connections, which for Kafka is often tens of thousands"), measured through the whole
broker: every connection loops a Fetch at the log end (min.bytes 1, max.wait W) for
``--duration`` seconds, so every answer is an expiry; the time past W it arrives is the
expiry lateness. Then, with every fetch parked, one acks=1 produce must wake them all:
the time from the produce request leaving to each fetch's answer is the fan-out wake
latency (the broker answers them as part of the append, before the produce's own ack).

Clients are raw protocol connections (no client-library machinery) spread over
``--client-processes`` processes, so the broker, not the clients, is the bottleneck;
their CPU is reported so that can be checked. Times are CLOCK_MONOTONIC, which is the
same clock in every process of the machine.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import psutil
import trio

from client import Admin, Consumer
from protocol import ApiKey, FrameDecoder, decode_response_envelope, encode_batch, encode_request

from .common import ensure_topic, percentile, report
from .load import (
    ClientProcesses,
    add_broker_under_test_argument,
    broker_under_test,
    cpu_seconds,
    raise_fd_limit,
    shares,
)

CONNECTIONS_PER_PROCESS = 1250
CONNECT_BATCH = 100  # connections opened at once per process


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connections", type=int, default=1000, help="connections (default 1000)")
    p.add_argument(
        "--max-wait-ms", type=int, default=1000, help="each fetch's max.wait.ms (default 1000)"
    )
    p.add_argument(
        "--duration", type=float, default=10, help="seconds of expiring long polls (default 10)"
    )
    p.add_argument(
        "--client-processes",
        type=int,
        default=0,
        help=f"client processes (default: one per {CONNECTIONS_PER_PROCESS} connections, "
        "at least 2)",
    )
    add_broker_under_test_argument(p)
    p.add_argument(
        "--spread",
        action="store_true",
        help="start the connections' first fetches spread over one max-wait window, as a "
        "fleet of unrelated clients would (default: all at the same moment, the worst case)",
    )
    p.add_argument("--topic", default="longpoll", help="topic (one partition; created if missing)")


def run(args: argparse.Namespace) -> int:
    return report(measure, args, lambda figures: figures["errors"] > 0)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.connections < 1 or args.max_wait_ms < 1 or args.duration <= 0:
        raise ValueError("--connections and --max-wait-ms must be >= 1, --duration > 0")
    with broker_under_test(args.bootstrap, "minibroker-longpoll-") as (bootstrap, broker):
        return _measure(args, bootstrap, broker)


def _measure(args: argparse.Namespace, bootstrap: str, broker: psutil.Process | None):
    start_offset = trio.run(_prepare, bootstrap, args.topic)
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    processes = args.client_processes or max(
        2, math.ceil(args.connections / CONNECTIONS_PER_PROCESS)
    )
    confs = [
        (host, int(port), args.topic, start_offset, share, args.max_wait_ms, args.spread)
        for share in shares(args.connections, processes)
    ]
    with ClientProcesses(_child, confs) as clients:
        clients.wait_connected(120)
        wait_s = args.max_wait_ms / 1000
        go = time.monotonic() + 0.5
        produce_at = go + args.duration
        stop = produce_at + wait_s + 1.0
        clients.start((go, produce_at, stop))
        cpu_before = cpu_seconds(broker)
        time.sleep(max(0.0, produce_at - time.monotonic()))
        cpu_after = cpu_seconds(broker)
        rss = broker.memory_info().rss if broker else None
        purgatory = trio.run(_fetch_purgatory, bootstrap)
        produced_at, acked_at = trio.run(_produce_one, bootstrap, args.topic)
        results = clients.results(stop - time.monotonic() + wait_s + 60)
    lateness = sorted(x for r in results for x in r["lateness_ms"])
    # From the produce request's departure: the broker answers the parked fetches as part
    # of the append, so some answers leave before the producer's own ack does.
    wakes = sorted((t - produced_at) * 1000 for r in results for t in r["wakes"])
    answered = sum(r["answered"] for r in results)

    def spread(values: list[float]) -> dict[str, float]:
        return {
            "p50": round(percentile(values, 0.50), 1),
            "p99": round(percentile(values, 0.99), 1),
            "max": round(values[-1], 1) if values else 0.0,
        }

    broker_cpu = None
    if cpu_before is not None:
        broker_cpu = round(100 * (cpu_after - cpu_before) / args.duration, 1)
    return {
        "benchmark": "longpoll",
        "connections": args.connections,
        "max_wait_ms": args.max_wait_ms,
        "duration_s": args.duration,
        "long_polls_answered_per_s": round(answered / args.duration, 1),
        "expiry_lateness_ms": spread(lateness),
        "expiries": len(lateness),
        "fanout_wake_ms": spread(wakes),
        "woken": len(wakes),
        "produce_ack_ms": round((acked_at - produced_at) * 1000, 1),
        "errors": sum(r["errors"] for r in results),
        "first_error": next((r["first_error"] for r in results if r["first_error"]), None),
        "broker_cpu_percent": broker_cpu,
        "broker_rss_mb": round(rss / 2**20, 1) if rss else None,
        "broker_fetch_purgatory": purgatory,
        "spread": args.spread,
        "client_processes": processes,
        "client_cpu_percent": [round(100 * r["cpu_s"] / (r["elapsed_s"] or 1), 1) for r in results],
        "bootstrap": bootstrap if args.bootstrap else "(started by the bench)",
        "load_average": [round(x, 2) for x in psutil.getloadavg()],
    }


async def _prepare(bootstrap: str, topic: str) -> int:
    await ensure_topic(bootstrap, topic, 1, 1)
    async with Consumer(bootstrap) as consumer:
        return (await consumer.end_offsets([(topic, 0)]))[(topic, 0)]


async def _fetch_purgatory(bootstrap: str) -> dict[str, Any]:
    async with Admin(bootstrap) as admin:
        answer = await admin.broker_stats()
    return answer["stats"]["purgatory"]["fetch"]


async def _produce_one(bootstrap: str, topic: str) -> tuple[float, float]:
    """(when one acks=1 produce left, when its ack came), on a connection to the leader
    opened beforehand, so neither connecting nor metadata is in the figure."""
    async with Admin(bootstrap) as admin:
        leader = (await admin.describe_topics([topic]))[topic].partitions[0].leader
        brokers, _ = await admin.describe_cluster()
    address = next(b for b in brokers if b.node_id == leader)
    stream = await trio.open_tcp_stream(address.host, address.port)
    body = {
        "acks": 1,
        "timeout_ms": 5000,
        "topics": [
            {
                "name": topic,
                "partitions": [{"partition": 0, "records": encode_batch([(0, None, b"wake", [])])}],
            }
        ],
    }
    frame = encode_request(ApiKey.PRODUCE, 0, 1, "bench", body)
    decoder = FrameDecoder(1 << 20)
    async with stream:
        sent = time.monotonic()
        await stream.send_all(frame)
        answer = await _one_answer(stream, decoder)
        acked = time.monotonic()
    _, response = decode_response_envelope(answer)
    code = response["topics"][0]["partitions"][0]["error_code"]
    if code:
        raise ValueError(f"the waking produce failed with error code {code}")
    return sent, acked


# --- the client processes ----------------------------------------------------------------


def _child(conf: tuple, pipe: Any) -> None:
    raise_fd_limit()
    trio.run(_child_main, conf, pipe)


async def _child_main(conf: tuple, pipe: Any) -> None:
    host, port, topic, offset, count, wait_ms, spread = conf
    streams: list[trio.SocketStream] = []
    for first in range(0, count, CONNECT_BATCH):
        async with trio.open_nursery() as nursery:
            for _ in range(min(CONNECT_BATCH, count - first)):
                nursery.start_soon(_connect, host, port, streams)
    pipe.send("connected")
    go, produce_at, stop = await trio.to_thread.run_sync(pipe.recv)
    stats: dict[str, Any] = {
        "lateness_ms": [],
        "wakes": [],
        "answered": 0,
        "errors": 0,
        "first_error": None,
    }
    started = time.monotonic()
    cpu = time.process_time()
    with trio.move_on_after(stop - time.monotonic() + wait_ms / 1000 + 5):
        async with trio.open_nursery() as nursery:
            for i, stream in enumerate(streams):
                start = go + (wait_ms / 1000) * i / len(streams) if spread else go
                nursery.start_soon(
                    _poll_loop, stream, topic, offset, wait_ms, (start, produce_at, stop), stats
                )
    stats["cpu_s"] = time.process_time() - cpu
    stats["elapsed_s"] = time.monotonic() - started
    for stream in streams:
        await trio.aclose_forcefully(stream)
    pipe.send(stats)


async def _connect(host: str, port: int, streams: list) -> None:
    streams.append(await trio.open_tcp_stream(host, port))


async def _poll_loop(
    stream: trio.SocketStream,
    topic: str,
    offset: int,
    wait_ms: int,
    times: tuple[float, float, float],
    stats: dict[str, Any],
) -> None:
    go, produce_at, stop = times
    await trio.sleep(max(0.0, go - time.monotonic()))
    decoder = FrameDecoder(1 << 24)
    correlation = 0
    while time.monotonic() < stop:
        body = {
            "max_wait_ms": wait_ms,
            "min_bytes": 1,
            "topics": [{"name": topic, "partitions": [{"partition": 0, "fetch_offset": offset}]}],
        }
        correlation += 1
        sent = time.monotonic()
        try:
            await stream.send_all(encode_request(ApiKey.FETCH, 0, correlation, "bench", body))
            answer = await _one_answer(stream, decoder)
        except (OSError, trio.BrokenResourceError, ConnectionError) as exc:
            _error(stats, f"{type(exc).__name__}: {exc}")
            return
        answered = time.monotonic()
        _, response = decode_response_envelope(answer)
        try:
            part = response["topics"][0]["partitions"][0]
        except (KeyError, IndexError, TypeError):
            _error(stats, f"unexpected answer {str(response)[:200]}")
            return
        if part["error_code"]:
            _error(stats, f"error code {part['error_code']}")
            continue
        if answered <= produce_at:
            stats["answered"] += 1
        if part["records"]:
            stats["wakes"].append(answered)
            offset = part["high_watermark"]
        elif sent >= go and answered <= produce_at:
            stats["lateness_ms"].append((answered - sent) * 1000 - wait_ms)


async def _one_answer(stream: trio.SocketStream, decoder: FrameDecoder) -> bytes:
    """The next response frame (one request is outstanding, so exactly one comes)."""
    frames: list[bytes] = []
    while not frames:
        data = await stream.receive_some(1 << 16)
        if not data:
            raise ConnectionError("the broker closed the connection")
        frames = decoder.feed(data)
    return frames[0]


def _error(stats: dict[str, Any], text: str) -> None:
    stats["errors"] += 1
    if stats["first_error"] is None:
        stats["first_error"] = text
