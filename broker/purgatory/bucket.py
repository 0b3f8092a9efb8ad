"""Timer tasks and the buckets that hold them (Kafka's TimerTask, TimerTaskEntry and
TimerTaskList): a circular doubly linked list whose sentinel is the bucket itself.

A task carries its own link cells (``_prev``/``_next``/``_bucket``), so it is its own
timer entry: linking and unlinking are O(1) with no entry object, and cancelling needs
no search. This module is the only one that touches the link cells, and only the
thread that owns the wheel calls into it.

The timer thread links, unlinks and flushes hundreds of tasks per wake-up, so each of
the three is written once, for many tasks (``Bucket.add_all``, ``unlink_all``,
``Bucket.flush``): a Python call per task would cost more than the work. The one-task
forms (``Bucket.add``, ``TimerTask.unlink``) call them.

The entry half of a task is a small public contract with the timer that holds it:
``expiration_ms`` and ``timer`` are set by ``Timer.add``; ``timer`` goes back to None
when the task leaves (expired, cancelled, completed); ``sink`` names where the timer
hands the task on expiry (None: the timer's default), set before the add; ``done``
turns True once the task must never be handed to expiry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence


class TimerTask:
    """Something to run once ``delay_ms`` after it is added to a timer, unless cancelled."""

    __slots__ = (
        "_bucket",
        "_next",
        "_prev",
        "delay_ms",
        "done",
        "expiration_ms",
        "sink",
        "timer",
    )

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms
        self.expiration_ms = -1
        # _prev/_next are written before they are ever read (when a bucket links it).
        self._bucket: Bucket | None = None
        self.timer = None
        self.sink: Callable[[list], None] | None = None
        self.done = False

    def run(self) -> None:
        """Called once on expiry (on the timer's expiry path)."""

    def cancel(self) -> None:
        """Take the task out of its timer; it will not run. Call from the owner thread."""
        self.done = True
        timer = self.timer
        if timer is not None:
            self.timer = None
            timer.remove(self)

    def unlink(self) -> None:
        """Leave the bucket holding it, if any (Kafka's TimerTaskEntry.remove)."""
        unlink_all((self,))


def unlink_all(tasks: Iterable[TimerTask]) -> None:
    """Take each task out of the bucket holding it; a task in none is left alone."""
    for task in tasks:
        bucket = task._bucket
        if bucket is not None:
            prev = task._prev
            nxt = task._next
            prev._next = nxt
            nxt._prev = prev
            task._prev = task._next = task._bucket = None
            bucket.counter[0] -= 1


class Bucket:
    """One slot of a timing wheel; also the list's sentinel node (``_prev`` is the tail).

    ``counter`` is a one-element list shared by every bucket of a timer: the number of
    linked tasks (Kafka's taskCounter), kept without a lock because one thread owns it.
    """

    __slots__ = ("_next", "_prev", "counter", "expiration", "whole")

    def __init__(self, counter: list[int], whole: bool = False) -> None:
        self._prev: TimerTask | Bucket = self
        self._next: TimerTask | Bucket = self
        self.counter = counter
        self.expiration = -1
        # A finest-level bucket: when it comes due every task in it is due, so it can be
        # expired whole instead of re-adding each task.
        self.whole = whole

    def __lt__(self, other: Bucket) -> bool:
        # heapq compares (expiration, bucket); ties between levels: coarser first.
        return not self.whole and other.whole

    def set_expiration(self, ms: int) -> bool:
        """True only when the value changed: the bucket is then (re)queued once per rotation."""
        if self.expiration == ms:
            return False
        self.expiration = ms
        return True

    def add(self, task: TimerTask) -> None:
        """Link ``task`` at the tail (Kafka's TimerTaskList.add)."""
        self.add_all((task,))

    def add_all(self, tasks: Sequence[TimerTask]) -> None:
        """Link each task at the tail, in order; re-adding moves a task, never duplicates it."""
        for task in tasks:
            if task._bucket is not None:
                task.unlink()
        self.link_all(tasks)

    def link_all(self, tasks: Sequence[TimerTask]) -> None:
        """``add_all`` for tasks in no bucket (the timer's own adds and cascades: a task
        leaves its bucket before it is placed again), without the check."""
        tail = self._prev
        for task in tasks:
            task._prev = tail
            tail._next = task
            tail = task
            task._bucket = self
        tail._next = self
        self._prev = tail
        self.counter[0] += len(tasks)

    def remove(self, task: TimerTask) -> None:
        if task._bucket is self:
            task.unlink()

    def flush(self, f: Callable[[list[TimerTask]], object]) -> None:
        """Kafka's flush: remove every task and reset the expiration, then apply ``f`` to
        them: to the whole list in one call (in order), not to each."""
        out: list[TimerTask] = []
        append = out.append
        node = self._next
        while node is not self:
            nxt = node._next
            node._prev = node._next = node._bucket = None
            append(node)
            node = nxt
        self._prev = self._next = self
        self.counter[0] -= len(out)
        self.expiration = -1
        f(out)
