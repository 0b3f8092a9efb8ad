"""The Kafka listener's rules for native answers that may come later."""

from __future__ import annotations

from typing import Any

import trio

from minibroker.broker.common.tasks import BackgroundTasks
from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol.errors import ErrorCode


def failed(body: dict) -> int:
    """A top-level native error (a bare error body: fault injected, refused) or 0."""
    return body.get("error_code", 0) if "topics" not in body else 0


def within(result: Any, timeout_ms: int, tasks: BackgroundTasks, what: str, check: str) -> Any:
    """The native answer if it comes within ``timeout_ms``, else REQUEST_TIMED_OUT saying
    ``what`` did not complete and to ``check`` before retrying: Kafka's request deadline
    for admin APIs (a controller change still under way may yet commit, as in Kafka,
    where the deadline ends the wait, not the change)."""
    if not isinstance(result, PendingResponse):
        return result
    out = PendingResponse(result.max_bytes)

    def settle(body: dict) -> None:
        if out.body is None:  # the first of the answer and the deadline wins
            out.set(body)

    result.add_done_callback(settle)

    async def deadline() -> None:
        with trio.move_on_after(max(timeout_ms, 0) / 1000):
            await out.wait()
        settle(
            {
                "error_code": int(ErrorCode.REQUEST_TIMED_OUT),
                "error_message": f"{what} did not complete within {timeout_ms} ms; "
                f"it may still complete: {check} before retrying",
            }
        )

    tasks.start_soon(deadline)
    return out
