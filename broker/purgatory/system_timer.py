"""The timer thread: sleeps until the earliest due bucket, expires, hands batches out.

Only the timer thread touches wheels and buckets. Other threads hand it work through
two ``collections.deque`` objects (append/popleft are atomic under the GIL: no lock on
the hot path). An add wakes the thread only when its deadline is earlier than the one
the thread sleeps until, or when it is the DRAIN_BATCH-th add queued: an idle timer
never wakes, a busy one wakes once per due bucket, draining everything queued since,
and a burst of adds far from their deadlines (start-up, long timeouts) is linked in
batches rather than piling up for one long drain that would hold up expiry.
"""

from __future__ import annotations

import threading
from collections import deque
from itertools import repeat, starmap
from time import clock_gettime, monotonic_ns, pthread_getcpuclockid

from minibroker.broker.common.clock import Clock, ManualClock, MonotonicClock
from minibroker.broker.purgatory.bucket import TimerTask, unlink_all
from minibroker.broker.purgatory.delivery import ExpireBatch, deliver, run_inline
from minibroker.broker.purgatory.engine import TimerEngine

# Adds queued before the thread is woken to link them (a power of two: the check is a mask).
DRAIN_BATCH = 1024
DRAIN_MASK = DRAIN_BATCH - 1

_INF = float("inf")
_AWAKE = float("-inf")  # published while awake: no add needs to signal


def switch_interval_for(tick_ms: int) -> float:
    """The interpreter switch interval (seconds) for a process that runs a timer thread.

    A thread that wants the GIL waits a whole switch interval before it may ask the
    holder to let go. With CPython's default of 5 ms, a busy owner thread holds every
    expiry up by as much, and by several intervals when more threads contend (measured:
    wake-up overshoot p99 11 ms at 5 ms, 4 ms at 1 ms, 250k ops/s). One tick keeps the
    wait within the timer's resolution; never above the default. Forced switches only
    happen while two threads want the GIL, so an uncontended process pays nothing.
    """
    return min(tick_ms / 1000, 0.005)


class SystemTimer:
    """Kafka's SystemTimer + reaper in one thread; expired tasks go out in batches.

    ``expire_batch`` receives each wake-up's expired tasks (for tasks that name no sink of
    their own); the default runs them inline on the timer thread.
    """

    def __init__(
        self,
        tick_ms: int = 1,
        wheel_size: int = 20,
        clock: Clock | None = None,
        expire_batch: ExpireBatch | None = None,
        name: str = "timer",
        start_ms: int | None = None,
    ) -> None:
        self.clock = clock or MonotonicClock()
        self._now = self.clock.now_ms
        self._monotonic = type(self.clock) is MonotonicClock
        self._engine = TimerEngine(
            tick_ms, wheel_size, self._now() if start_ms is None else start_ms
        )
        self._expire_batch = expire_batch or run_inline
        self._adds: deque[TimerTask] = deque()
        self._removes: deque[TimerTask] = deque()
        # A remove is one C call on the caller's thread (no Python frame): the timer thread
        # unlinks the task on its next wake-up.
        self.remove = self._removes.append
        self._wake = threading.Event()
        self._wake_at: float = _AWAKE
        self._closing = False
        # With a manual clock, real time means nothing: sleep until the clock moves.
        self._manual = isinstance(self.clock, ManualClock)
        if self._manual:
            self.clock.subscribe(self._wake.set)
        self._thread = threading.Thread(target=self._run, name=f"timer-{name}", daemon=True)
        self.wakeups = 0

    def start(self) -> SystemTimer:
        self._thread.start()
        return self

    def __enter__(self) -> SystemTimer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # --- any thread -------------------------------------------------------------------

    def add(self, task: TimerTask) -> None:
        """Schedule ``task`` to expire ``task.delay_ms`` from now (a task is added once)."""
        if self._monotonic:  # inlined MonotonicClock.now_ms: this is the hot path
            exp = monotonic_ns() // 1_000_000 + task.delay_ms
        else:
            exp = self._now() + task.delay_ms
        task.expiration_ms = exp
        task.timer = self
        adds = self._adds
        adds.append(task)
        # Read after the append: the thread publishes its wake time *before* its last look
        # at the deque, so either it sees this task or we see the time and signal.
        if exp < self._wake_at or not len(adds) & DRAIN_MASK:
            self._wake.set()

    def advance(self, timeout_ms: int = 0) -> bool:
        """The timer thread advances the wheel itself; this only hurries it: wake it now
        to run whatever is due (True while the thread runs)."""
        self._wake.set()
        return self._thread.is_alive()

    @property
    def size(self) -> int:
        """Live tasks: linked, or handed over and not yet linked, minus removes in flight."""
        return max(0, self._engine.size + len(self._adds) - len(self._removes))

    def thread_cpu_s(self) -> float:
        """CPU seconds the timer thread has used: what the timer costs, apart from the loop
        (stats; bench quotas --sockets reads its share of a core)."""
        ident = self._thread.ident
        if ident is None or not self._thread.is_alive():
            return 0.0
        return clock_gettime(pthread_getcpuclockid(ident))

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the thread; pending tasks are not run."""
        self._closing = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._manual:
            self.clock.unsubscribe(self._wake.set)

    # --- timer thread -----------------------------------------------------------------

    def _drain(self) -> None:
        """Link every handed-over task, then unlink every removed one.

        Other threads append meanwhile, so each deque is taken as far as its length now:
        ``starmap`` calls ``popleft`` that many times, in C; later ones wait for the next
        pass.
        """
        adds = self._adds
        if adds:
            self._engine.add_all(starmap(adds.popleft, repeat((), len(adds))))
        removes = self._removes
        if removes:
            unlink_all(starmap(removes.popleft, repeat((), len(removes))))

    def _run(self) -> None:
        engine = self._engine
        wake = self._wake
        adds = self._adds
        now = self._now
        precise = self._monotonic
        while not self._closing:
            wake.clear()
            self._wake_at = _AWAKE
            self.wakeups += 1
            while True:
                self._drain()
                engine.advance(now())
                expired = engine.take_due()
                if expired:
                    deliver(expired, self._expire_batch)
                nxt = engine.next_expiration()
                self._wake_at = _INF if nxt is None else nxt
                if not adds or self._closing:
                    break
                self._wake_at = _AWAKE
            if self._closing:
                break
            if nxt is None or self._manual:
                wake.wait()
            elif precise:
                # To the bucket's due instant, not from the floored ms (that overslept by
                # half a tick on average). Waking early is harmless: nothing is due yet.
                wake.wait(max(0, nxt * 1_000_000 - monotonic_ns()) / 1e9)
            else:
                # now() is floored, so this never wakes before the bucket is due.
                wake.wait(max(0, nxt - now()) / 1000)
