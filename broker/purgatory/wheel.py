"""A hierarchical timing wheel (Kafka's TimingWheel; reference §1 rules, in order).

The wheel never ticks on its own: its clock moves only to the expiration of buckets the
delay queue hands out, so an idle timer costs nothing.
"""

from __future__ import annotations

from heapq import heappush

from minibroker.broker.purgatory.bucket import Bucket, TimerTask


class TimingWheel:
    """``wheel_size`` buckets of ``tick_ms`` each; overflow wheels are made on demand."""

    __slots__ = (
        "buckets",
        "counter",
        "current_ms",
        "interval",
        "level",
        "overflow",
        "queue",
        "tick_ms",
        "wheel_size",
    )

    def __init__(
        self,
        tick_ms: int,
        wheel_size: int,
        start_ms: int,
        counter: list[int] | None = None,
        queue: list | None = None,
        level: int = 0,
    ) -> None:
        if tick_ms < 1 or wheel_size < 2:
            raise ValueError("tick_ms must be >= 1 and wheel_size >= 2")
        self.tick_ms = tick_ms
        self.wheel_size = wheel_size
        self.interval = tick_ms * wheel_size
        self.current_ms = start_ms - start_ms % tick_ms
        self.counter = counter if counter is not None else [0]
        # The delay queue: a heap of (expiration, bucket), shared by every level.
        self.queue = queue if queue is not None else []
        self.level = level
        self.buckets = [Bucket(self.counter, whole=level == 0) for _ in range(wheel_size)]
        # Created lazily; only the owning thread creates it, so no double-checked locking
        # is needed (KAFKA-2112 was a race between threads that we do not have).
        self.overflow: TimingWheel | None = None

    def _add_overflow(self) -> TimingWheel:
        self.overflow = TimingWheel(
            self.interval,
            self.wheel_size,
            self.current_ms,
            self.counter,
            self.queue,
            self.level + 1,
        )
        return self.overflow

    def add(self, task: TimerTask) -> Bucket | None:
        """Kafka's add: link ``task`` into its bucket and return that bucket (Kafka returns
        true); None (Kafka: false) when the task is done or already due."""
        if task.done:
            return None
        exp = task.expiration_ms
        wheel = self
        while True:
            current = wheel.current_ms
            tick = wheel.tick_ms
            if exp < current + tick:
                return None  # already expired
            if exp < current + wheel.interval:
                vid = exp // tick
                bucket = wheel.buckets[vid % wheel.wheel_size]
                bucket.add(task)
                if bucket.set_expiration(vid * tick):
                    # A new rotation for this bucket: queue it (once per rotation).
                    heappush(wheel.queue, (bucket.expiration, bucket))
                return bucket
            wheel = wheel.overflow or wheel._add_overflow()

    def advance_clock(self, time_ms: int) -> None:
        wheel = self
        while wheel is not None and time_ms >= wheel.current_ms + wheel.tick_ms:
            wheel.current_ms = time_ms - time_ms % wheel.tick_ms
            time_ms = wheel.current_ms
            wheel = wheel.overflow
