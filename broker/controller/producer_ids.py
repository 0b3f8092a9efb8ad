"""InitProducerId for idempotent producers: ids from blocks the controller hands out.

Kafka's RPCProducerIdManager (KIP-730): the broker asks the active controller for a block
of ids (AllocateProducerIds), which records it in the metadata log before answering, and
serves InitProducerId from the block until it runs out. A block is never reused: a broker
that restarts asks for a new one, so ids are unique across restarts and controller
failover (some ids go unused, as in Kafka).

An InitProducerId without a transactional id always gets a new id at epoch 0 (Kafka does
the same for a null transactional.id; the client bumps the epoch itself, KIP-360); one with
a transactional id is the transaction coordinator's, which takes its new ids from here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from minibroker.broker.common.tasks import Spawner
from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol.errors import ErrorCode

Allocate = Callable[[], Awaitable[dict]]


class ProducerIdManager:
    def __init__(self, allocate: Allocate, tasks: Spawner, logger: Any) -> None:
        self.allocate = allocate
        self.tasks = tasks
        self.log = logger
        self.next_id = 0
        self.end_id = 0  # exclusive: the block is [next_id, end_id)
        self._waiting: list[PendingResponse] = []
        self._fetching = False

    def prefetch(self) -> None:
        """Ask for a block before the first producer does (at start, once caught up), so
        InitProducerId needs no controller round trip, nor a controller, then."""
        if self.next_id >= self.end_id:
            self._start_fetch()

    def _start_fetch(self) -> None:
        if not self._fetching:
            self._fetching = True
            self.tasks.start_soon(self._fetch_block)

    def init_producer_id(self, body: dict) -> dict | PendingResponse:
        if self.next_id < self.end_id:
            return self._grant()
        pending = PendingResponse()
        self._waiting.append(pending)
        self._start_fetch()
        return pending

    def _grant(self) -> dict:
        producer_id = self.next_id
        self.next_id += 1
        return {"error_code": 0, "producer_id": producer_id, "producer_epoch": 0}

    async def _fetch_block(self) -> None:
        """One AllocateProducerIds for everyone waiting; a failure answers them all."""
        try:
            answer = await self.allocate()
        finally:
            self._fetching = False
        waiting, self._waiting = self._waiting, []
        if answer.get("error_code", 0) != 0:
            self.log.warning("producer_id_block_failed", error=answer.get("error_message"))
            for pending in waiting:
                # COORDINATOR_NOT_AVAILABLE in Kafka; ours is retriable the same way.
                pending.set(
                    _error(
                        ErrorCode.NOT_CONTROLLER,
                        f"no producer id block from the controller: {answer.get('error_message')}",
                    )
                )
            return
        self.next_id = answer["producer_id_start"]
        self.end_id = self.next_id + answer["producer_id_len"]
        self.log.info("producer_id_block", start=self.next_id, end=self.end_id)
        for pending in waiting:
            if self.next_id < self.end_id:
                pending.set(self._grant())
            else:  # more waiters than ids: ask again for the rest
                self._waiting.append(pending)
        if self._waiting:
            self._start_fetch()


def _error(code: ErrorCode, message: str) -> dict:
    return {
        "error_code": int(code),
        "producer_id": -1,
        "producer_epoch": -1,
        "error_message": message,
    }
