"""A response that is not ready yet: what a handler returns when it parks a request."""

from __future__ import annotations

import trio


class PendingResponse:
    """Set exactly once, on the trio thread, by a delayed operation's on_complete."""

    __slots__ = ("_event", "body", "max_bytes")

    def __init__(self, max_bytes: int = 0) -> None:
        self._event = trio.Event()
        self.body: dict | None = None
        # The most bytes of records the answer may carry: the connection charges it to its
        # send budget while the request is parked (broker/outbox.py).
        self.max_bytes = max_bytes

    def set(self, body: dict) -> None:
        self.body = body
        self._event.set()

    async def wait(self) -> dict:
        await self._event.wait()
        assert self.body is not None
        return self.body
