"""Waiting on a condition with a generous bound, from plain (non-trio) tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(check: Callable[[], Any], timeout: float, what: str, poll: float = 0.1) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
