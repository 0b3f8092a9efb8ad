"""Monotonic millisecond clocks: the real one, and a manual one tests drive by hand.

Everything in the timer and purgatory reads time through a clock object so that unit
tests never sleep (Kafka's MockTime). Milliseconds are integers and *floored*: a deadline
``d`` is due once ``now_ms() >= d``, and a wait of ``d - now_ms()`` ms never wakes early.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...


class MonotonicClock:
    """Wall-clock jumps must not stall or fire timers (KAFKA-4051), so: monotonic_ns."""

    __slots__ = ()

    def now_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class ManualClock:
    """Time moves only when a test calls ``advance``; timers built on it run due work then.

    Listeners (a ManualTimer, or a SystemTimer's wake-up) are called after every move, in
    the calling thread, so expiry is deterministic.
    """

    __slots__ = ("_listeners", "_now")

    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms
        self._listeners: list[Callable[[], None]] = []

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError("a monotonic clock cannot go back")
        self._now += ms
        for listener in list(self._listeners):
            listener()

    def subscribe(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)
