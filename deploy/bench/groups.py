"""`minibroker bench groups`: the two consumer-group targets of issue 28, one JSON line.

1. Rebalance of a ``--members`` group (real broker process, real consumers) after one
   member leaves: from the LeaveGroup to every survivor holding its new partitions, and
   the part of it after the slowest survivor began to rejoin (target: <= 100 ms).
2. ``--heartbeat-members`` members in ``--heartbeat-groups`` groups heartbeating every
   ``--heartbeat-interval-ms`` into one coordinator: the broker's own coordinator,
   purgatories and timer thread, on the real clock, driven in-process (no sockets: this
   measures the purgatory and coordinator, not the network). A tenth of the members then
   stop; how late each is expired (its last heartbeat + session timeout to the coordinator
   removing it: p50/p99/max), the Heartbeat purgatory's own lateness histogram, and the
   process's CPU over the steady phase are reported (targets: p99 <= 20 ms, <= 5 % of a
   core).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import structlog
import trio

from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.coordinator import OFFSETS_TOPIC, CoordinatorService
from minibroker.broker.metadata.image import PartitionState
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.purgatory import MonotonicClock, Purgatory, SystemTimer
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.client import Consumer
from minibroker.deploy.bench.common import (
    add_connection_arguments,
    ensure_topic,
    percentile,
    report,
)
from minibroker.deploy.bench.load import broker_under_test


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_connection_arguments(p)
    p.add_argument("--members", type=int, default=10, help="members of the rebalanced group")
    p.add_argument("--heartbeat-members", type=int, default=10_000)
    p.add_argument("--heartbeat-groups", type=int, default=1000)
    p.add_argument("--heartbeat-interval-ms", type=int, default=1000)
    p.add_argument("--session-timeout-ms", type=int, default=6000)
    p.add_argument("--duration", type=float, default=10.0, help="steady heartbeat phase, s")


def run(args: argparse.Namespace) -> int:
    return report(measure, args)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"bench": "groups"}
    with broker_under_test(args.bootstrap, "minibroker-groups-") as (bootstrap, _):
        figures["rebalance"] = trio.run(_rebalance, bootstrap, args.members)
    figures["heartbeats"] = _heartbeats(args)
    return figures


# --- 1. rebalance after a member leaves ----------------------------------------------------


async def _rebalance(bootstrap: str, members: int) -> dict[str, Any]:
    topic = "__bench_groups"
    await ensure_topic(bootstrap, topic, members * 2, 1)
    settings = {"heartbeat.interval.ms": 100, "session.timeout.ms": 10000}
    consumers: list[Consumer] = []
    polling: list[trio.CancelScope] = []
    end = trio.Event()

    async def member(ready: trio.Event) -> None:
        async with Consumer(bootstrap, group_id="bench-rebalance", **settings) as c:
            c.subscribe([topic])
            consumers.append(c)
            with trio.CancelScope() as scope:
                polling.append(scope)
                ready.set()
                while not end.is_set():
                    await c.poll(timeout_ms=50)
            await end.wait()  # stopped polling (the leaver): stay open, never rejoin

    def rebalanced(c: Consumer) -> bool:
        # Joined, and poll() has taken the new assignment (a join runs in the background).
        return c._group.generation > generation and not c._group.rejoin_needed and not c._join

    async with trio.open_nursery() as nursery:
        for _ in range(members):
            ready = trio.Event()
            nursery.start_soon(member, ready)
            await ready.wait()
        with trio.fail_after(120):
            while not all(c._group.generation > 0 and c.assignment() for c in consumers):
                await trio.sleep(0.01)
            generation = max(c._group.generation for c in consumers)
            while not all(c._group.generation == generation for c in consumers):
                await trio.sleep(0.01)
        leaver, survivors = consumers[0], consumers[1:]
        polling[0].cancel()  # it polls no more, so it does not join again
        started = time.monotonic()
        await leaver._group.leave()
        leaver.assign([])
        with trio.fail_after(120):
            while not all(rebalanced(c) for c in survivors):
                await trio.sleep(0.001)
        done = time.monotonic()
        slowest_rejoin = max(c._group.join_started for c in survivors)
        owned = sum(len(c.assignment()) for c in survivors)
        end.set()
    return {
        "members": members,
        "heartbeat_interval_ms": settings["heartbeat.interval.ms"],
        "rebalance_ms": round((done - started) * 1000, 1),
        "after_slowest_rejoin_ms": round((done - slowest_rejoin) * 1000, 1),
        "partitions_owned_after": owned,
    }


# --- 2. many members' heartbeats in one coordinator -------------------------------------------


def _heartbeats(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="minibroker-heartbeats-") as tmp:
        return trio.run(_heartbeat_run, args, Path(tmp))


async def _heartbeat_run(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    config = BrokerConfig(
        {
            "offsets.topic.num.partitions": 5,
            "group.initial.rebalance.delay.ms": 100,
            "group.min.session.timeout.ms": 1000,
        }
    )
    clock = MonotonicClock()
    timer = SystemTimer(clock=clock)
    log = _ExpiryLog()
    rm = ReplicaManager(
        0,
        data_dir,
        config,
        structlog.get_logger(),
        Purgatory("Fetch", timer),
        Purgatory("Produce", timer),
        clock.now_ms,
    )
    for p in range(5):
        rm.host_partition(OFFSETS_TOPIC, p, PartitionState(0, 1, [0], [0], 1))
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    async with trio.open_nursery() as nursery:
        service = CoordinatorService(
            0,
            config,
            log,
            replica_manager=rm,
            timer=timer,
            tasks=nursery,
            metadata=lambda: None,
            create_offsets_topic=lambda n, rf: None,
        )
        service.manager.owned.update({p: 1 for p in range(5)})
        token = trio.lowlevel.current_trio_token()
        for purgatory in service.purgatories.values():
            purgatory.set_expiry_handoff(
                lambda batch, p=purgatory: token.run_sync_soon(p.expire_batch, batch)
            )
        timer.start()
        try:
            members = await _join_all(service, args)
            figures = await _drive(service, members, args, log)
        finally:
            timer.shutdown()
            rm.close()
            nursery.cancel_scope.cancel()
    return figures


async def _join_all(service: CoordinatorService, args: argparse.Namespace) -> list[tuple]:
    per_group = max(1, args.heartbeat_members // args.heartbeat_groups)
    joins: list[tuple[str, str, Any]] = []
    for g in range(args.heartbeat_groups):
        group = f"g{g}"
        for _ in range(per_group):
            body = {
                "group_id": group,
                "session_timeout_ms": args.session_timeout_ms,
                "rebalance_timeout_ms": 60000,
                "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}],
                "member_id": "",
            }
            member_id = service.join_group(body, "bench", "127.0.0.1")["member_id"]
            joins.append(
                (
                    group,
                    member_id,
                    service.join_group({**body, "member_id": member_id}, "bench", "h"),
                )
            )
    with trio.fail_after(60):
        while any(isinstance(a, PendingResponse) and a.body is None for _, _, a in joins):
            await trio.sleep(0.05)
    members = []
    for group, member_id, answer in joins:
        body = answer.body if isinstance(answer, PendingResponse) else answer
        generation = body["generation_id"]
        service.sync_group(
            {
                "group_id": group,
                "generation_id": generation,
                "member_id": member_id,
                "assignments": [],
                "protocol_type": None,
                "protocol_name": None,
            }
        )
        members.append((group, member_id, generation))
    return members


class _ExpiryLog:
    """The coordinator's logger here: notes when each member is expired (the moment the
    coordinator removes it), drops everything else."""

    def __init__(self) -> None:
        self.expired_at: dict[str, float] = {}

    def info(self, event: str, **fields: Any) -> None:
        if event == "group_member_expired":
            self.expired_at[fields["member"]] = time.monotonic()


async def _drive(
    service: CoordinatorService, members: list[tuple], args: argparse.Namespace, log: _ExpiryLog
) -> dict[str, Any]:
    interval = args.heartbeat_interval_ms / 1000
    slots = 100  # heartbeats spread over the interval, as real members' would be
    heartbeat = service.heartbeat
    bodies = [{"group_id": g, "generation_id": gen, "member_id": m} for g, m, gen in members]
    silent = set(range(0, len(bodies), 10))  # a tenth stop after the steady phase
    last_heartbeat: dict[str, float] = {}
    errors = sent = sent_steady = 0
    handler_cpu = 0.0  # the trio thread's CPU inside the heartbeat calls, steady phase
    timer_thread = psutil.Process().threads  # per-thread CPU: the timer thread's share
    timer_id = next(t.native_id for t in threading.enumerate() if t.name.startswith("timer-"))

    def timer_cpu() -> float:
        return next((t.user_time + t.system_time for t in timer_thread() if t.id == timer_id), 0)

    start = time.monotonic()
    cpu_start = time.process_time()
    timer_start = timer_cpu()
    steady_end = start + args.duration
    end = steady_end + (args.session_timeout_ms / 1000) * 1.5
    cpu_steady = timer_steady = None
    tick = 0
    while time.monotonic() < end:
        now = time.monotonic()
        steady = now < steady_end
        if cpu_steady is None and not steady:
            cpu_steady = (time.process_time() - cpu_start) / (now - start)
            timer_steady = (timer_cpu() - timer_start) / (now - start)
            sent_steady = sent
        handler_start = time.thread_time()
        for i in range(tick % slots, len(bodies), slots):
            if i in silent:
                if not steady:
                    continue
                last_heartbeat[bodies[i]["member_id"]] = time.monotonic()
            errors += heartbeat(bodies[i])["error_code"] != 0 and steady
            sent += 1
        if steady:
            handler_cpu += time.thread_time() - handler_start
        tick += 1
        # Paced on time.monotonic (the coordinator's clock), not trio's: trio's clock has
        # an offset of its own, and a deadline on the wrong clock never sleeps.
        await trio.sleep(max(0.0, start + tick * interval / slots - time.monotonic()))
    stats = service.purgatories["heartbeat"].stats()
    session_s = args.session_timeout_ms / 1000
    late_ms = sorted(
        (at - last_heartbeat[member] - session_s) * 1000
        for member, at in log.expired_at.items()
        if member in last_heartbeat
    )
    return {
        "members": len(bodies),
        "groups": args.heartbeat_groups,
        "heartbeat_interval_ms": args.heartbeat_interval_ms,
        "session_timeout_ms": args.session_timeout_ms,
        "heartbeats_per_s": round(sent_steady / args.duration),
        "steady_errors": errors,
        # The whole process (this load generator and trio's 100 wake-ups a second too), and
        # of it: the heartbeat calls themselves, and the timer thread.
        "cpu_share_of_a_core": round(cpu_steady or 0.0, 4),
        "heartbeat_calls_cpu_share": round(handler_cpu / args.duration, 4),
        "timer_thread_cpu_share": round(timer_steady or 0.0, 4),
        "expired": len(late_ms),
        "expiry_lateness_ms": {
            "p50": round(percentile(late_ms, 0.50), 1),
            "p99": round(percentile(late_ms, 0.99), 1),
            "max": round(late_ms[-1], 1) if late_ms else None,
        },
        "purgatory_expiry_lateness": stats["expiry_lateness"],
    }
