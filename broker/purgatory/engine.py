"""The single-threaded core of both timers: the wheel, its delay queue of buckets, and
Kafka's addTimerTaskEntry / advanceClock.

Whoever drives it (the timer thread, or a test's ManualTimer) is its only user, so
nothing here locks. Tasks that come due collect in ``due`` until the driver takes them
(``take_due``) and hands them out in one batch. Two choices keep it cheap: the bucket of
the last deadline is cached (hundreds of adds share a millisecond at high rates), so a
run of them is linked by one ``Bucket.add_all``; and a finest-level bucket that comes
due is expired whole rather than re-added task by task.
"""

from __future__ import annotations

from collections.abc import Iterable
from heapq import heappop

from minibroker.broker.purgatory.bucket import Bucket, TimerTask
from minibroker.broker.purgatory.wheel import TimingWheel


class TimerEngine:
    __slots__ = ("_cache_bucket", "_cache_exp", "counter", "due", "queue", "wheel")

    def __init__(self, tick_ms: int, wheel_size: int, start_ms: int) -> None:
        self.counter = [0]
        self.queue: list[tuple[int, Bucket]] = []
        self.wheel = TimingWheel(tick_ms, wheel_size, start_ms, self.counter, self.queue)
        self.due: list[TimerTask] = []
        self._cache_exp = None  # matches no deadline (they may be negative)
        self._cache_bucket: Bucket | None = None

    @property
    def size(self) -> int:
        return self.counter[0]

    def add(self, task: TimerTask) -> None:
        """Kafka's addTimerTaskEntry for one task."""
        self.add_all((task,))

    def add_all(self, tasks: Iterable[TimerTask]) -> None:
        """Kafka's addTimerTaskEntry for each task, in order: link it, or if it is already
        due put it in ``due``; a done task is dropped."""
        cache_exp = self._cache_exp
        bucket = self._cache_bucket
        run: list[TimerTask] = []  # tasks for the cached bucket, linked in one call
        append = run.append
        place = self.wheel.add
        for task in tasks:
            if task.expiration_ms == cache_exp:
                # Same deadline as the task before, and the wheel has not moved since:
                # same bucket, already queued for this rotation.
                if not task.done:
                    append(task)
                continue
            if run:
                bucket.link_all(run)
                run = []
                append = run.append
            placed = place(task)
            if placed is not None:
                cache_exp = task.expiration_ms
                bucket = placed
            elif not task.done:
                task.timer = None  # it has left the timer
                self.due.append(task)
        if run:
            bucket.link_all(run)
        self._cache_exp = cache_exp
        self._cache_bucket = bucket

    def take_due(self) -> list[TimerTask]:
        due = self.due
        self.due = []
        return due

    def next_expiration(self) -> int | None:
        queue = self.queue
        return queue[0][0] if queue else None

    def advance(self, now_ms: int) -> None:
        """Kafka's advanceClock: move through every bucket due at ``now_ms``."""
        queue = self.queue
        while queue and queue[0][0] <= now_ms:
            exp, bucket = heappop(queue)
            # The wheel moves: the cached bucket may start a new rotation, so forget it.
            self._cache_exp = None
            self.wheel.advance_clock(exp)
            if bucket.whole:
                # Every task of a due finest-level bucket is due: no need to re-add each.
                bucket.flush(self._expire_all)
            else:
                bucket.flush(self.add_all)

    def _expire_all(self, tasks: list[TimerTask]) -> None:
        append = self.due.append
        for task in tasks:
            if not task.done:
                task.timer = None  # it has left the timer
                append(task)
