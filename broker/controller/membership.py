"""How a broker finds and follows the active controller, whichever voter that is.

Register with each new active controller (retrying until it answers), then heartbeat;
send it what only the controller decides (CreateTopics, DeleteTopics, ISR changes), here when this
broker is the controller, else over the link, and again to the next one after
NOT_CONTROLLER. Metadata itself comes from the quorum's committed log, on every broker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from minibroker.broker.network.peer import PeerConnection
from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, KafkaError


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

    Registers with each new controller, then heartbeats; ``controller_call`` calls
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
        timeout = 30 if api_key in (ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS) else 5
        return await self._conn(target, "main").request(api_key, body, timeout=timeout)

    async def run(self) -> None:
        b = self.broker
        registration = {"broker_id": b.broker_id, "host": b.host, "port": b.port}
        interval = b.config["broker.heartbeat.interval.ms"] / 1000
        registered_with = -1
        while True:
            if registered_with != b.controller_id or b.controller_id < 0:
                answer = await self.controller_call(
                    ApiKey.BROKER_REGISTRATION, registration, b.role.register_broker, timeout=5
                )
                if answer.get("error_code", 0) == 0:
                    registered_with = b.controller_id
                    self.log.info("registered_with_controller", controller=registered_with)
                else:
                    await trio.sleep(0.05)
                continue
            await trio.sleep(interval)
            answer = await self.controller_call(
                ApiKey.BROKER_HEARTBEAT,
                {"broker_id": b.broker_id, "metadata_epoch": b.metadata.epoch},
                b.role.heartbeat,
                timeout=max(interval, 5),
            )
            if answer.get("error_code", 0) != 0:
                self.log.warning("heartbeat_failed", error=answer.get("error_message"))

    def create_topics(
        self, topics: list[dict], validate_only: bool, *, forwarded: bool = False
    ) -> dict | PendingResponse:
        """``{"topics": results}``; see ``_topic_change``."""
        body = {"topics": topics, "validate_only": validate_only}
        return self._topic_change(
            ApiKey.CREATE_TOPICS,
            body,
            self.broker.role.create_topics,
            forwarded,
            lambda error: {
                "topics": [
                    {
                        "name": t["name"],
                        **error,
                        "num_partitions": t["num_partitions"],
                        "replication_factor": t["replication_factor"],
                    }
                    for t in topics
                ]
            },
        )

    def delete_topics(self, names: list[str], *, forwarded: bool = False) -> dict | PendingResponse:
        """``{"responses": results}`` (DeleteTopics); see ``_topic_change``."""
        return self._topic_change(
            ApiKey.DELETE_TOPICS,
            {"topic_names": names},
            self.broker.role.delete_topics,
            forwarded,
            lambda error: {"responses": [{"name": n, **error} for n in names]},
        )

    def _topic_change(
        self,
        api_key: int,
        body: dict,
        local: Callable[[dict], Any],
        forwarded: bool,
        refused: Callable[[dict], dict],
    ) -> dict | PendingResponse:
        """A client's request goes to the active controller (here or forwarded), retried on
        the next one after NOT_CONTROLLER; a forwarded one is answered here or refused, never
        forwarded again (no loops while the brokers disagree). ``refused(error)`` is the
        answer naming one error for every topic."""
        b = self.broker
        if forwarded:
            if b.controller is None:
                return refused(self._not_controller())
            return local(body)
        pending = PendingResponse()

        async def call() -> None:
            answer = await self.controller_call(api_key, body, local, timeout=30)
            if "topics" not in answer and "responses" not in answer:
                answer = refused(
                    {
                        "error_code": answer["error_code"],
                        "error_message": answer.get("error_message"),
                    }
                )
            pending.set(answer)

        b.nursery.start_soon(call)
        return pending

    def _not_controller(self) -> dict:
        return {
            "error_code": int(ErrorCode.NOT_CONTROLLER),
            "error_message": f"broker {self.broker.broker_id} is not the controller "
            f"(the controller is {self.broker.controller_id})",
        }

    async def controller_call(
        self, api_key: int, body: dict, local: Callable[[dict], Any], *, timeout: float
    ) -> dict:
        """Ask the active controller, whoever it is now: locally when it is this broker,
        else over the link; NOT_CONTROLLER or an unreachable controller means wait for the
        quorum to name the next one and ask again, until ``timeout``."""
        answer: dict = {"error_code": int(ErrorCode.NOT_CONTROLLER), "error_message": None}
        with trio.move_on_after(timeout):
            while True:
                unreachable = False
                try:
                    if self.broker.controller is not None:
                        answer = local(body)
                        if isinstance(answer, PendingResponse):
                            answer = await answer.wait()
                    elif (
                        self.broker.controller_id >= 0
                        and self.broker.controller_id != self.broker.broker_id
                    ):
                        answer = await self.request(self.broker.controller_id, api_key, body)
                    else:
                        answer = {
                            "error_code": int(ErrorCode.NOT_CONTROLLER),
                            "error_message": "no active controller yet",
                        }
                except KafkaError as exc:
                    unreachable = True
                    answer = {
                        "error_code": int(exc.code),
                        "error_message": f"controller unreachable: {exc}",
                    }
                code = answer.get("error_code", 0)
                topic_codes = {
                    t["error_code"] for t in answer.get("topics", answer.get("responses", []))
                }
                if not (
                    unreachable
                    or code == ErrorCode.NOT_CONTROLLER
                    or ErrorCode.NOT_CONTROLLER in topic_codes
                ):
                    return answer
                with trio.move_on_after(0.2):
                    await self.broker.leader_known.wait()
                await trio.sleep(0.02)
        return answer
