"""Kafka's TestPurgatoryPerformance for minibroker's purgatory (seed 000's experiment).

Requests arrive with exponential inter-arrival times at ``--rate``; each is watched on
3 keys out of 100 with a ``--timeout`` ms deadline; a log-normal completion latency
(``--pct50``/``--pct75``) decides whether a completer thread completes it first or it
times out. Arrivals, latencies and keys are precomputed so the harness costs ~1 µs per
request. One JSON line per run.

``--impl wheel`` runs the broker's own Purgatory + SystemTimer with expiry handed to an
owner loop in batches (the broker's run_sync_soon hand-off); ``heap`` is Kafka 0.8's
design (heapq of operations, lazy deletion, full purge every N requests) and
``trio-tasks`` one trio task per operation. ``all`` and ``--sweep`` run each point in a
fresh subprocess.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import itertools
import json
import math
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
from array import array
from bisect import bisect_right
from collections import deque

from minibroker.broker.purgatory import (
    DelayedOperation,
    Purgatory,
    SystemTimer,
    switch_interval_for,
)
from minibroker.deploy.bench.common import percentile

IMPLS = ("wheel", "heap", "trio-tasks")
SCENARIOS = {"low": (20.0, 60.0), "high": (200.0, 400.0)}
SWEEPS = {
    "low": [50_000, 100_000, 150_000, 200_000, 250_000, 300_000, 350_000, 400_000, 450_000],
    "high": [50_000, 100_000, 150_000, 200_000, 250_000, 300_000, 350_000, 400_000],
}
KEY_SPACE = 100
KEYS_PER_REQUEST = 3
KEY_POOL = 1 << 16  # distinct key triples, drawn per request by index (no per-op tuple)
MIN_SLEEP_S = 0.0005
_now_ns = time.monotonic_ns


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a(
        "--impl",
        choices=(*IMPLS, "null", "all"),
        default="wheel",
        help="design to run (default wheel); null: the harness alone",
    )
    a(
        "--scenario",
        choices=tuple(SCENARIOS),
        default="high",
        help="low: pct50 20/pct75 60 ms; high: 200/400",
    )
    a("--requests", type=int, default=1_000_000, help="requests per run (default 1,000,000)")
    a("--rate", type=float, default=100_000, help="target requests/s (exponential inter-arrival)")
    a("--pct50", type=float, help="median completion latency ms (overrides --scenario)")
    a("--pct75", type=float, help="75th percentile completion latency ms (overrides --scenario)")
    a("--timeout", type=int, default=200, help="operation timeout ms (default 200)")
    a("--tick", type=int, default=1, help="timer tick ms (default 1)")
    a("--wheel-size", type=int, default=20, help="buckets per wheel (default 20)")
    a("--purge-interval", type=int, default=1000, help="purgatory.purge.interval.requests")
    a(
        "--gc",
        choices=("off", "tuned", "default"),
        default="off",
        help="off: no cyclic GC after set-up (default; operations form no cycles and are "
        "freed by refcount); tuned: gc.freeze() and a 50,000 gen-0 threshold; default: "
        "CPython's",
    )
    a(
        "--switch-interval",
        type=float,
        help="sys.setswitchinterval seconds (default: the broker's, one timer tick)",
    )
    a(
        "--seed",
        type=int,
        default=42,
        help="seed of the workload's random arrivals, latencies and keys",
    )
    a("--sweep", action="store_true", help="step the target rate; find each impl's saturation")
    a("--sweep-rates", help="comma-separated target rates for --sweep")
    a("--runs", type=int, default=3, help="runs per sweep point; the median is used")


def run(args: argparse.Namespace) -> int:
    if args.sweep:
        return _sweep(args)
    if args.impl == "all":
        for impl in IMPLS:
            print(json.dumps(_run_subprocess(args, impl, args.rate)), flush=True)
        return 0
    result = run_one(args)
    print(json.dumps(result), flush=True)
    return 0 if result["exactly_once_violations"] == 0 else 1


# --- workload -----------------------------------------------------------------------------


class Workload:
    """Precomputed arrivals (s), completion latencies (ms) and key-triple indexes."""

    def __init__(self, n: int, rate: float, pct50: float, pct75: float, seed: int) -> None:
        rng = random.Random(seed)
        mu = math.log(pct50)
        sigma = (math.log(pct75) - mu) / 0.6744897501960817  # z of the 75th percentile
        expo = rng.expovariate
        t = 0.0
        arrivals = array("d", bytes(8 * n))
        for i in range(n):
            t += expo(rate)
            arrivals[i] = t
        self.arrivals = arrivals
        lognorm = rng.lognormvariate
        self.latencies = array("d", (lognorm(mu, sigma) for _ in range(n)))
        self.key_index = array("H", (rng.randrange(KEY_POOL) for _ in range(n)))
        self.key_pool = [
            tuple(rng.sample(range(KEY_SPACE), KEYS_PER_REQUEST)) for _ in range(KEY_POOL)
        ]


class Tally:
    """Outcome counters; ``first`` is a C-level counter since completers race expiry."""

    def __init__(self) -> None:
        self.first = itertools.count()
        self.violations = itertools.count()
        self.expired = 0
        self.lateness = array("f")


TALLY = Tally()


class BenchOp(DelayedOperation):
    """Kafka's FakeOperation: completes only when forced (completer or timeout)."""

    __slots__ = ("calls", "due", "scope")

    def __init__(self, delay_ms: int) -> None:
        DelayedOperation.__init__(self, delay_ms)  # no super() object per op
        self.calls = 0  # scope is set by the trio-tasks driver only

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        self.calls += 1
        if self.calls == 1:
            next(TALLY.first)
        else:
            next(TALLY.violations)

    def on_expiration(self) -> None:
        TALLY.expired += 1
        TALLY.lateness.append(_now_ns() / 1e6 - self.expiration_ms)


