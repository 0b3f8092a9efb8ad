"""The coordinator's answers, and ``chain``: a step on an answer that may come later."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol.errors import ErrorCode


def error_only(code: ErrorCode, message: str | None = None) -> dict:
    return {"error_code": int(code), "error_message": message, "throttle_time_ms": 0}


def init_answer(code: ErrorCode, producer_id: int = -1, epoch: int = -1, message=None) -> dict:
    return {
        "error_code": int(code),
        "producer_id": producer_id,
        "producer_epoch": epoch,
        "error_message": message,
    }


def chain(result: Any, step: Callable[[Any], Any]) -> Any:
    """``step`` on an answer now or when it comes; ``step`` may itself park (a new producer
    id from the controller, then a write to the log)."""
    if not isinstance(result, PendingResponse):
        return step(result)
    out = PendingResponse()

    def forward(body: Any) -> None:
        following = step(body)
        if isinstance(following, PendingResponse):
            following.add_done_callback(out.set)
        else:
            out.set(following)

    result.add_done_callback(forward)
    return out
