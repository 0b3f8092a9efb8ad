"""A timer for tests: the same wheel, driven inline by a ManualClock (Kafka's MockTimer)."""

from __future__ import annotations

from .bucket import TimerTask
from .clock import ManualClock
from .delivery import ExpireBatch, deliver, run_inline
from .engine import TimerEngine


class ManualTimer:
    """Adds, cancels and expiry all happen in the calling thread, at once.

    Moving the clock (``advance`` here or on the clock) runs every task that is due, in
    the thread that moved it. A task added already due runs inline, as in MockTimer.
    """

    def __init__(
        self,
        clock: ManualClock | None = None,
        tick_ms: int = 1,
        wheel_size: int = 20,
        expire_batch: ExpireBatch | None = None,
    ) -> None:
        self.clock = clock or ManualClock()
        self._engine = TimerEngine(tick_ms, wheel_size, self.clock.now_ms())
        self._expire_batch = expire_batch or run_inline
        self.clock.subscribe(self.advance_clock)

    def add(self, task: TimerTask) -> None:
        task.expiration_ms = self.clock.now_ms() + task.delay_ms
        task._timer = self
        if not self._engine.insert(task) and not task._done:
            task._timer = None
            deliver([task], self._expire_batch)

    def _cancel(self, task: TimerTask) -> None:
        self._engine.remove(task)

    @property
    def size(self) -> int:
        return self._engine.counter[0]

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    def advance_clock(self) -> bool:
        """Expire everything due now; True if anything expired."""
        any_expired = False
        while True:
            expired: list[TimerTask] = []
            self._engine.poll_due(self.clock.now_ms(), expired)
            if not expired:
                return any_expired
            any_expired = True
            deliver(expired, self._expire_batch)

    def next_expiration(self) -> int | None:
        return self._engine.next_expiration()

    def close(self) -> None:
        self.clock.unsubscribe(self.advance_clock)
