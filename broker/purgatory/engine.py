"""The single-threaded core shared by both timers: wheel + delay queue of buckets.

Whoever drives it (the timer thread, or a test's ManualTimer) is its only user, so
nothing here locks. Hot-path choices: the bucket for the last expiration is cached
(hundreds of adds share a millisecond at high rates), and a finest-level bucket that
comes due is expired whole rather than re-added task by task.
"""

from __future__ import annotations

from heapq import heappop, heappush

from .bucket import Bucket, TimerTask
from .wheel import TimingWheel


class TimerEngine:
    __slots__ = ("_cache_bucket", "_cache_exp", "counter", "queue", "wheel")

    def __init__(self, tick_ms: int, wheel_size: int, start_ms: int) -> None:
        self.counter = [0]
        self.queue: list[tuple[int, Bucket]] = []
        self.wheel = TimingWheel(tick_ms, wheel_size, start_ms, self.counter, self.queue)
        self._cache_exp = None  # matches no deadline (they may be negative)
        self._cache_bucket: Bucket | None = None

    @property
    def size(self) -> int:
        return self.counter[0]

    def insert(self, task: TimerTask) -> bool:
        """Link the task; False if it is cancelled or already due (the caller expires it)."""
        exp = task.expiration_ms
        if exp == self._cache_exp and not task._done:
            # Same deadline as the previous add and the wheel has not moved since: same
            # bucket, already queued for this rotation. Inline link (Bucket.add).
            bucket = self._cache_bucket
            tail = bucket._prev
            task._prev = tail
            task._next = bucket
            tail._next = task
            bucket._prev = task
            task._bucket = bucket
            self.counter[0] += 1
            return True
        bucket = self.wheel.place(task)
        if bucket is None:
            return False
        self._cache_exp = exp
        self._cache_bucket = bucket
        return True

    def remove(self, task: TimerTask) -> None:
        bucket = task._bucket
        if bucket is not None:
            bucket.remove(task)

    def next_expiration(self) -> int | None:
        queue = self.queue
        return queue[0][0] if queue else None

    def poll_due(self, now_ms: int, expired: list[TimerTask]) -> None:
        """Advance through every bucket due at ``now_ms``; append expired live tasks."""
        queue = self.queue
        wheel = self.wheel
        append = expired.append
        while queue and queue[0][0] <= now_ms:
            exp, bucket = heappop(queue)
            # The wheel moves: cached bucket may start a new rotation, so forget it.
            self._cache_exp = None  # matches no deadline (they may be negative)
            wheel.advance_clock(exp)
            if bucket.whole:
                # Every task in a due finest-level bucket is due: unlink and hand out the
                # live ones in one pass (Bucket.drain fused with the filter).
                node = bucket._next
                unlinked = 0
                while node is not bucket:
                    task = node
                    node = task._next
                    task._prev = task._next = task._bucket = None
                    unlinked += 1
                    if not task._done:
                        task._timer = None
                        append(task)
                bucket._prev = bucket._next = bucket
                bucket.expiration = -1
                self.counter[0] -= unlinked
            else:
                self._cascade(bucket, append)

    def _cascade(self, bucket: Bucket, append) -> None:
        """Re-add every task of a due coarser bucket (Kafka's flush), inlined for level 0.

        Nearly all of them land in the finest wheel, and runs of them share a deadline, so
        the level-0 placement and the link are done here rather than by a call per task.
        """
        wheel = self.wheel
        tick = wheel.tick_ms
        size = wheel.wheel_size
        buckets = wheel.buckets
        due_before = wheel.current_ms + tick
        level0_before = wheel.current_ms + wheel.interval
        queue = self.queue
        cache_exp = None
        target = bucket  # never used before cache_exp is set
        node = bucket._next
        bucket._prev = bucket._next = bucket
        bucket.expiration = -1
        moved = 0
        while node is not bucket:
            task = node
            node = task._next
            if task._done:
                task._prev = task._next = task._bucket = None
                moved -= 1
                continue
            exp = task.expiration_ms
            if exp != cache_exp:
                if exp < due_before:  # due now: hand it out
                    task._prev = task._next = task._bucket = None
                    task._timer = None
                    append(task)
                    moved -= 1
                    continue
                if exp >= level0_before:  # still far off: a coarser wheel takes it
                    task._prev = task._next = task._bucket = None
                    moved -= 1
                    self.insert(task)
                    continue
                vid = exp // tick
                target = buckets[vid % size]
                if target.expiration != vid * tick:
                    target.expiration = vid * tick
                    heappush(queue, (target.expiration, target))
                cache_exp = exp
            tail = target._prev
            task._prev = tail
            task._next = target
            tail._next = task
            target._prev = task
            task._bucket = target
        self.counter[0] += moved
        if cache_exp is not None:
            self._cache_exp = cache_exp
            self._cache_bucket = target
