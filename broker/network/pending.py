"""A response that is not ready yet: what a handler returns when it parks a request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio


class PendingResponse:
    """Set exactly once, on the trio thread, by a delayed operation's on_complete.

    The connection that parked the request answers it from a done callback, in the same
    turn as the completion: no task per parked request (thousands of long polls expiring
    in one timer tick would otherwise be thousands of task switches before any answer
    leaves). ``wait`` remains for code that awaits an answer itself.
    """

    __slots__ = ("_callback", "_event", "body", "max_bytes")

    def __init__(self, max_bytes: int = 0) -> None:
        self._event: trio.Event | None = None
        self._callback: Callable[[dict], None] | None = None
        self.body: dict | None = None
        # The most bytes of records the answer may carry: the connection charges it to its
        # send budget while the request is parked (broker/network/outbox.py).
        self.max_bytes = max_bytes

    def set(self, body: dict) -> None:
        self.body = body
        if self._event is not None:
            self._event.set()
        if self._callback is not None:
            self._callback(body)

    def add_done_callback(self, callback: Callable[[dict], None]) -> None:
        """Call ``callback(body)`` when set (now if it is); one callback per response."""
        if self.body is not None:
            callback(self.body)
        else:
            self._callback = callback

    async def wait(self) -> dict:
        if self.body is None:
            if self._event is None:
                self._event = trio.Event()
            await self._event.wait()
        assert self.body is not None
        return self.body


def then(result: Any, translate: Callable[[dict], dict]) -> Any:
    """``translate`` a handler's answer now, or when its parked request completes."""
    if isinstance(result, PendingResponse):
        out = PendingResponse(result.max_bytes)
        result.add_done_callback(lambda body: out.set(translate(body)))
        return out
    if result is None:
        return None
    return translate(result)
