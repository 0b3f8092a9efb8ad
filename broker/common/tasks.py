"""Background tasks for objects built before the broker runs.

The broker builds every collaborator in its constructor (nothing is filled in later),
but a trio nursery exists only inside ``trio.run``. An object that starts tasks (a
replica fetcher, an ISR proposal, a forwarded CreateTopics) takes a ``Spawner``;
the broker hands it a ``BackgroundTasks`` and runs that first thing in ``run``. A test
may hand it a plain nursery instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio


class Spawner(Protocol):
    """What a trio nursery offers and our objects use: start a task, do not wait for it."""

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None: ...


class NotRunningError(RuntimeError):
    """A task was started before ``BackgroundTasks.run`` (or after it ended)."""


class BackgroundTasks:
    """One nursery for the broker's background tasks, open while ``run`` runs."""

    __slots__ = ("_nursery",)

    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        """Open the nursery and keep it open until cancelled (the broker's shutdown)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        if self._nursery is None:
            raise NotRunningError(f"cannot start {fn.__qualname__}: the broker is not running")
        self._nursery.start_soon(fn, *args)
