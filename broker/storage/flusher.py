"""A log's recovery point, and the fsyncs of rolled segments run off the caller's thread.

Kafka's roll does not fsync the segment it seals while holding the log: it schedules
``flushUptoOffsetExclusive(newSegment.baseOffset)`` on its background scheduler, and the
log's ``recoveryPoint`` (every offset below it is on disk) moves up when that flush ends.
After an unclean shutdown only the segments from the checkpointed recovery point on are
validated batch by batch (LogLoader.recoverLog).

Here one worker thread, shared by every log of the process, runs those flushes in the
order they were scheduled. It fsyncs files by name, each on a descriptor of its own, so
a segment that retention or a truncation deletes while its flush waits costs nothing (a
file that is gone needs no durability) and never closes a descriptor under the flush.
The recovery point is advanced on the log's own thread, from the flushes that finished,
oldest first: it never passes a flush still running or one that failed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

from minibroker.broker.common.atomic_file import fsync_path

# One thread: flushes finish in the order they were scheduled, over all logs, and a
# roll's flush never competes with the loop for more than one core's worth of syscalls.
FLUSHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="segment-flush")
_DONE: Future = Future()
_DONE.set_result(None)


def fsync_all(paths: Iterable[Path]) -> None:
    """fsync each file by name; one deleted meanwhile is skipped."""
    for path in paths:
        fsync_path(path, missing_ok=True)


class RecoveryPoint:
    """Every offset below ``get()`` is on disk; flushes in flight move it up when they end.

    Not thread-safe: the log's owner calls every method (the worker only completes
    futures). ``_pending`` holds ``(flush, offset it covers up to)``, oldest first.
    """

    __slots__ = ("_offset", "_pending", "scheduled")

    def __init__(self, offset: int) -> None:
        self._offset = offset
        self._pending: deque[tuple[Future, int]] = deque()
        # Where the flushes scheduled so far reach: the next one starts here.
        self.scheduled = offset

    def schedule(self, paths: Iterable[Path], upto: int) -> None:
        """fsync ``paths`` in the worker; then every offset below ``upto`` is on disk."""
        self._pending.append((FLUSHER.submit(fsync_all, list(paths)), upto))
        self.scheduled = max(self.scheduled, upto)

    def flushed(self, upto: int) -> None:
        """The caller fsynced what is below ``upto`` itself (the active segment): it counts
        once the flushes scheduled before it have ended too."""
        pending = self._pending
        if pending and pending[-1][0] is _DONE:
            pending.pop()  # one entry for a run of synchronous flushes, however many
        pending.append((_DONE, upto))
        self.scheduled = max(self.scheduled, upto)

    def get(self) -> int:
        """The recovery point, after the flushes that have ended. A failed flush raises
        its OSError here, every time: the point never passes data that is not on disk."""
        pending = self._pending
        while pending and pending[0][0].done():
            flush, upto = pending[0]
            flush.result()
            pending.popleft()
            if upto > self._offset:
                self._offset = upto
        return self._offset

    def truncated(self, offset: int) -> None:
        """The log was cut to end at ``offset``: what was flushed above it is gone (Kafka's
        truncateTo lowers the recovery point), and so is what flushes in flight cover."""
        self._offset = min(self._offset, offset)
        self.scheduled = min(self.scheduled, offset)
        self._pending = deque((flush, min(upto, offset)) for flush, upto in self._pending)

    def reset(self, offset: int) -> None:
        """The log restarts empty at ``offset``: nothing below it is left to recover."""
        self.truncated(offset)
        self._offset = self.scheduled = offset

    def wait(self) -> int:
        """Block until every scheduled flush has ended (closing the log); the point."""
        wait([flush for flush, _ in self._pending])
        return self.get()
