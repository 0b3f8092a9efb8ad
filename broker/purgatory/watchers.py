"""The operations watched on one key (Kafka's Watchers)."""

from __future__ import annotations

from minibroker.broker.purgatory.operation import DelayedOperation


class Watchers(list):
    """A plain list of ops: watching is ``append`` (one C call on the hot path), and a
    completed op stays until a trigger on this key or a purge drops it.

    Only the purgatory's owner thread touches it, so there is no lock.
    """

    __slots__ = ()

    watch = list.append

    def try_complete_watched(self) -> int:
        """Try to complete every live op; keep the rest (and ops watched meanwhile)."""
        completed = 0
        survivors = []
        n = len(self)
        for op in self[:n]:
            if op.is_completed:
                continue
            if op.try_complete():
                completed += 1
            else:
                survivors.append(op)
        # Ops appended while the callbacks ran (a re-entrant watch) stay after them.
        self[:n] = survivors
        return completed

    def cancel(self) -> list[DelayedOperation]:
        """Cancel every live op (it leaves the timer uncompleted); return them."""
        cancelled = [op for op in self if not op.is_completed]
        for op in cancelled:
            op.cancel()
        return cancelled
