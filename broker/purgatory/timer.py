"""What the purgatory needs of a timer (Kafka's Timer trait).

SystemTimer (a thread on the real or a manual clock) and ManualTimer (driven inline by
a test's clock, Kafka's MockTimer) both satisfy it; nothing checks which one it has.
"""

from __future__ import annotations

from typing import Protocol

from minibroker.broker.common.clock import Clock
from minibroker.broker.purgatory.bucket import TimerTask


class Timer(Protocol):
    clock: Clock  # what expiration_ms is measured on (expiry lateness reads it)

    def add(self, task: TimerTask) -> None:
        """Schedule ``task`` to expire ``task.delay_ms`` from now (each task once)."""

    def remove(self, task: TimerTask) -> None:
        """Take ``task`` out early, O(1) (TimerTask.cancel and force_complete call it; a
        SystemTimer takes it from any thread, a ManualTimer in its own)."""

    def advance(self, timeout_ms: int) -> bool:
        """Kafka's advanceClock: run what is due within ``timeout_ms``; True if any ran."""

    @property
    def size(self) -> int:
        """Tasks waiting in the timer."""

    def shutdown(self) -> None:
        """Stop; pending tasks are not run."""
