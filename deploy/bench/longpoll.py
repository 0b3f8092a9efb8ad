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
import select
import socket
import time
from typing import Any

import psutil
import trio

from minibroker.client import Admin, Consumer
from minibroker.deploy.bench.common import ensure_topic, load_average, percentile, report
from minibroker.deploy.bench.load import (
    ClientProcesses,
    add_broker_under_test_argument,
    broker_under_test,
    count_error,
    cpu_seconds,
    raise_fd_limit,
    shares,
)
from minibroker.protocol import (
    ApiKey,
    FrameDecoder,
    decode_response_envelope,
    encode_batch,
    encode_request,
)

CONNECTIONS_PER_PROCESS = 1250


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
    after_first = sorted(x for r in results for x in r["lateness_after_first_ms"])
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
        # Without each connection's first fetch: with every first fetch sent at once, the
        # first round also measures how long the broker takes to read them all.
        "expiry_lateness_after_first_ms": spread(after_first),
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
        "load_average": load_average(),
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
#
# Each process is one epoll loop over its sockets, not a trio task per connection: with a
# task per connection, 1,250 answers arriving together were stamped one by one as each
# task got its turn, after the previous tasks had decoded and sent, so up to ~0.2 s of the
# client's own queueing counted as broker lateness (a woken fetch's answer in the client
# process, measured). Here every answer a poll returns is stamped with that poll's return.


class _Poller:
    """One connection's long-poll loop, driven by the process's epoll loop."""

    __slots__ = ("correlation", "decoder", "offset", "sent", "sock", "start")

    def __init__(self, sock: socket.socket, offset: int, start: float) -> None:
        self.sock = sock
        self.offset = offset
        self.start = start  # when its first fetch goes
        self.sent = 0.0
        self.correlation = 0
        self.decoder = FrameDecoder(1 << 24)


def _child(conf: tuple, pipe: Any) -> None:
    raise_fd_limit()
    host, port, topic, offset, count, wait_ms, spread = conf
    pollers: dict[int, _Poller] = {}
    for _ in range(count):
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        pollers[sock.fileno()] = _Poller(sock, offset, 0.0)
    pipe.send("connected")
    go, produce_at, stop = pipe.recv()
    wait_s = wait_ms / 1000
    for i, poller in enumerate(pollers.values()):
        poller.start = go + wait_s * i / count if spread else go
    stats: dict[str, Any] = {
        "lateness_ms": [],
        "lateness_after_first_ms": [],
        "wakes": [],
        "answered": 0,
        "errors": 0,
        "first_error": None,
        "in_flight": 0,
    }
    started = time.monotonic()
    cpu = time.process_time()
    _poll_loop(pollers, topic, wait_ms, (go, produce_at, stop), stats)
    stats["cpu_s"] = time.process_time() - cpu
    stats["elapsed_s"] = time.monotonic() - started
    for poller in pollers.values():
        poller.sock.close()
    pipe.send(stats)


def _poll_loop(
    pollers: dict[int, _Poller],
    topic: str,
    wait_ms: int,
    times: tuple[float, float, float],
    stats: dict[str, Any],
) -> None:
    go, produce_at, stop = times
    lateness = stats["lateness_ms"]
    after_first = stats["lateness_after_first_ms"]
    wakes = stats["wakes"]
    waiting = sorted(pollers.values(), key=lambda p: p.start, reverse=True)  # first sends
    epoll = select.epoll()
    for fd in pollers:
        epoll.register(fd, select.EPOLLIN)
    now = time.monotonic()
    with epoll:
        while now < stop + wait_ms / 1000 + 5 and (waiting or stats["in_flight"]):
            while waiting and waiting[-1].start <= now:
                if not _send_fetch(waiting.pop(), topic, wait_ms, stats):
                    return
            timeout = max(0.0, waiting[-1].start - now) if waiting else 0.05
            events = epoll.poll(timeout)
            now = time.monotonic()  # every answer this poll returned had arrived by now
            for fd, _ in events:
                poller = pollers[fd]
                try:
                    data = poller.sock.recv(1 << 16)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    count_error(stats, f"{type(exc).__name__}: {exc}")
                    return
                if not data:
                    count_error(stats, "ConnectionError: the broker closed the connection")
                    return
                for frame in poller.decoder.feed(data):
                    sent = poller.sent
                    stats["in_flight"] -= 1
                    _, response = decode_response_envelope(frame)
                    try:
                        part = response["topics"][0]["partitions"][0]
                    except (KeyError, IndexError, TypeError):
                        count_error(stats, f"unexpected answer {str(response)[:200]}")
                        return
                    if part["error_code"]:
                        count_error(stats, f"error code {part['error_code']}")
                    else:
                        if now <= produce_at:
                            stats["answered"] += 1
                        if part["records"]:
                            wakes.append(now)
                            poller.offset = part["high_watermark"]
                        elif sent >= go and now <= produce_at:
                            late = (now - sent) * 1000 - wait_ms
                            lateness.append(late)
                            if poller.correlation > 1:
                                after_first.append(late)
                    if now < stop and not _send_fetch(poller, topic, wait_ms, stats):
                        return


def _send_fetch(poller: _Poller, topic: str, wait_ms: int, stats: dict[str, Any]) -> bool:
    body = {
        "max_wait_ms": wait_ms,
        "min_bytes": 1,
        "topics": [
            {"name": topic, "partitions": [{"partition": 0, "fetch_offset": poller.offset}]}
        ],
    }
    poller.correlation += 1
    frame = encode_request(ApiKey.FETCH, 0, poller.correlation, "bench", body)
    poller.sent = time.monotonic()
    stats["in_flight"] += 1
    try:
        # A request is far smaller than a socket buffer, and one is outstanding at a time.
        if poller.sock.send(frame) != len(frame):
            raise OSError("a fetch request did not fit the socket buffer")
    except OSError as exc:
        count_error(stats, f"{type(exc).__name__}: {exc}")
        return False
    return True


async def _one_answer(stream: trio.SocketStream, decoder: FrameDecoder) -> bytes:
    """The next response frame (one request is outstanding, so exactly one comes)."""
    frames: list[bytes] = []
    while not frames:
        data = await stream.receive_some(1 << 16)
        if not data:
            raise ConnectionError("the broker closed the connection")
        frames = decoder.feed(data)
    return frames[0]
