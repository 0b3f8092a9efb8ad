"""Waiting on a running streaming query's output, bounded, as the suite waits on events."""

from __future__ import annotations

import time
from typing import Any


def wait_until_collected(query: Any, seen: list, count: int, timeout_s: float = 90) -> None:
    """Return once ``seen`` (filled by the query's foreachBatch) holds ``count`` items; a
    query failure fails at once with its cause, and ``timeout_s`` bounds the wait."""
    deadline = time.monotonic() + timeout_s
    while len(seen) < count:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"collected {len(seen)} of {count}: {seen}"
        time.sleep(0.05)
