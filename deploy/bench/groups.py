"""`minibroker bench groups`: the two consumer-group targets of issue 28, one JSON line.

1. Rebalance of a ``--members`` group (real broker process, real consumers) after one
   member leaves: from the LeaveGroup to every survivor holding its new partitions, and
   the part of it after the slowest survivor began to rejoin (target: <= 100 ms).
2. ``--heartbeat-members`` members in ``--heartbeat-groups`` groups heartbeating every
   ``--heartbeat-interval-ms`` into one coordinator: the broker's own coordinator,
   purgatories and timer thread, on the real clock, driven in-process (no sockets: this
   measures the purgatory and coordinator, not the network). After a session timeout of
   heartbeats (so each member's operation has come due and been re-armed once) the CPU of
   ``--duration`` seconds is measured and split: the broker's (the heartbeat calls, the
   expiry passes the timer hands the trio thread, the timer thread; target <= 5 % of a
   core), the whole process's, and the load generator's alone (the same loop and pacing
   with a do-nothing coordinator, run first). Then a tenth of the members stop; how late
   each is expired (its last heartbeat + session timeout to the coordinator removing it:
   p50/p99/max; target p99 <= 20 ms) and the Heartbeat purgatory's own lateness
   histogram are reported.
3. The same members over real sockets to the broker process of part 1, when the bench
   started it (groups_sockets.py): what the heartbeats cost a broker, network included.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import structlog
import trio

from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.coordinator import OFFSETS_TOPIC, CoordinatorService
from minibroker.broker.metadata.image import PartitionState
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.purgatory import (
    DeadlinePurgatory,
    MonotonicClock,
    Purgatory,
    SystemTimer,
    switch_interval_for,
)
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.client import Consumer
from minibroker.deploy.bench import groups_sockets
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
    p.add_argument(
        "--heartbeat-members", type=int, default=10_000, help="members heartbeating, in all"
    )
    p.add_argument(
        "--heartbeat-groups", type=int, default=1000, help="groups those members are spread over"
    )
    p.add_argument(
        "--heartbeat-interval-ms",
        type=int,
        default=1000,
        help="each member's heartbeat.interval.ms",
    )
    p.add_argument(
        "--session-timeout-ms", type=int, default=6000, help="each member's session.timeout.ms"
    )
    p.add_argument(
        "--duration",
        type=float,
        default=10.0,
        help="measured heartbeat phase, s (after a session timeout of heartbeats)",
    )
    p.add_argument(
        "--socket-connections",
        type=int,
        default=1000,
        help="connections of the heartbeat members to a broker process (0: skip that part)",
    )


def run(args: argparse.Namespace) -> int:
    return report(measure, args)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"bench": "groups"}
    # A new group's first join waits 100 ms for more members, not 3 s: the socket part
    # joins 1,000 groups (the rebalance measured is a later one, not the first).
    config = {"group.initial.rebalance.delay.ms": "100"}
    with broker_under_test(args.bootstrap, "minibroker-groups-", config) as (bootstrap, broker):
        figures["rebalance"] = trio.run(_rebalance, bootstrap, args.members)
        if broker is not None and args.socket_connections > 0:
            # Only a broker it started: the figure is that process's CPU.
            figures["heartbeats_over_sockets"] = trio.run(
                groups_sockets.run, bootstrap, broker, args
            )
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
    # The broker's switch interval (server.py): one timer tick, not CPython's 5 ms.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(switch_interval_for(BrokerConfig({})["timer.tick.ms"]))
    try:
        with tempfile.TemporaryDirectory(prefix="minibroker-heartbeats-") as tmp:
            return trio.run(_heartbeat_run, args, Path(tmp))
    finally:
        sys.setswitchinterval(switch_interval)


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
        timer.start()
        meter = _Meter(timer, service.purgatories["heartbeat"])
        for purgatory in service.purgatories.values():
            # As the broker's hand-off (server.py), timed: the trio thread's expiry passes.
            purgatory.set_expiry_handoff(_to_loop(token, meter.timed(purgatory.expire_batch)))
        try:
            generator = await _generator_alone(args)
            members = await _join_all(service, args)
            figures = await _drive(service, members, args, log, meter, generator)
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


def _to_loop(token: trio.lowlevel.TrioToken, run: Callable[[list], None]) -> Callable[[list], None]:
    return lambda batch: token.run_sync_soon(run, batch)


class _ExpiryLog:
    """The coordinator's logger here: notes when each member is expired (the moment the
    coordinator removes it), drops everything else."""

    def __init__(self) -> None:
        self.expired_at: dict[str, float] = {}

    def info(self, event: str, **fields: Any) -> None:
        if event == "group_member_expired":
            self.expired_at[fields["member"]] = time.monotonic()


def _slots(bodies: list[dict], slots: int) -> tuple[list, list, list]:
    """Per slot of the interval: every member's body, the live members' bodies (after the
    steady phase; a tenth of the members fall silent), and the silent members' ids. Built
    before the clock starts, so the loop that sends does no per-member work."""
    n = len(bodies)
    every = [bodies[s::slots] for s in range(slots)]
    live = [[bodies[i] for i in range(s, n, slots) if i % 10] for s in range(slots)]
    quiet = [
        [bodies[i]["member_id"] for i in range(s, n, slots) if not i % 10] for s in range(slots)
    ]
    return every, live, quiet


async def _pace(
    heartbeat: Callable[[dict], dict],
    slots: tuple[list[list[dict]], list[list[dict]], list[list[str]]],
    interval_s: float,
    phases_s: tuple[float, float, float],
    meter: _Meter,
) -> dict[str, Any]:
    """Send each slot's heartbeats at its instant (a slot every ``interval_s / len(slots)``):
    every member's through a warm-up and the measured phase (``meter`` runs over it), then
    only the live members' through a tail. Returns the measured phase's sends, errors, the
    trio thread's CPU inside the heartbeat calls, and each silent member's last send."""
    warmup_s, measured_s, tail_s = phases_s
    every, live, quiet = slots
    count = len(every)
    last: dict[str, float] = {}
    calls_cpu = 0.0
    sent = errors = 0
    start = time.monotonic()
    measure_from = start + warmup_s
    steady_end = measure_from + measured_s
    end = steady_end + tail_s
    measuring = False
    tick = 0
    thread_time = time.thread_time
    while True:
        now = time.monotonic()
        if now >= steady_end:
            if not meter.figures:
                meter.stop(now)
            if now >= end:
                break
        elif not measuring and now >= measure_from:
            measuring = True
            meter.start(now)
        slot = tick % count
        if now < steady_end:
            for member_id in quiet[slot]:
                # Stamped before the calls: lateness is over-stated by up to one slot's
                # calls (~0.1 ms), never under-stated.
                last[member_id] = now
            batch = every[slot]
            t0 = thread_time()
            answers = list(map(heartbeat, batch))
            if measuring:
                calls_cpu += thread_time() - t0
                sent += len(batch)
                errors += sum(1 for a in answers if a["error_code"])
        else:
            list(map(heartbeat, live[slot]))
        tick += 1
        # Paced on time.monotonic (the coordinator's clock), not trio's: trio's clock has
        # an offset of its own, and a deadline on the wrong clock never sleeps.
        await trio.sleep(max(0.0, start + tick * interval_s / count - time.monotonic()))
    return {"sent": sent, "errors": errors, "calls_cpu": calls_cpu, "last": last}


class _Meter:
    """CPU over one window, as shares of a core: the process, the timer thread, and the
    trio thread inside the expiry hand-offs (``timed`` wraps them); the timer's wake-ups."""

    def __init__(
        self, timer: SystemTimer | None = None, heartbeats: DeadlinePurgatory | None = None
    ) -> None:
        self._process = psutil.Process()
        self._timer = timer
        self._heartbeats = heartbeats
        self._timer_id = None
        if timer is not None:
            self._timer_id = next(
                t.native_id for t in threading.enumerate() if t.name.startswith("timer-")
            )
        self._expiry_cpu = 0.0
        self._handoffs = 0
        self._open = False
        self.figures: dict[str, float] = {}

    def _timer_cpu(self) -> float:
        for t in self._process.threads():
            if t.id == self._timer_id:
                return t.user_time + t.system_time
        return 0.0

    def _counts(self) -> tuple[int, int]:
        wakeups = self._timer.wakeups if self._timer is not None else 0
        return wakeups, self._heartbeats.rearmed if self._heartbeats is not None else 0

    def start(self, now: float) -> None:
        self._at = (now, time.process_time(), self._timer_cpu(), self._counts())
        self._open = True

    def stop(self, now: float) -> None:
        self._open = False
        wall0, process0, timer0, (wakeups0, rearms0) = self._at
        wakeups, rearms = self._counts()
        wall = now - wall0
        self.figures = {
            "wall": wall,
            "process": (time.process_time() - process0) / wall,
            "timer_thread": (self._timer_cpu() - timer0) / wall,
            "expiry": self._expiry_cpu / wall,
            "handoffs": self._handoffs / wall,
            "wakeups": (wakeups - wakeups0) / wall,
            "rearms": (rearms - rearms0) / wall,
        }

    def timed(self, expire_batch: Callable[[list], int]) -> Callable[[list], None]:
        def run(batch: list) -> None:
            if not self._open:
                expire_batch(batch)
                return
            t0 = time.thread_time()
            expire_batch(batch)
            self._expiry_cpu += time.thread_time() - t0
            self._handoffs += 1

        return run


