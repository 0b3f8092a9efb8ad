"""The active controller's request side: what a voter does while it leads the quorum.

``Controller`` (controller.py) is the state machine of changes; this is the role around
it: built from the committed metadata when the quorum makes this voter active, dropped
when it stops being active, and in between answering registrations, heartbeats and ISR
proposals, and fencing brokers whose heartbeats stop (Kafka's BrokerHeartbeatManager).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from minibroker.broker.common.clock import Clock
from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.controller.configs import alter_configs
from minibroker.broker.controller.controller import METADATA_FILE, Controller
from minibroker.broker.controller.partitions import create_partitions
from minibroker.broker.metadata.image import BrokerInfo, ClusterMetadata
from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol.errors import ErrorCode


class ControllerRole:
    def __init__(self, me: BrokerInfo, config: BrokerConfig, clock: Clock, logger: Any) -> None:
        self.me = me
        self.config = config
        self.clock = clock
        self.log = logger
        self.controller: Controller | None = None
        # broker id -> last heartbeat (ms); a broker not heard from counts from activation.
        self.heartbeats: dict[int, int] = {}
        self.activated_ms = 0
        # A pre-quorum data dir's cluster-metadata.json, imported when the log is empty.
        self.legacy: ClusterMetadata | None = None

    @property
    def active(self) -> bool:
        return self.controller is not None

    def activate(
        self,
        committed: ClusterMetadata,
        submit: Callable[[list[bytes], Any, Any], PendingResponse],
    ) -> None:
        """Become the active controller over ``committed`` (the applied metadata image)."""
        self.controller = Controller(
            self.me.node_id, self.config, self.log, committed.copy(), submit
        )
        # Every broker gets a full session from now: a new controller does not fence
        # brokers whose heartbeats went to the old one.
        self.heartbeats = {}
        self.activated_ms = self.clock.now_ms()
        self.controller.register_broker(self.me, {"error_code": 0})
        if self.legacy is not None and not committed.topics:
            self.controller.import_legacy(self.legacy)
            self.log.info(
                "legacy_metadata_imported", file=METADATA_FILE, topics=sorted(self.legacy.topics)
            )

    def deactivate(self) -> None:
        self.controller = None

    # --- requests from brokers (apis.controller_only checked who sends them) ------------------

    def register_broker(self, body: dict) -> dict | PendingResponse:
        if not body["host"] or body["port"] < 1:
            # Never let a registration make the metadata one that brokers (or this
            # controller, at its next start) would refuse to load.
            return {
                "error_code": int(ErrorCode.INVALID_REQUEST),
                "error_message": f"cannot register {body['host']!r}:{body['port']}",
            }
        self.heartbeats[body["broker_id"]] = self.clock.now_ms()
        # Voters get metadata from the quorum itself; the answer carries none.
        # .get: the controller's own broker registers by a direct call, with the body as
        # built (no validation fills the defaults), which names no Kafka listener when off.
        return self.controller.register_broker(
            BrokerInfo(
                body["broker_id"],
                body["host"],
                body["port"],
                body.get("kafka_host", ""),
                body.get("kafka_port", 0),
            ),
            {"error_code": 0, "metadata": None},
        )

    def heartbeat(self, body: dict) -> dict | PendingResponse:
        broker_id = body["broker_id"]
        if body.get("shutting_down"):
            # Controlled shutdown: move leadership now instead of after the session timeout.
            self.heartbeats.pop(broker_id, None)
            return self.controller.fence(
                broker_id, "controlled_shutdown", {"error_code": 0, "metadata": None}
            )
        self.heartbeats[broker_id] = self.clock.now_ms()
        return self.controller.broker_alive(broker_id, {"error_code": 0, "metadata": None})

    def alter_partition(self, body: dict) -> dict | PendingResponse:
        return self.controller.alter_partition(body)

    def allocate_producer_ids(self, body: dict) -> dict | PendingResponse:
        return self.controller.allocate_producer_ids(body["broker_id"])

    def create_topics(self, body: dict) -> dict | PendingResponse:
        return self.controller.create_topics(body["topics"], body["validate_only"])

    def delete_topics(self, body: dict) -> dict | PendingResponse:
        return self.controller.delete_topics(body["topic_names"])

    def alter_client_quotas(self, body: dict) -> dict | PendingResponse:
        return self.controller.alter_client_quotas(body["entries"], body["validate_only"])

    def create_partitions(self, body: dict) -> dict | PendingResponse:
        return create_partitions(self.controller, body["topics"], body["validate_only"])

    def alter_configs(self, body: dict) -> dict | PendingResponse:
        return alter_configs(
            self.controller, body["resources"], body["validate_only"], body["replace"]
        )

    # --- fencing ------------------------------------------------------------------------------

    async def fence_silent_brokers(self) -> None:
        """While active: fence brokers whose heartbeats stopped for broker.session.timeout.ms."""
        timeout = self.config["broker.session.timeout.ms"]
        while True:
            await trio.sleep(min(timeout / 4, 250) / 1000)
            controller = self.controller
            if controller is None:
                continue
            now = self.clock.now_ms()
            for broker_id in list(controller.metadata.live):
                if broker_id == self.me.node_id:
                    continue
                last = self.heartbeats.get(broker_id, self.activated_ms)
                if now - last > timeout:
                    controller.fence(broker_id, reason=f"no heartbeat for {now - last} ms")
