"""Handing expired tasks to their owners: one call per owner per timer wake-up."""

from __future__ import annotations

import logging
from collections.abc import Callable

from minibroker.broker.purgatory.bucket import TimerTask

log = logging.getLogger(__name__)

ExpireBatch = Callable[[list], None]


def run_inline(batch: list[TimerTask]) -> None:
    """The default expiry path: run each task here, on the timer's thread."""
    for task in batch:
        task.done = True
        try:
            task.run()
        except Exception:
            # One bad task must not stop the timer (and every other timeout with it).
            log.exception("timer task %r failed", task)


def deliver(expired: list[TimerTask], default: ExpireBatch) -> None:
    """Group ``expired`` by each task's sink (None: ``default``) and call each sink once.

    Several purgatories may share one timer; nearly always a wake-up expires tasks of one
    owner only, so that case is a single pass and a single call.
    """
    sink = expired[0].sink
    for task in expired:
        if task.sink is not sink:
            break
    else:
        _call(sink or default, expired)
        return
    groups: dict[ExpireBatch | None, list[TimerTask]] = {}
    for task in expired:
        group = groups.get(task.sink)
        if group is None:
            groups[task.sink] = [task]
        else:
            group.append(task)
    for sink, batch in groups.items():
        _call(sink or default, batch)


def _call(sink: ExpireBatch, batch: list[TimerTask]) -> None:
    try:
        sink(batch)
    except Exception:
        log.exception("expiry hand-off %r failed for %d tasks", sink, len(batch))
