"""Answers given later than their request is handled: held for the metadata catch-up,
or held back on purpose (faults delay-api and delay-request). Each is a PendingResponse the connection
answers when it is set, so the network layer treats them like any parked request."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

import structlog
import trio

from minibroker.broker.common.tasks import Spawner
from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol import error_body
from minibroker.protocol.errors import ErrorCode

# A client request held for the metadata catch-up waits at most this long, then is
# answered from what the broker knows: below a client's default request timeout.
CATCH_UP_WAIT_S = 25

# A produce naming a topic this broker has not applied yet waits at most this long for a
# metadata update that brings it (see RequestDeferral.after_topics_known).
UNKNOWN_TOPIC_WAIT_S = 0.1

Answer = dict | PendingResponse


def _forward(result: Answer, pending: PendingResponse) -> None:
    """Answer ``pending`` with ``result``: now, or when that parked request completes."""
    if isinstance(result, PendingResponse):
        result.add_done_callback(pending.set)
    else:
        pending.set(result)


class RequestDeferral:
    """Holds requests until ``caught_up`` is set, and answers late on purpose."""

    def __init__(
        self,
        tasks: Spawner,
        caught_up: trio.Event,
        metadata_updated: trio.lowlevel.ParkingLot | None = None,
        log: Any = None,
    ) -> None:
        self.tasks = tasks
        self.caught_up = caught_up
        self.log = log or structlog.get_logger()
        # Unparked at each metadata update (MetadataCache.updated).
        self.metadata_updated = metadata_updated or trio.lowlevel.ParkingLot()
        self._held: dict[Hashable, deque] = {}  # after_topics_known's queues, by key

    def after_catch_up(self, handle: Callable[[], Answer]) -> PendingResponse:
        """Run ``handle`` once the metadata has caught up (or after CATCH_UP_WAIT_S, when it
        answers from whatever this broker knows, as a client's own timeout is near)."""
        pending = PendingResponse()

        async def later() -> None:
            with trio.move_on_after(CATCH_UP_WAIT_S):
                await self.caught_up.wait()
            _forward(self._handled(handle), pending)

        self.tasks.start_soon(later)
        return pending

    def after_topics_known(
        self,
        key: Hashable,
        known: Callable[[], bool],
        handle: Callable[[], Answer | None],
        *,
        answered: bool = True,
    ) -> PendingResponse | None:
        """Run ``handle`` once ``known()`` holds, looked at after each metadata update, or
        after UNKNOWN_TOPIC_WAIT_S, answered from what the broker knows then (None for a
        request that gets no answer, ``answered`` False).

        For a produce that names a topic the cluster has just created: the client learned
        of it from a broker that has applied the topic, and the one it asks has not, a
        few ms behind. Answered at once, UNKNOWN_TOPIC_OR_PARTITION cost the client its
        retry backoff (librdkafka: 100 ms), on about one new topic in ten on a busy
        machine. A topic that does not exist is refused that much later.

        Held requests of one ``key`` (a connection) run in arrival order, one task each
        key: a later one never overtakes an earlier one, as a producer's ordering and its
        idempotent sequences need. ``holding(key)``: hold the next one too.
        """
        pending = PendingResponse() if answered else None
        queue = self._held.get(key)
        if queue is None:
            queue = self._held[key] = deque()
            self.tasks.start_soon(self._release_held, key, queue)
        queue.append((trio.current_time() + UNKNOWN_TOPIC_WAIT_S, known, handle, pending))
        return pending

    def holding(self, key: Hashable) -> bool:
        return key in self._held

    async def _release_held(self, key: Hashable, queue: deque) -> None:
        try:
            while queue:
                deadline, known, handle, pending = queue[0]
                with trio.move_on_at(deadline):
                    while not known():
                        await self.metadata_updated.park()
                queue.popleft()
                result = self._handled(handle)
                if pending is not None:
                    _forward(result, pending)
        finally:
            del self._held[key]

    def handled_after(self, delay_ms: int, handle: Callable[[], Answer]) -> PendingResponse:
        """Handle a request only ``delay_ms`` from now (fault delay-request): it is judged
        against the state then, as one that spent that long on a slow link. (Never for a
        request that gets no answer: nothing would ever set this one.)"""
        pending = PendingResponse()

        async def later() -> None:
            await trio.sleep(delay_ms / 1000)
            _forward(self._handled(handle), pending)

        self.tasks.start_soon(later)
        return pending

    def delayed(self, delay_ms: int, result: Answer | None) -> PendingResponse | None:
        """Hold a response back for ``delay_ms`` (fault delay-api)."""
        if result is None:
            return None
        pending = PendingResponse()

        async def later() -> None:
            await trio.sleep(delay_ms / 1000)
            _forward(result, pending)

        self.tasks.start_soon(later)
        return pending

    def _handled(self, handle: Callable[[], Answer | None]) -> Answer | None:
        """``handle()``, or UNKNOWN_SERVER_ERROR if it raised: a held request fails as one
        handled at once does (the socket server's rule), and never takes the broker's
        background tasks down with it."""
        try:
            return handle()
        except Exception as exc:
            self.log.exception("deferred_request_failed")
            return error_body(ErrorCode.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
