"""`minibroker bench quotas --sockets N`: N throttled connections to a real broker process.

The in-process part (quotas.py) measures the throttle timer alone. Here a broker is
throttling connections over TCP as it does in production (KIP-219): every connection is
its own client id under a ``<default>`` client ``producer_byte_rate`` quota small enough
that each of its produces is throttled, and it sends its next produce the moment an
answer arrives, as a client that ignores throttle_time_ms would. The broker answers at
once, mutes the connection for throttle_time_ms and reads it again when the shared
timer ends the throttle; the next answer's arrival past that end is what a throttled
client sees of the timer: the *answer lateness* (unmute lateness plus one produce's
read, append and answer, end to end).

Also reported, from the broker's stats: its own unmute lateness histogram, how many
connections were throttled at once (sampled mid-run), and the CPU share of the timer
thread (the thread's own clock) and of the whole broker process over the measured time.
Clients are raw protocol connections in epoll loops in their own processes (as
``bench longpoll``'s), so the broker is what is measured; their CPU is reported.
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

from minibroker.client import Admin
from minibroker.deploy.bench.common import ensure_topic, percentile
from minibroker.deploy.bench.load import (
    ClientProcesses,
    broker_under_test,
    count_error,
    cpu_seconds,
    raise_fd_limit,
    shares,
)
from minibroker.protocol import ApiKey, FrameDecoder, decode_response_envelope, encode_batch
from minibroker.protocol.codec import encode_request

CONNECTIONS_PER_PROCESS = 1250
TOPIC = "bench-quotas"
PRODUCE_VERSION = 1  # the first version whose answer carries throttle_time_ms


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sockets",
        type=int,
        default=0,
        help="also throttle this many real connections to a broker process (e.g. 10000; "
        "default 0: the in-process parts only)",
    )
    p.add_argument(
        "--socket-quota",
        type=int,
        default=128,
        help="the <default> client producer_byte_rate, bytes/s, each connection its own "
        "client id (default 128: a 256 B record is throttled about 2 s)",
    )
    p.add_argument("--record-bytes", type=int, default=256, help="each produce's value (256)")
    p.add_argument("--warmup", type=float, default=15, help="seconds before figures count (15)")
    p.add_argument(
        "--spread-s",
        type=float,
        default=2.0,
        help="the connections' first produces spread over this many seconds, as a fleet of "
        "unrelated clients (default 2; 0: all at once, whose equal throttles then end "
        "together and measure a burst's queue, not the timer)",
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    config = {"quota.window.num": "11", "quota.window.size.seconds": "1"}
    with broker_under_test(args.bootstrap, "minibroker-quotas-", config) as (bootstrap, broker):
        return _measure(args, bootstrap, broker)


def _measure(args: argparse.Namespace, bootstrap: str, broker: psutil.Process | None):
    trio.run(_prepare, bootstrap, args.socket_quota)
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    processes = max(2, math.ceil(args.sockets / CONNECTIONS_PER_PROCESS))
    confs = [
        (host, int(port), index, share, args.record_bytes, args.spread_s)
        for index, share in enumerate(shares(args.sockets, processes))
    ]
    with ClientProcesses(_child, confs) as clients:
        clients.wait_connected(120)
        go = time.monotonic() + 0.5
        count_from = go + args.warmup
        stop = count_from + args.duration
        clients.start((go, count_from, stop))
        time.sleep(max(0.0, count_from - time.monotonic()))
        before = trio.run(_stats, bootstrap)
        cpu_before = cpu_seconds(broker)
        time.sleep(max(0.0, count_from + args.duration / 2 - time.monotonic()))
        middle = trio.run(_stats, bootstrap)
        time.sleep(max(0.0, stop - time.monotonic()))
        after = trio.run(_stats, bootstrap)
        cpu_after = cpu_seconds(broker)
        results = clients.results(120)
    lateness = sorted(x for r in results for x in r["lateness_ms"])
    throttles = sorted(x for r in results for x in r["throttle_ms"])
    answered = sum(r["answered"] for r in results)
    timer_cpu = after["timer"]["thread_cpu_s"] - before["timer"]["thread_cpu_s"]
    return {
        "connections": args.sockets,
        "client_processes": processes,
        "quota_bytes_per_s": args.socket_quota,
        "record_bytes": args.record_bytes,
        "seconds": args.duration,
        "answers": answered,
        "answers_per_s": round(answered / args.duration),
        "throttled_at_once": middle["connections_throttled"],
        "throttle_ms_p50": round(percentile(throttles, 0.50)),
        "answer_lateness_ms": {
            "p50": round(percentile(lateness, 0.50), 1),
            "p99": round(percentile(lateness, 0.99), 1),
            "max": round(lateness[-1], 1) if lateness else 0.0,
        },
        "broker_unmute_lateness": after["quotas"]["throttler"]["unmute_lateness"],
        "timer_thread_cpu_share": round(timer_cpu / args.duration, 4),
        "broker_cpu_share": None
        if cpu_before is None
        else round((cpu_after - cpu_before) / args.duration, 3),
        "errors": sum(r["errors"] for r in results),
        "first_error": next((r["first_error"] for r in results if r["first_error"]), None),
        "client_cpu_share_max": round(max(r["cpu_s"] / r["elapsed_s"] for r in results), 3),
    }


async def _prepare(bootstrap: str, quota: int) -> None:
    await ensure_topic(bootstrap, TOPIC, 1, 1)
    async with Admin(bootstrap) as admin:
        await admin.alter_client_quotas({"client-id": None}, {"producer_byte_rate": quota})


# The stats are read mid-run on a new connection, which waits its turn behind every
# throttled connection ready at that moment; on a loaded machine that took over the
# client's 2 s ApiVersions bound and failed the whole run. The stats are not the figure.
_STATS_CONFIG = {"api.version.request.timeout.ms": 30_000}


async def _stats(bootstrap: str) -> dict[str, Any]:
    async with Admin(bootstrap, **_STATS_CONFIG) as admin:
        return (await admin.broker_stats())["stats"]


# --- the client processes: one epoll loop over their sockets (see bench longpoll) ----------


class _Link:
    __slots__ = ("decoder", "frame", "ready_at", "sock")

    def __init__(self, sock: socket.socket, frame: bytes) -> None:
        self.sock = sock
        self.frame = frame  # one produce, encoded once: the broker reads each anew
        self.decoder = FrameDecoder(1 << 20)
        self.ready_at = 0.0  # when the last answer's throttle ends (0: none given)


def _child(conf: tuple, pipe: Any) -> None:
    raise_fd_limit()
    host, port, index, count, record_bytes, spread_s = conf
    records = encode_batch([(0, None, b"q" * record_bytes, [])])
    links: dict[int, _Link] = {}
    for i in range(count):
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        body = {
            "acks": 1,
            "timeout_ms": 30_000,
            "topics": [{"name": TOPIC, "partitions": [{"partition": 0, "records": records}]}],
        }
        frame = encode_request(ApiKey.PRODUCE, PRODUCE_VERSION, 1, f"q{index}-{i}", body)
        links[sock.fileno()] = _Link(sock, frame)
    pipe.send("connected")
    go, count_from, stop = pipe.recv()
    stats: dict[str, Any] = {
        "lateness_ms": [],
        "throttle_ms": [],
        "answered": 0,
        "errors": 0,
        "first_error": None,
    }
    started, cpu = time.monotonic(), time.process_time()
    starts = [go + spread_s * i / count for i in range(count)]
    _loop(links, starts, count_from, stop, stats)
    stats["cpu_s"] = time.process_time() - cpu
    stats["elapsed_s"] = time.monotonic() - started
    for link in links.values():
        link.sock.close()
    pipe.send(stats)


def _loop(
    links: dict[int, _Link], starts: list[float], count_from: float, stop: float, stats: dict
) -> None:
    lateness, throttles = stats["lateness_ms"], stats["throttle_ms"]
    waiting = list(zip(reversed(starts), reversed(list(links.values())), strict=True))
    epoll = select.epoll()
    with epoll:
        for fd in links:
            epoll.register(fd, select.EPOLLIN)
        now = time.monotonic()
        while now < stop:
            while waiting and waiting[-1][0] <= now:  # first produces, in start order
                if not _send(waiting.pop()[1], stats):
                    return None
            timeout = min(0.05, max(0.0, waiting[-1][0] - now)) if waiting else 0.05
            events = epoll.poll(timeout)
            now = time.monotonic()  # every answer this poll returned had arrived by now
            for fd, _ in events:
                link = links[fd]
                try:
                    data = link.sock.recv(1 << 16)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    return count_error(stats, f"{type(exc).__name__}: {exc}")
                if not data:
                    return count_error(stats, "ConnectionError: the broker closed the connection")
                for frame in link.decoder.feed(data):
                    _, answer = decode_response_envelope(frame)
                    code = answer["topics"][0]["partitions"][0]["error_code"]
                    if code:
                        count_error(stats, f"produce answered error code {code}")
                    counted = count_from <= now < stop
                    if counted:
                        stats["answered"] += 1
                        if link.ready_at:
                            lateness.append(max(0.0, (now - link.ready_at) * 1000))
                    throttle_ms = answer.get("throttle_time_ms", 0)
                    if counted and throttle_ms:
                        throttles.append(throttle_ms)
                    link.ready_at = now + throttle_ms / 1000 if throttle_ms else 0.0
                    if now < stop and not _send(link, stats):
                        return None
    return None


def _send(link: _Link, stats: dict) -> bool:
    try:
        # A produce of a few hundred bytes fits the socket buffer; one is outstanding.
        if link.sock.send(link.frame) != len(link.frame):
            raise OSError("a produce request did not fit the socket buffer")
    except OSError as exc:
        count_error(stats, f"{type(exc).__name__}: {exc}")
        return False
    return True
