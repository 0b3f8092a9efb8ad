"""The route to a coordinator: find the broker that coordinates a key, ask it, follow it
when it moves.

Kafka has two kinds of coordinator behind one FindCoordinator: a group's (key_type 0)
and a transactional id's (key_type 1). A consumer group member and a transactional
producer both send their requests this way, so the lookup and the "it moved, look
again" retry live here once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import trio

from minibroker.client.cluster import Cluster
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, KafkaError, error_class

GROUP = 0
TRANSACTION = 1

# Find the coordinator again and retry.
COORDINATOR_ERRORS = frozenset(
    {
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    }
)


class CoordinatorRoute:
    """Requests to whichever broker coordinates ``key`` (of ``key_type``) now."""

    def __init__(
        self, cluster: Cluster, key: str, key_type: int, config: Mapping[str, Any]
    ) -> None:
        self.cluster = cluster
        self.config = config
        self.key = key
        self.key_type = key_type
        self.coordinator: int | None = None
        self.backoff = config["retry.backoff.ms"] / 1000

    async def find_coordinator(self) -> int:
        """The broker coordinating the key now (asked again after a coordinator error)."""
        body = {"key": self.key}
        if self.key_type:
            body["key_type"] = self.key_type  # v0 brokers know only groups: asked as before
        while self.coordinator is None:
            answer = await self.cluster.any_request(ApiKey.FIND_COORDINATOR, body)
            code = ErrorCode.parse(answer["error_code"])
            if code is ErrorCode.NONE:
                if answer["node_id"] not in self.cluster.brokers:
                    await self.cluster.refresh(())
                self.coordinator = answer["node_id"]
            elif code.retriable:
                await trio.sleep(self.backoff)
            else:
                raise error_class(code)(answer.get("error_message") or "")
        return self.coordinator

    def _in_version(self, api_key: int, version: int, body: dict) -> dict:
        """``body`` as ``version`` of ``api_key`` has it (a subclass narrows old versions)."""
        return body

    async def call(self, api_key: int, body: dict, timeout: float | None = None) -> dict:
        """A request to the coordinator; coordinator moves and network errors are retried
        (up to ``timeout`` s, default request.timeout.ms) against whichever broker
        coordinates the key now."""
        if timeout is None:
            timeout = self.config["request.timeout.ms"] / 1000
        deadline = time.monotonic() + timeout
        while True:
            try:
                node = await self.find_coordinator()
                version = (await self.cluster.connection(node)).versions.get(api_key, 0)
                answer = await self.cluster.request(
                    node,
                    api_key,
                    self._in_version(api_key, version, body),
                    version=version,
                    timeout=timeout,
                )
            except KafkaError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise
                self.coordinator = None
                await trio.sleep(self.backoff)
                continue
            code = ErrorCode.parse(answer.get("error_code", 0))
            if code in COORDINATOR_ERRORS and time.monotonic() <= deadline:
                self.coordinator = None
                await trio.sleep(self.backoff)
                continue
            return answer
