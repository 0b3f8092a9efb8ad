"""How a broker finds and follows the active controller, whichever voter that is.

Register with each new active controller (retrying until it answers), then heartbeat.
Voters learn metadata from the quorum's committed log; a broker outside the voter set
takes the snapshot each heartbeat answer carries.
"""

from __future__ import annotations

from typing import Any

import trio

from protocol import ApiKey

from .metadata_check import MetadataError
from .peer import PeerConnection


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


class ControllerLink:
    """A broker's line to the active controller, whichever voter that is now.

    Registers with each new controller, then heartbeats; ``broker.controller_call`` calls
    locally when this broker is the controller and retries on the next one after
    NOT_CONTROLLER. Metadata itself comes from the quorum every voter runs.
    """

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.conns: dict[tuple[int, str], PeerConnection] = {}
        self.log = broker.log

    def _conn(self, target: int, lane: str) -> PeerConnection:
        conn = self.conns.get((target, lane))
        if conn is None:
            b = self.broker
            host, port = b.voters[target]
            conn = self.conns[(target, lane)] = PeerConnection(
                host,
                port,
                f"broker-{b.broker_id}" + ("-isr" if lane == "isr" else ""),
                credentials=b.credentials,
                peer_id=target,
            )
        return conn

    async def request(self, target: int, api_key: int, body: dict) -> dict:
        """One request to voter ``target`` (ISR changes on their own connection)."""
        if api_key == ApiKey.ALTER_PARTITION:
            return await self._conn(target, "isr").request(api_key, body, timeout=10)
        timeout = 30 if api_key == ApiKey.CREATE_TOPICS else 5
        return await self._conn(target, "main").request(api_key, body, timeout=timeout)

    def _apply(self, body: dict) -> None:
        snapshot = body.get("metadata")
        if snapshot is not None and self.broker.quorum is None:
            try:
                self.broker.receive_metadata(snapshot)
            except MetadataError as exc:
                self.log.warning("metadata_rejected", epoch=snapshot.get("epoch"), error=str(exc))

    async def run(self) -> None:
        b = self.broker
        registration = {"broker_id": b.broker_id, "host": b.host, "port": b.port}
        interval = b.config["broker.heartbeat.interval.ms"] / 1000
        registered_with = -1
        while True:
            if registered_with != b.controller_id or b.controller_id < 0:
                answer = await b.controller_call(
                    ApiKey.BROKER_REGISTRATION, registration, b.register_broker, timeout=5
                )
                if answer.get("error_code", 0) == 0:
                    registered_with = b.controller_id
                    self.log.info("registered_with_controller", controller=registered_with)
                    self._apply(answer)
                else:
                    await trio.sleep(0.05)
                continue
            await trio.sleep(interval)
            answer = await b.controller_call(
                ApiKey.BROKER_HEARTBEAT,
                {"broker_id": b.broker_id, "metadata_epoch": b.metadata.epoch},
                b.heartbeat,
                timeout=max(interval, 5),
            )
            if answer.get("error_code", 0) != 0:
                self.log.warning("heartbeat_failed", error=answer.get("error_message"))
            self._apply(answer)
