"""A timer for tests: the same engine, driven inline by a ManualClock (Kafka's MockTimer)."""

from __future__ import annotations

from minibroker.broker.common.clock import ManualClock
from minibroker.broker.purgatory.bucket import TimerTask
from minibroker.broker.purgatory.delivery import ExpireBatch, deliver, run_inline
from minibroker.broker.purgatory.engine import TimerEngine


class ManualTimer:
    """Adds, removes and expiry all happen in the calling thread, at once.

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
        self._ran = False
        self.clock.subscribe(self._run_due)

    def add(self, task: TimerTask) -> None:
        task.expiration_ms = self.clock.now_ms() + task.delay_ms
        task.timer = self
        self._engine.add(task)
        self._run_due()

    def remove(self, task: TimerTask) -> None:
        task.unlink()

    @property
    def size(self) -> int:
        return self._engine.size

    def advance(self, timeout_ms: int) -> bool:
        """Move the clock ``timeout_ms`` on; True if any task expired."""
        self._ran = False
        self.clock.advance(timeout_ms)
        return self._ran

    def next_expiration(self) -> int | None:
        return self._engine.next_expiration()

    def shutdown(self) -> None:
        self.clock.unsubscribe(self._run_due)

    def _run_due(self) -> None:
        """Expire everything due now (called after every move of the clock)."""
        engine = self._engine
        while True:
            engine.advance(self.clock.now_ms())
            expired = engine.take_due()
            if not expired:
                return
            self._ran = True
            deliver(expired, self._expire_batch)