async def _generator_alone(args: argparse.Namespace) -> dict[str, float]:
    """The load generator alone: the same loop, pacing and body shapes, with a coordinator
    that does nothing. Its CPU (with the trio wake-ups of its 100 slots a second) is the
    bench's, not the broker's."""
    per_group = max(1, args.heartbeat_members // args.heartbeat_groups)
    bodies = [
        {"group_id": f"g{g}", "generation_id": 1, "member_id": f"bench-{uuid.uuid4()}"}
        for g in range(args.heartbeat_groups)
        for _ in range(per_group)
    ]
    meter = _Meter()
    interval = args.heartbeat_interval_ms / 1000
    await _pace(_noop_heartbeat, _slots(bodies, 100), interval, (0, args.duration, 0), meter)
    return meter.figures


async def _drive(
    service: CoordinatorService,
    members: list[tuple],
    args: argparse.Namespace,
    log: _ExpiryLog,
    meter: _Meter,
    generator: dict[str, float],
) -> dict[str, Any]:
    interval = args.heartbeat_interval_ms / 1000
    session_s = args.session_timeout_ms / 1000
    bodies = [{"group_id": g, "generation_id": gen, "member_id": m} for g, m, gen in members]
    slots = _slots(bodies, 100)  # spread over the interval, as real members' are
    # Measured after a session timeout of heartbeats: by then every member's operation has
    # come due once, so the window holds the steady state's re-arms, not only the stores.
    phases = (session_s, args.duration, session_s * 1.5)
    run = await _pace(service.heartbeat, slots, interval, phases, meter)
    steady = meter.figures
    stats = service.purgatories["heartbeat"].stats()
    last = run["last"]
    late_ms = sorted(
        (at - last[member] - session_s) * 1000
        for member, at in log.expired_at.items()
        if member in last
    )
    wall = steady["wall"]
    calls = run["calls_cpu"] / wall
    broker = calls + steady["expiry"] + steady["timer_thread"]
    return {
        "members": len(bodies),
        "groups": args.heartbeat_groups,
        "heartbeat_interval_ms": args.heartbeat_interval_ms,
        "session_timeout_ms": args.session_timeout_ms,
        "heartbeats_per_s": round(run["sent"] / wall),
        "steady_errors": run["errors"],
        # The broker's cost of the target (the measured phase, shares of one core): the
        # heartbeat calls (coordinator and deadline store, trio thread), the expiry passes
        # the timer hands the trio thread (re-arms, expiries), and the timer thread. No
        # sockets here: decoding and answering requests is not in it.
        "broker_cpu_share": round(broker, 4),
        "heartbeat_calls_cpu_share": round(calls, 4),
        "expiry_passes_cpu_share": round(steady["expiry"], 4),
        "timer_thread_cpu_share": round(steady["timer_thread"], 4),
        "us_per_heartbeat": round(run["calls_cpu"] / max(run["sent"], 1) * 1e6, 2),
        "timer_wakeups_per_s": round(steady["wakeups"], 1),
        "expiry_handoffs_per_s": round(steady["handoffs"], 1),
        # Members that joined together re-arm together (once a session timeout minus an
        # interval each): a window sees one or two such waves, so the cost of one re-arm
        # is the figure to scale, not the rate.
        "rearms_per_s": round(steady["rearms"], 1),
        "us_per_rearm": round(steady["expiry"] / steady["rearms"] * 1e6, 2)
        if steady["rearms"]
        else None,
        # Besides the broker: the whole process in the same window, and the load generator
        # alone (the same loop with a do-nothing coordinator, its own run). Process minus
        # generator minus broker is what neither accounts for (trio scheduling the
        # hand-offs, garbage collection, measurement).
        "process_cpu_share": round(steady["process"], 4),
        "generator_alone_cpu_share": round(generator["process"], 4),
        "expired": len(late_ms),
        "expiry_lateness_ms": {
            "p50": round(percentile(late_ms, 0.50), 1),
            "p99": round(percentile(late_ms, 0.99), 1),
            "max": round(late_ms[-1], 1) if late_ms else None,
        },
        "purgatory_expiry_lateness": stats["expiry_lateness"],
    }


_NOOP_ANSWER = {"error_code": 0}


def _noop_heartbeat(body: dict) -> dict:
    return _NOOP_ANSWER
