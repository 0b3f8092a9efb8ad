"""DelayedOperation: a timer task that completes exactly once, by condition or timeout."""

from __future__ import annotations

import itertools

from .bucket import TimerTask

# The one-shot claim: each op gets an iterator over range(1, 2); ``next(it, 0)`` is a single
# C call, hence atomic under the GIL: it returns 1 once, then 0. A range iterator, unlike a
# tuple iterator, a list or a lock, is not tracked by the cyclic GC: one tracked allocation
# per op instead of two halves the young collections a high request rate causes.
_CLAIM = range(1, 2)


class DelayedOperation(TimerTask):
    """Subclasses supply ``try_complete``, ``on_complete`` and ``on_expiration``.

    Completion is a one-shot claim (``next(_claim, 0)``, one C call, atomic under the GIL), so
    whatever races (a trigger, the expiry path, a completer thread) exactly one caller
    wins, without a lock per operation. ``Purgatory.expire_batch`` makes the same claim
    inline, so ``force_complete`` is not a hook: override the three methods below.
    """

    __slots__ = ("_claim", "_completed", "_owner")

    def __init__(self, delay_ms: int) -> None:
        # Fields set here rather than via TimerTask.__init__: one call less per operation.
        # _prev/_next are written before they are ever read (when the timer links it).
        self.delay_ms = delay_ms
        self.expiration_ms = -1
        self._bucket = self._timer = self._sink = self._owner = None
        self._done = self._completed = False
        self._claim = iter(_CLAIM)
        # _owner: the Purgatory watching it, which counts its completion.

    # --- subclass hooks ---------------------------------------------------------------

    def try_complete(self) -> bool:
        """Check the condition; if met, ``return self.force_complete()``."""
        return False

    def on_complete(self) -> None:
        """Runs exactly once, on completion or timeout. Drop heavy references here:
        the op may linger on other keys' watch lists until a purge (KAFKA-19389)."""

    def on_expiration(self) -> None:
        """Runs after ``on_complete`` when the completion was a timeout."""

    # --- machinery --------------------------------------------------------------------

    def force_complete(self) -> bool:
        """Complete now; True only for the one caller that did it. Safe from any thread."""
        if not next(self._claim, 0):
            return False  # someone else completed it (or is completing it)
        self._completed = self._done = True
        timer = self._timer
        if timer is not None:  # O(1): leave the timer at once
            self._timer = None
            timer._cancel(self)
        owner = self._owner
        if owner is not None:
            next(owner._finished)
        self.on_complete()
        return True

    @property
    def is_completed(self) -> bool:
        return self._completed

    def run(self) -> None:
        """The timeout path: onComplete, then onExpiration (Kafka's order)."""
        if self.force_complete():
            self.on_expiration()

    def cancel(self) -> None:
        """Leave the timer without completing (cancel_for_key). Call from the owner thread."""
        if self._completed:
            return
        owner = self._owner
        if owner is not None:
            self._owner = None
            owner._cancelled += 1
        super().cancel()


def counter_value(counter: itertools.count) -> int:
    """Read an itertools.count without advancing it (stats only, not the hot path)."""
    return int(repr(counter)[6:-1])
