"""The Kafka listener's one rule for native answers that may come later."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minibroker.broker.network.pending import PendingResponse


def then(result: Any, translate: Callable[[dict], dict]) -> Any:
    """``translate`` the native answer now, or when its parked request completes."""
    if isinstance(result, PendingResponse):
        out = PendingResponse(result.max_bytes)
        result.add_done_callback(lambda body: out.set(translate(body)))
        return out
    if result is None:
        return None
    return translate(result)
