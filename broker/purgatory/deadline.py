"""Lazy deadlines: operations whose deadline keeps moving later (a group member's session,
pushed back by each heartbeat) without the timer hearing of every move.

Kafka replaces the member's DelayedHeartbeat on each heartbeat (its newer coordinator
runtime cancels and re-schedules a timer task keyed by member): in CPython that is an
operation, a watch, a timer add and a remove per heartbeat, 10-17 µs, a sixth of a core
at 10,000 heartbeats/s (``minibroker bench groups``). Here moving the deadline is one
attribute store (``extend_by``); the operation stays in the timer at its old expiration,
and when that comes due the owner thread looks at the deadline: passed, the operation
expires as any other; moved on, it is re-armed for the rest (one ordinary ``Timer.add``
of a task that has left the timer, so the timer thread never sees a task move under it).
A member heartbeating every ``h`` ms with a session of ``s`` costs one re-arm per
``s - h`` ms instead of one operation per ``h`` ms, and the final expiry still happens
at the real deadline (re-arms are gathered on a coarse grid until the deadline is near:
below).

Only this purgatory pays for the check: produce and fetch expiry is untouched.
"""

from __future__ import annotations

from time import monotonic_ns
from typing import Any

from minibroker.broker.common.clock import MonotonicClock
from minibroker.broker.purgatory.operation import DelayedOperation
from minibroker.broker.purgatory.purgatory import Purgatory

# Re-arms go to instants on this grid while the deadline is further off than that: every
# op re-armed to one instant comes due in one timer wake-up and one hand-off to the owner
# thread, instead of one each per millisecond (10,000 members re-arming at their own
# instants woke both threads ~1,000 times a second). An op whose deadline is nearer than
# the grid is re-armed for the deadline itself, so no expiry is later for it.
REARM_GRID_MS = 100


class DeadlineOperation(DelayedOperation):
    """A delayed operation with a movable deadline (``deadline_ms``, on the timer's clock).

    Until it is first extended the deadline is the timer's expiration (-1: none of its own).
    """

    __slots__ = ("deadline_ms",)

    def __init__(self, delay_ms: int) -> None:
        DelayedOperation.__init__(self, delay_ms)
        self.deadline_ms = -1


class DeadlinePurgatory(Purgatory):
    """A Purgatory of DeadlineOperations: ``extend_by`` moves a deadline, expiry re-arms."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        Purgatory.__init__(self, *args, **kwargs)
        self.rearmed = 0  # ops put back in the timer for a moved deadline (owner thread)
        clock = self.timer.clock
        self._now_ms = clock.now_ms
        # MonotonicClock.now_ms is inlined in extend_by: a Python call per heartbeat less.
        self._monotonic = type(clock) is MonotonicClock

    def extend_by(self, op: DeadlineOperation, delay_ms: int) -> bool:
        """Move ``op``'s deadline to ``delay_ms`` from now (owner thread; every heartbeat).
        False when a store cannot do it: the op is completed, or the new deadline is
        earlier than the timer's expiration (the timer would fire late); the caller then
        replaces the op."""
        if op.is_completed:
            return False
        if self._monotonic:
            deadline = monotonic_ns() // 1_000_000 + delay_ms
        else:
            deadline = self._now_ms() + delay_ms
        if deadline < op.expiration_ms:
            return False
        op.deadline_ms = deadline
        return True

    def expire_batch(self, batch: list[DeadlineOperation]) -> int:
        """Re-arm each op whose deadline moved past the expiration the timer fired at;
        expire the others (Purgatory.expire_batch)."""
        due = []
        rearmed = 0
        now_ms = self._now_ms
        now = now_ms()
        add = self.timer.add
        for op in batch:
            deadline = op.deadline_ms
            if deadline > op.expiration_ms and not op.is_completed:
                # Re-armed for a shared instant on the grid before the deadline, or for
                # the deadline itself once that is nearer than the grid.
                at = deadline - deadline % REARM_GRID_MS
                if at <= now:
                    # For the deadline itself the clock is read again: the timer adds the
                    # delay to its own reading, so a delay from the batch's first one
                    # would land late by however long the batch took to get here (a grid
                    # instant may: it is re-armed again before the deadline).
                    now = now_ms()
                    at = deadline
                if at > now:
                    op.delay_ms = at - now
                    add(op)  # it left the timer when it came due: an ordinary add
                    rearmed += 1
                    continue
                op.expiration_ms = deadline  # its lateness counts from the real deadline
            due.append(op)
        self.rearmed += rearmed
        return Purgatory.expire_batch(self, due) if due else 0

    def stats(self) -> dict:
        return {**Purgatory.stats(self), "rearmed": self.rearmed}
