"""How brokers of a cluster find and follow the controller, and how it reaches them.

Broker side: register with the controller (retrying until it answers), then
heartbeat; every answer may carry a newer metadata snapshot. Controller side: one
pusher per broker sends the newest snapshot whenever metadata changes, coalescing
bursts and retrying a broker that is paused or down.
"""

from __future__ import annotations

from typing import Any

import trio

from protocol import ApiKey
from protocol.errors import KafkaError

from .cluster_auth import ClusterCredentials
from .metadata import BrokerInfo
from .metadata_check import MetadataError
from .peer import PeerConnection, log_peer_failure


class VotersError(ValueError):
    pass


def parse_voters(text: str) -> dict[int, tuple[str, int]]:
    """``"0@127.0.0.1:9092,1@127.0.0.1:9093"`` -> ``{0: ("127.0.0.1", 9092), ...}`` (Kafka's format)."""
    voters: dict[int, tuple[str, int]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        node, at, address = item.partition("@")
        host, colon, port = address.rpartition(":")
        if not at or not colon or not node.isdigit() or not port.isdigit():
            raise VotersError(f"controller.quorum.voters: expected id@host:port, got {item!r}")
        voters[int(node)] = (host, int(port))
    return voters


class MetadataPusher:
    """Keeps one broker up to date with the controller's newest snapshot."""

    def __init__(
        self,
        target: BrokerInfo,
        controller_id: int,
        logger: Any,
        credentials: ClusterCredentials | None = None,
    ) -> None:
        self.target = target
        self.conn = PeerConnection(
            target.host,
            target.port,
            f"controller-{controller_id}",
            credentials=credentials,
            peer_id=target.node_id,
        )
        self.log = logger.bind(target=target.node_id)
        self.latest: dict | None = None
        self.sent_epoch = -1
        self._wakeup = trio.Event()

    def offer(self, snapshot: dict) -> None:
        self.latest = snapshot
        self._wakeup.set()

    async def run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            snapshot = self.latest
            if snapshot is None or snapshot["epoch"] <= self.sent_epoch:
                continue
            try:
                await self.conn.request(ApiKey.UPDATE_METADATA, {"metadata": snapshot}, timeout=5)
                self.sent_epoch = snapshot["epoch"]
            except KafkaError as exc:
                log_peer_failure(self.log, "metadata_push_failed", exc)
                # The broker also pulls the snapshot with its heartbeats; retry anyway.
                await trio.sleep(0.2)
                self._wakeup.set()


class ControllerLink:
    """A non-controller broker's line to the controller."""

    def __init__(self, broker: Any, host: str, port: int) -> None:
        self.broker = broker
        auth = {"credentials": broker.credentials, "peer_id": broker.controller_id}
        self.conn = PeerConnection(host, port, f"broker-{broker.broker_id}", **auth)
        self.isr_conn = PeerConnection(host, port, f"broker-{broker.broker_id}-isr", **auth)
        self.log = broker.log

    def _apply(self, body: dict) -> None:
        snapshot = body.get("metadata")
        if snapshot is not None:
            try:
                self.broker.receive_metadata(snapshot)
            except MetadataError as exc:
                self.log.warning("metadata_rejected", epoch=snapshot.get("epoch"), error=str(exc))
            except Exception:
                self.log.exception("metadata_apply_failed", epoch=snapshot.get("epoch"))

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        b = self.broker
        registration = {"broker_id": b.broker_id, "host": b.host, "port": b.port}
        delay = 0.02
        while True:
            try:
                self._apply(
                    await self.conn.request(ApiKey.BROKER_REGISTRATION, registration, timeout=5)
                )
                break
            except KafkaError as exc:
                log_peer_failure(self.log, "registration_retry", exc)
                await trio.sleep(delay)
                delay = min(delay * 2, 1.0)
        self.log.info("registered_with_controller", controller=self.conn.address)
        task_status.started()
        interval = b.config["broker.heartbeat.interval.ms"] / 1000
        while True:
            await trio.sleep(interval)
            try:
                body = await self.conn.request(
                    ApiKey.BROKER_HEARTBEAT,
                    {"broker_id": b.broker_id, "metadata_epoch": b.metadata.epoch},
                    timeout=max(interval, 5),
                )
                self._apply(body)
            except KafkaError as exc:
                self.log.warning("heartbeat_failed", error=str(exc))

    async def forward(self, api_key: int, body: dict) -> dict:
        return await self.conn.request(api_key, body, timeout=30)

    async def alter_partition(self, request: dict) -> dict:
        return await self.isr_conn.request(ApiKey.ALTER_PARTITION, request, timeout=10)
