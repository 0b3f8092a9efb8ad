"""DelayedOperation: a timer task that completes exactly once, by condition or timeout."""

from __future__ import annotations

from minibroker.broker.purgatory.bucket import TimerTask

# The one-shot claim: each op gets an iterator over range(1, 2); ``next(it, 0)`` is a single
# C call, hence atomic under the GIL: it returns 1 once, then 0. A range iterator, unlike a
# tuple iterator, a list or a lock, is not tracked by the cyclic GC: one tracked allocation
# per op instead of two halves the young collections a high request rate causes.
_CLAIM = range(1, 2)


class DelayedOperation(TimerTask):
    """Subclasses supply ``try_complete``, ``on_complete`` and ``on_expiration``.

    Completion is a one-shot claim (``next(_claim, 0)``, one C call, atomic under the GIL), so
    whatever races (a trigger, the expiry path, a completer thread) exactly one caller
    wins, without a lock per operation. ``force_complete`` is that claim, and the only
    one: ``Purgatory.expire_batch`` calls it too. Override the three hooks below, not it.
    """

    __slots__ = ("_claim", "is_completed", "owner")

    def __init__(self, delay_ms: int) -> None:
        # TimerTask's fields set here rather than by calling its __init__: one Python call
        # less per operation (hundreds of thousands a second). Keep in step with it.
        self.delay_ms = delay_ms
        self.expiration_ms = -1
        self._bucket = self.timer = self.sink = None
        self.done = False
        # Read freely (a plain slot: purges read it per watcher entry); written here only.
        self.is_completed = False
        self._claim = iter(_CLAIM)
        # The Purgatory watching it (it sets this): told of the completion or cancel.
        self.owner = None

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
        self.is_completed = self.done = True
        timer = self.timer
        if timer is not None:  # O(1): leave the timer at once
            self.timer = None
            timer.remove(self)
        owner = self.owner
        if owner is not None:
            owner.count_completion()
        self.on_complete()
        return True

    def run(self) -> None:
        """The timeout path: onComplete, then onExpiration (Kafka's order)."""
        if self.force_complete():
            self.on_expiration()

    def cancel(self) -> None:
        """Leave the timer without completing (cancel_for_key). Call from the owner thread."""
        if self.is_completed:
            return
        owner = self.owner
        if owner is not None:
            self.owner = None
            owner.count_cancel()
        TimerTask.cancel(self)
