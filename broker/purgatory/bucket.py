"""Timer tasks and the buckets that hold them: a circular doubly linked list.

A task carries its own link cells (``_prev``/``_next``/``_bucket``), so it is its own
timer entry: linking and unlinking are O(1) with no entry object, and cancelling needs
no search. Only the thread that owns the wheel touches these links.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator


class TimerTask:
    """Something to run once ``delay_ms`` after it is added to a timer, unless cancelled."""

    __slots__ = (
        "_bucket",
        "_done",
        "_next",
        "_prev",
        "_sink",
        "_timer",
        "delay_ms",
        "expiration_ms",
    )

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms
        self.expiration_ms = -1
        self._prev: TimerTask | Bucket | None = None
        self._next: TimerTask | Bucket | None = None
        self._bucket: Bucket | None = None
        # The timer that may still hold this task; None once expired or cancelled.
        self._timer = None
        # Where the timer hands this task when it expires (None: the timer's default).
        self._sink: Callable[[list], None] | None = None
        # True once the task must never be handed to expiry (cancelled, run, completed).
        self._done = False

    def run(self) -> None:
        """Called once on expiry (on the timer's expiry path)."""

    def cancel(self) -> None:
        """Take the task out of its timer; it will not run. Call from the owner thread."""
        self._done = True
        timer = self._timer
        if timer is not None:
            self._timer = None
            timer._cancel(self)

    @property
    def cancelled(self) -> bool:
        return self._done


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
        if task._bucket is not None:  # re-adding moves a task, never duplicates it
            task._bucket.remove(task)
        tail = self._prev
        task._prev = tail
        task._next = self
        tail._next = task
        self._prev = task
        task._bucket = self
        self.counter[0] += 1

    def remove(self, task: TimerTask) -> None:
        if task._bucket is not self:
            return
        prev = task._prev
        nxt = task._next
        prev._next = nxt
        nxt._prev = prev
        task._prev = task._next = task._bucket = None
        self.counter[0] -= 1

    def drain(self) -> list[TimerTask]:
        """Unlink every task and return them in insertion order; reset the expiration."""
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
        return out

    def flush(self, f: Callable[[TimerTask], object]) -> None:
        """Kafka's flush: remove every task, apply ``f`` to each."""
        for task in self.drain():
            f(task)

    def __iter__(self) -> Iterator[TimerTask]:
        node = self._next
        while node is not self:
            nxt = node._next
            if not node._done:
                yield node
            node = nxt

    def __len__(self) -> int:
        return sum(1 for _ in self)
