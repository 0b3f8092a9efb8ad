"""Answers given later than their request is handled: held for the metadata catch-up,
or held back on purpose (faults delay-api and delay-request). Each is a PendingResponse the connection
answers when it is set, so the network layer treats them like any parked request."""

from __future__ import annotations

from collections.abc import Callable

import trio

from minibroker.broker.common.tasks import Spawner
from minibroker.broker.network.pending import PendingResponse

# A client request held for the metadata catch-up waits at most this long, then is
# answered from what the broker knows: below a client's default request timeout.
CATCH_UP_WAIT_S = 25

Answer = dict | PendingResponse


async def _relay(result: Answer, pending: PendingResponse) -> None:
    pending.set(await result.wait() if isinstance(result, PendingResponse) else result)


class RequestDeferral:
    """Holds requests until ``caught_up`` is set, and answers late on purpose."""

    def __init__(self, tasks: Spawner, caught_up: trio.Event) -> None:
        self.tasks = tasks
        self.caught_up = caught_up

    def after_catch_up(self, handle: Callable[[], Answer]) -> PendingResponse:
        """Run ``handle`` once the metadata has caught up (or after CATCH_UP_WAIT_S, when it
        answers from whatever this broker knows, as a client's own timeout is near)."""
        pending = PendingResponse()

        async def later() -> None:
            with trio.move_on_after(CATCH_UP_WAIT_S):
                await self.caught_up.wait()
            await _relay(handle(), pending)

        self.tasks.start_soon(later)
        return pending

    def handled_after(self, delay_ms: int, handle: Callable[[], Answer]) -> PendingResponse:
        """Handle a request only ``delay_ms`` from now (fault delay-request): it is judged
        against the state then, as one that spent that long on a slow link. (Never for a
        request that gets no answer: nothing would ever set this one.)"""
        pending = PendingResponse()

        async def later() -> None:
            await trio.sleep(delay_ms / 1000)
            await _relay(handle(), pending)

        self.tasks.start_soon(later)
        return pending

    def delayed(self, delay_ms: int, result: Answer | None) -> PendingResponse | None:
        """Hold a response back for ``delay_ms`` (fault delay-api)."""
        if result is None:
            return None
        pending = PendingResponse()

        async def later() -> None:
            await trio.sleep(delay_ms / 1000)
            await _relay(result, pending)

        self.tasks.start_soon(later)
        return pending
