"""A nursery owned by a client object, for its background tasks (socket readers, sender).

``async with Producer(...)`` has to open a nursery that outlives ``__aenter__``; this
keeps that one awkward pattern in one place. Closing cancels the tasks: they only
ever serve the object that owns them.
"""

from __future__ import annotations

from typing import Any

import trio


class Background:
    def __init__(self) -> None:
        self._cm: Any = None
        self.nursery: trio.Nursery | None = None

    async def open(self) -> trio.Nursery:
        self._cm = trio.open_nursery()
        self.nursery = await self._cm.__aenter__()
        return self.nursery

    async def close(self, error: BaseException | None = None) -> None:
        """Cancel the background tasks and wait for them; must run in the task that opened."""
        cm, nursery = self._cm, self.nursery
        self._cm = self.nursery = None
        if cm is None:
            return
        nursery.cancel_scope.cancel()
        await cm.__aexit__(
            type(error) if error else None, error, error.__traceback__ if error else None
        )