# --- the completer thread (shared by wheel and heap) ----------------------------------------


class Completer:
    """Force-completes ops at their due ms; ops arrive through a deque, kept in ms buckets."""

    def __init__(self) -> None:
        self.inbox: deque[BenchOp] = deque()
        self.stop = False
        self.thread = threading.Thread(target=self._run, name="completer", daemon=True)

    def _run(self) -> None:
        inbox = self.inbox
        pop = inbox.popleft
        buckets: dict[int, list[BenchOp]] = {}
        cursor = _now_ns() // 1_000_000
        sleep = time.sleep
        while True:
            while inbox:
                op = pop()
                due = op.due if op.due > cursor else cursor
                lst = buckets.get(due)
                if lst is None:
                    buckets[due] = [op]
                else:
                    lst.append(op)
            now = _now_ns() // 1_000_000
            while cursor <= now:
                lst = buckets.pop(cursor, None)
                if lst:
                    for op in lst:
                        op.force_complete()
                cursor += 1
            if self.stop and not inbox and not buckets:
                return
            sleep(0.001)


# --- implementations ----------------------------------------------------------------------


class WheelImpl:
    """The broker's Purgatory + SystemTimer; expiry goes to the owner loop in batches."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.timer = SystemTimer(tick_ms=args.tick, wheel_size=args.wheel_size, name="bench")
        self.inbox: deque[list] = deque()  # stands in for trio's run_sync_soon queue
        self.purgatory = Purgatory("bench", self.timer, purge_interval=args.purge_interval)
        self.purgatory.set_expiry_handoff(self.inbox.append)
        self.submit = self.purgatory.try_complete_else_watch
        self.timer.start()

    def run_owner_work(self) -> None:
        inbox = self.inbox
        expire = self.purgatory.expire_batch
        while inbox:
            expire(inbox.popleft())

    def pending(self) -> int:
        return self.purgatory.pending

    def close(self) -> None:
        self.timer.shutdown()


class NullImpl:
    """The harness alone: every op completes on submit (the floor for the others)."""

    def __init__(self, args: argparse.Namespace) -> None:
        pass

    def submit(self, op: BenchOp, keys) -> bool:
        return op.force_complete()

    def run_owner_work(self) -> None:
        pass

    def pending(self) -> int:
        return 0

    def close(self) -> None:
        pass


class HeapImpl:
    """Kafka 0.8: a heap of (deadline, seq, op) under a lock, completed ops deleted lazily,
    and a purge that scans the heap and every watcher list each ``purge_interval`` requests."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.lock = threading.Lock()
        self.heap: list[tuple[int, int, BenchOp]] = []
        self.seq = itertools.count()
        self.watchers: dict[int, list[BenchOp]] = {}
        self.since_purge = 0
        self.purge_interval = args.purge_interval
        self.inbox: deque[list] = deque()
        self.wake = threading.Event()
        self.wake_at = float("-inf")
        self.closing = False
        self.outstanding = 0
        self.thread = threading.Thread(target=self._reaper, name="reaper", daemon=True)
        self.thread.start()

    def submit(self, op: BenchOp, keys) -> bool:
        if op.try_complete():
            return True
        watchers = self.watchers
        for key in keys:
            lst = watchers.get(key)
            if lst is None:
                watchers[key] = [op]
            else:
                lst.append(op)
        op.expiration_ms = exp = _now_ns() // 1_000_000 + op.delay_ms
        with self.lock:
            heapq.heappush(self.heap, (exp, next(self.seq), op))
        self.outstanding += 1
        if exp < self.wake_at:
            self.wake.set()
        self.since_purge += 1
        if self.since_purge >= self.purge_interval:
            self.since_purge = 0
            self._purge()
        return False

    def _purge(self) -> None:
        with self.lock:
            self.heap = [e for e in self.heap if not e[2].is_completed]
            heapq.heapify(self.heap)
        watchers = self.watchers
        for key, ops in list(watchers.items()):
            watchers[key] = [op for op in ops if not op.is_completed]

    def _reaper(self) -> None:
        wake = self.wake
        while not self.closing:
            wake.clear()
            self.wake_at = float("-inf")
            now = _now_ns() // 1_000_000
            batch = []
            with self.lock:
                heap = self.heap
                while heap and heap[0][0] <= now:
                    op = heapq.heappop(heap)[2]
                    if not op.is_completed:
                        batch.append(op)
                nxt = heap[0][0] if heap else None
            if batch:
                self.inbox.append(batch)
            self.wake_at = float("inf") if nxt is None else nxt
            if nxt is None:
                wake.wait()
            else:
                wake.wait(max(0, nxt - _now_ns() // 1_000_000) / 1000)

    def run_owner_work(self) -> None:
        inbox = self.inbox
        while inbox:
            for op in inbox.popleft():
                if op.force_complete():
                    op.on_expiration()

    def pending(self) -> int:
        return self.outstanding - (_counter(TALLY.first))

    def close(self) -> None:
        self.closing = True
        self.wake.set()
        self.thread.join(5)


def _counter(counter: itertools.count) -> int:
    return int(repr(counter)[6:-1])


# --- drivers ------------------------------------------------------------------------------


def _drive_threads(impl, work: Workload, timeout: int) -> float:
    """The owner loop: submit arrivals on schedule, run handed-over expiry, then drain."""
    completer = Completer()
    completer.thread.start()
    cinbox = completer.inbox.append
    submit = impl.submit
    owner_work = impl.run_owner_work
    arrivals = work.arrivals
    # Set-up, before the clock starts: each request's key triple, and its completion
    # offset in whole ms (-1: it is left to time out).
    keys = [work.key_pool[j] for j in work.key_index]
    due_in = array("i", (int(x) if x < timeout else -1 for x in work.latencies))
    n = len(arrivals)
    perf = time.perf_counter
    sleep = time.sleep
    i = 0
    t0 = perf()
    while i < n:
        now = perf() - t0
        now_ms = _now_ns() // 1_000_000
        # Everything due by now, at most 128: re-read the clock and run owner work often.
        end = bisect_right(arrivals, now, i, min(n, i + 128))
        for k in range(i, end):
            op = BenchOp(timeout)
            submit(op, keys[k])
            d = due_in[k]
            if d >= 0 and not op.is_completed:
                op.due = now_ms + d
                cinbox(op)
        i = end
        owner_work()
        if i < n:
            # Ahead of schedule: sleep (and let the timer and completer run) rather than
            # spin; the next pass submits everything that came due meanwhile.
            # At least MIN_SLEEP_S: a sleep per few requests would cost more than them.
            wait = arrivals[i] - (perf() - t0)
            if wait > 0:
                sleep(wait if wait > MIN_SLEEP_S else MIN_SLEEP_S)
    elapsed = perf() - t0
    completer.stop = True
    deadline = perf() + timeout / 1000 * 20 + 30
    while perf() < deadline:
        owner_work()
        if not completer.thread.is_alive() and impl.pending() <= 0:
            break
        sleep(0.001)
    owner_work()
    impl.close()
    return elapsed


def _drive_trio(work: Workload, timeout: int, purge_interval: int) -> float:
    """One trio task per operation, waiting on its own cancel scope's deadline."""
    import trio

    watchers: dict[int, list[BenchOp]] = {}
    state = {"watched": 0, "dead_at_purge": 0, "cursor": 0}
    elapsed = [0.0]

    async def wait_op(op: BenchOp, deadline: float) -> None:
        if op.is_completed:  # completed before this task first ran
            return
        with trio.CancelScope(deadline=deadline) as scope:
            op.scope = scope
            await trio.sleep_forever()
        if op.force_complete():
            op.on_expiration()

    async def completer(buckets: dict[int, list[BenchOp]], done: trio.Event) -> None:
        state["cursor"] = cursor = _now_ns() // 1_000_000
        while True:
            now = _now_ns() // 1_000_000
            while cursor <= now:
                for op in buckets.pop(cursor, ()):
                    if op.force_complete() and op.scope is not None:
                        op.scope.cancel()
                cursor += 1
            state["cursor"] = cursor
            if done.is_set() and not buckets:
                return
            await trio.sleep(0.0005)

    def purge() -> None:
        # Same gated rule as the wheel's purgatory, so only the timeout mechanism differs.
        live = state["watched"] - _counter(TALLY.first)
        dead = state["watched"] - live - state["dead_at_purge"]
        if dead > purge_interval and dead >= live:
            for key, ops in list(watchers.items()):
                watchers[key] = [op for op in ops if not op.is_completed]
            state["dead_at_purge"] += dead

    async def main() -> None:
        buckets: dict[int, list[BenchOp]] = {}
        done = trio.Event()
        arrivals, latencies = work.arrivals, work.latencies
        key_index, key_pool = work.key_index, work.key_pool
        n = len(arrivals)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(completer, buckets, done)
            start_soon = nursery.start_soon
            current_time = trio.current_time
            t0 = current_time()
            i = 0
            while i < n:
                now = current_time() - t0
                now_ms = _now_ns() // 1_000_000
                end = min(n, i + 128)
                while i < end and arrivals[i] <= now:
                    op = BenchOp(timeout)
                    op.scope = None
                    for key in key_pool[key_index[i]]:
                        lst = watchers.get(key)
                        if lst is None:
                            watchers[key] = [op]
                        else:
                            lst.append(op)
                    state["watched"] += 1
                    op.expiration_ms = now_ms + timeout
                    start_soon(wait_op, op, t0 + now + timeout / 1000)
                    latency = latencies[i]
                    if latency < timeout:
                        due = now_ms + int(latency)
                        if due < state["cursor"]:  # the completer has passed that ms
                            due = state["cursor"]
                        lst = buckets.get(due)
                        if lst is None:
                            buckets[due] = [op]
                        else:
                            lst.append(op)
                    i += 1
                if state["watched"] % 1024 < 512:
                    purge()
                wait = arrivals[i] - (current_time() - t0) if i < n else 0
                await trio.sleep(wait if wait > MIN_SLEEP_S else (MIN_SLEEP_S if wait > 0 else 0))
            elapsed[0] = current_time() - t0
            done.set()

    trio.run(main)
    return elapsed[0]


def run_one(args: argparse.Namespace) -> dict:
    pct50, pct75 = SCENARIOS[args.scenario]
    pct50 = args.pct50 or pct50
    pct75 = args.pct75 or pct75
    work = Workload(args.requests, args.rate, pct50, pct75, args.seed)
    switch_interval = args.switch_interval or switch_interval_for(args.tick)
    sys.setswitchinterval(switch_interval)
    if args.gc == "off":
        gc.disable()
    elif args.gc == "tuned":
        # Set-up objects leave every collection and gen 0 fills up before one runs:
        # fewer collections, but each scans the operations in flight (~50k at 250k/s),
        # a pause of several ms that every thread, the timer's included, waits out.
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 50, 1000)
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    if args.impl == "trio-tasks":
        elapsed = _drive_trio(work, args.timeout, args.purge_interval)
    else:
        impl = {"wheel": WheelImpl, "heap": HeapImpl, "null": NullImpl}[args.impl](args)
        elapsed = _drive_threads(impl, work, args.timeout)
    cpu = time.process_time() - cpu0
    total_wall = time.perf_counter() - wall0
    first = _counter(TALLY.first)
    violations = _counter(TALLY.violations) + (args.requests - first)
    lateness = sorted(TALLY.lateness)
    return {
        "impl": args.impl,
        "scenario": args.scenario,
        "requests": args.requests,
        "target_rate": args.rate,
        "actual_rate": round(args.requests / elapsed),
        "elapsed_ms": round(elapsed * 1000),
        "total_ms": round(total_wall * 1000),
        "cpu_ms": round(cpu * 1000),
        "cpu_us_per_request": round(cpu * 1e6 / args.requests, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "expired": TALLY.expired,
        "completed": first - TALLY.expired,
        "lateness_p50_ms": round(percentile(lateness, 0.50), 2),
        "lateness_p99_ms": round(percentile(lateness, 0.99), 2),
        "lateness_max_ms": round(lateness[-1] if lateness else 0.0, 2),
        "exactly_once_violations": violations,
        "gc": args.gc,
        "switch_interval_ms": round(switch_interval * 1000, 3),
    }


# --- subprocesses and the sweep -------------------------------------------------------------


def _run_subprocess(args: argparse.Namespace, impl: str, rate: float) -> dict:
    cmd = [
        sys.executable, "-m", "minibroker.deploy.bench.purgatory", "--impl", impl, "--rate", str(rate),
        "--scenario", args.scenario, "--requests", str(args.requests),
        "--timeout", str(args.timeout), "--tick", str(args.tick),
        "--wheel-size", str(args.wheel_size), "--purge-interval", str(args.purge_interval),
        "--gc", args.gc, "--seed", str(args.seed),
    ]  # fmt: skip
    if args.switch_interval:
        cmd += ["--switch-interval", str(args.switch_interval)]
    if args.pct50:
        cmd += ["--pct50", str(args.pct50)]
    if args.pct75:
        cmd += ["--pct75", str(args.pct75)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{impl} at {rate}/s failed: {out.stderr.strip()[-500:]}")
    return json.loads(lines[-1])


def _sweep(args: argparse.Namespace) -> int:
    rates = (
        [float(r) for r in args.sweep_rates.split(",")]
        if args.sweep_rates
        else SWEEPS[args.scenario]
    )
    impls = IMPLS if args.impl == "all" else (args.impl,)
    summary = {}
    for impl in impls:
        saturation = None
        for rate in rates:
            results = [_run_subprocess(args, impl, rate) for _ in range(args.runs)]
            for result in results:
                print(json.dumps(result), flush=True)
            median = statistics.median(r["actual_rate"] for r in results)
            sustained = median >= 0.95 * rate
            print(
                json.dumps(
                    {
                        "sweep": impl,
                        "scenario": args.scenario,
                        "target_rate": rate,
                        "median_actual_rate": median,
                        "sustained": sustained,
                        "median_cpu_us_per_request": statistics.median(
                            r["cpu_us_per_request"] for r in results
                        ),
                    }
                ),
                flush=True,
            )
            if not sustained:
                break
            saturation = rate
        summary[impl] = saturation
    print(json.dumps({"sweep_summary": summary, "scenario": args.scenario}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.bench.purgatory", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
