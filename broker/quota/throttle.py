"""Throttled connections (Kafka's ThrottledChannel, KIP-219): the answer goes out at once
with ``throttle_time_ms``, and the connection is not read again until that time passes.

The end of a throttle is a task on the broker's one shared timer (the purgatory's wheel),
not a thread or trio task per throttle: ten thousand throttled connections are ten
thousand timer entries, expired in batches and handed to the trio loop like any
expired delayed operation. The network layer mutes and unmutes
(``ConnectionSession.throttle_hook``); this module only decides when.
"""

from __future__ import annotations

from collections.abc import Callable

from minibroker.broker.common.histogram import Histogram
from minibroker.broker.network.session import ConnectionSession
from minibroker.broker.purgatory import Timer, TimerTask

# Throttles end on this grid (ms): those ending within one step of each other end in one
# timer wake-up and one hand-off to the loop, instead of one each per millisecond. With
# 10,000 throttled connections a 1 ms grid woke the timer thread ~1,000 times a second
# (bench quotas: 8.7 % of a core against 6.x % here). A throttle ends at most this much
# later than its throttle_time_ms, which the unmute lateness includes.
UNMUTE_GRID_MS = 5


class _Unmute(TimerTask):
    __slots__ = ("ends_ms", "session")

    def __init__(self, delay_ms: int, session: ConnectionSession, ends_ms: int) -> None:
        TimerTask.__init__(self, delay_ms)
        self.session = session
        self.ends_ms = ends_ms  # when the throttle itself ends (lateness counts from here)


class ChannelThrottler:
    """Mutes a connection for a throttle time; the shared timer ends it."""

    def __init__(self, timer: Timer) -> None:
        self.timer = timer
        self._handoff: Callable[[list], None] = self.expire_batch
        self._sink = self._deliver  # one object: the timer groups expired tasks by sink
        self.active = 0  # throttles not ended yet
        self.throttled = 0  # throttles started, ever
        # From the end of a throttle to the connection read again: how late the timer is.
        self.unmute_lateness = Histogram()

    def set_expiry_handoff(self, handoff: Callable[[list], None]) -> None:
        """The broker hands expired throttles to the trio loop (as a purgatory's)."""
        self._handoff = handoff

    def _deliver(self, batch: list) -> None:
        self._handoff(batch)

    def throttle(self, session: ConnectionSession, throttle_ms: int) -> None:
        """Mute ``session``'s connection for ``throttle_ms`` (on the owner thread)."""
        hook = session.throttle_hook
        if throttle_ms <= 0 or hook is None or session.closed:
            return
        now = self.timer.clock.now_ms()
        ends = now + throttle_ms
        late = -ends % UNMUTE_GRID_MS
        task = _Unmute(throttle_ms + late, session, ends)
        task.sink = self._sink
        hook(True)
        self.active += 1
        self.throttled += 1
        self.timer.add(task)

    def expire_batch(self, batch: list[_Unmute]) -> None:
        """Unmute each (trio thread): the throttle is over."""
        now_ms = self.timer.clock.now_ms()
        lateness = self.unmute_lateness
        for task in batch:
            task.done = True
            self.active -= 1
            late_ms = now_ms - task.ends_ms
            lateness.observe(late_ms / 1000 if late_ms > 0 else 0.0)
            hook = task.session.throttle_hook
            if hook is not None:
                hook(False)

    def stats(self) -> dict:
        return {
            "active": self.active,
            "throttled": self.throttled,
            "unmute_lateness": self.unmute_lateness.summary(),
        }
