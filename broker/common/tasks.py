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
    """A task was started before ``BackgroundTasks.run`` (a wiring bug)."""


class BackgroundTasks:
    """One nursery for the broker's background tasks, open while ``run`` runs."""

    __slots__ = ("_nursery", "_shut_down")

    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None
        self._shut_down = False

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        """Open the nursery and keep it open until cancelled (the broker's shutdown)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                try:
                    await trio.sleep_forever()
                finally:
                    self._shut_down = True
        finally:
            self._nursery = None
            self._shut_down = True

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start ``fn`` in the nursery; once the broker's shutdown began, do nothing.

        A collaborator may still start one then: cancellation reaches a task only at its
        next checkpoint, and the metadata publisher, back from a thread, follows a new
        leader before it gets there. The nursery is closing (trio: "closed to new
        arrivals"), the task would be cancelled at once: it is dropped, not raised into
        the publisher, which crashed the shutdown (issue 35: no clean-shutdown marker)."""
        if self._shut_down:
            return
        if self._nursery is None:
            raise NotRunningError(f"cannot start {fn.__qualname__}: the broker is not running")
        self._nursery.start_soon(fn, *args)
