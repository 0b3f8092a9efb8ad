"""`minibroker bench quotas`: the throttle timer under many throttled connections, and how
close Kafka's rate algorithm holds a client to its quota.

Timer part (in-process, no sockets): ``--connections`` sessions are throttled at once for
random times of ``--min-ms``..``--max-ms`` on the broker's own SystemTimer and
ChannelThrottler, each throttled again the moment its throttle ends, for
``--duration`` seconds, in one trio loop as the broker runs them. Reported: throttles
ended, the unmute lateness (from a throttle's end to its unmute running on the loop) p50
and p99, and the CPU share of the timer thread and of the loop thread (psutil's
per-thread times). It measures the timer path the broker uses; the network side of a
mute (one epoll modification each way) is not in it.

Socket part (``--sockets N``, quotas_sockets.py): N real connections throttled by a
broker process, end to end.

Rate part (the manual clock, no I/O): a client sending flat out and waiting out every
throttle, for quotas of 1 KB/s to 100 MB/s with requests of a 20th of a window's worth,
through ClientQuotaManager with the broker's window settings; reported: the rate
achieved from 11 s to 71 s (after the first burst, see docs/quotas.md) against the quota.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from typing import Any

import psutil
import trio

from minibroker.broker.network.session import ConnectionSession
from minibroker.broker.purgatory import SystemTimer
from minibroker.broker.quota import (
    PRODUCER_BYTE_RATE,
    ChannelThrottler,
    ClientQuotaManager,
    QuotaConfigs,
    QuotaEntity,
)
from minibroker.deploy.bench import quotas_sockets
from minibroker.deploy.bench.common import report
from minibroker.deploy.bench.load import add_broker_under_test_argument

RATES = (1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connections", type=int, default=10_000, help="throttled at once (10000)")
    p.add_argument("--duration", type=float, default=10, help="seconds of throttling (10)")
    p.add_argument("--min-ms", type=int, default=50, help="shortest throttle (50)")
    p.add_argument("--max-ms", type=int, default=1000, help="longest throttle (1000)")
    p.add_argument("--windows", type=int, default=11, help="quota.window.num (11)")
    quotas_sockets.add_arguments(p)
    add_broker_under_test_argument(p)


def run(args: argparse.Namespace) -> int:
    return report(measure, args)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.connections < 1 or args.duration <= 0 or not 1 <= args.min_ms <= args.max_ms:
        raise ValueError("--connections >= 1, --duration > 0 and 1 <= --min-ms <= --max-ms")
    figures = {"timer": trio.run(_timer, args), "rates": _rates(args.windows)}
    if args.sockets > 0:
        figures["sockets"] = quotas_sockets.measure(args)
    return figures


def _thread_cpu(thread_id: int) -> float:
    for t in psutil.Process().threads():
        if t.id == thread_id:
            return t.user_time + t.system_time
    return 0.0


async def _timer(args: argparse.Namespace) -> dict[str, Any]:
    timer = SystemTimer(name="bench-quotas")
    throttler = ChannelThrottler(timer)
    token = trio.lowlevel.current_trio_token()
    throttler.set_expiry_handoff(lambda batch: token.run_sync_soon(throttler.expire_batch, batch))
    rng = random.Random(1)
    ended = 0
    running = True

    def session() -> ConnectionSession:
        s = ConnectionSession("bench")

        def hook(start: bool) -> None:
            nonlocal ended
            if not start:
                ended += 1
                if running:  # throttled again at once: always --connections throttled
                    throttler.throttle(s, rng.randint(args.min_ms, args.max_ms))

        s.throttle_hook = hook
        return s

    timer.start()
    try:
        loop_thread = threading.get_native_id()
        timer_thread = timer._thread.native_id
        sessions = [session() for _ in range(args.connections)]
        for s in sessions:
            throttler.throttle(s, rng.randint(args.min_ms, args.max_ms))
        wall0, timer0, loop0 = time.monotonic(), _thread_cpu(timer_thread), _thread_cpu(loop_thread)
        await trio.sleep(args.duration)
        wall = time.monotonic() - wall0
        timer_cpu = _thread_cpu(timer_thread) - timer0
        loop_cpu = _thread_cpu(loop_thread) - loop0
        running = False
    finally:
        timer.shutdown()
    lateness = throttler.unmute_lateness.summary()
    return {
        "connections": args.connections,
        "throttles_ended": ended,
        "throttles_per_s": round(ended / wall),
        "unmute_lateness_p50_ms_le": lateness.get("p50_ms_le"),
        "unmute_lateness_p99_ms_le": lateness.get("p99_ms_le"),
        "timer_thread_cpu_share": round(timer_cpu / wall, 4),
        "loop_thread_cpu_share": round(loop_cpu / wall, 4),
    }


def _rates(windows: int) -> list[dict[str, Any]]:
    out = []
    for quota in RATES:
        configs = QuotaConfigs()
        configs.set(QuotaEntity.of({"client-id": "c"}), PRODUCER_BYTE_RATE, quota)
        manager = ClientQuotaManager(PRODUCER_BYTE_RATE, configs, windows, 1000)
        request = max(1, quota // 20)
        now, sent = 0, 0
        while now < 71_000:
            throttle = manager.record("ANONYMOUS", "c", request, now)
            if now >= 11_000:
                sent += request
            now += max(throttle, 1)
        achieved = sent / 60
        out.append(
            {"quota": quota, "achieved": round(achieved), "ratio": round(achieved / quota, 3)}
        )
    return out
