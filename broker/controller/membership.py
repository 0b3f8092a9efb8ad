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

from minibroker.broker.common.config import BrokerConfig, ConfigError
from minibroker.broker.common.tasks import Spawner
from minibroker.broker.controller.active import ControllerRole
from minibroker.broker.metadata.cache import MetadataCache
from minibroker.broker.metadata.image import BrokerInfo
from minibroker.broker.network.cluster_auth import ClusterCredentials
from minibroker.broker.network.peer import PeerConnection
from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, KafkaError

# Where a controller change's answer lists its per-topic results (CreateTopics, DeleteTopics,
# CreatePartitions): an answer without them is a request-wide error.
_RESULTS = frozenset({"topics", "responses", "results", "entries"})
# Controller changes: a longer wait than the link's 5 s (a big create writes many files).
_CHANGES = frozenset(
    {
        ApiKey.CREATE_TOPICS,
        ApiKey.DELETE_TOPICS,
        ApiKey.CREATE_PARTITIONS,
        ApiKey.INCREMENTAL_ALTER_CONFIGS,
    }
)


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


def quorum_voters(broker_id: int, config: BrokerConfig) -> dict[int, tuple[str, int]]:
    """controller.quorum.voters, which must list this broker if it lists any."""
    try:
        voters = parse_voters(config["controller.quorum.voters"])
    except VotersError as exc:
        raise ConfigError(str(exc)) from None
    if voters and broker_id not in voters:
        # It would be a KRaft observer (metadata by fetching the log, no vote): not built.
        raise ConfigError(
            f"broker {broker_id} is not in controller.quorum.voters "
            f"({', '.join(map(str, sorted(voters)))}): every broker of a cluster must "
            "be a voter (brokers outside the voter set are not supported yet)"
        )
    return voters


class ControllerLink:
    """A broker's line to the active controller, whichever voter that is now.

    Registers with each new controller, then heartbeats; ``controller_call`` calls
    locally when this broker is the controller and retries on the next one after
    NOT_CONTROLLER. Metadata itself comes from the quorum every voter runs.
    """

    def __init__(
        self,
        me: BrokerInfo,
        voters: dict[int, tuple[str, int]],
        credentials: ClusterCredentials | None,
        role: ControllerRole,
        cache: MetadataCache,
        tasks: Spawner,
        *,
        heartbeat_interval_ms: int,
        logger: Any,
    ) -> None:
        self.me = me
        self.voters = voters
        self.credentials = credentials
        self.role = role
        self.cache = cache
        self.tasks = tasks
        self.heartbeat_interval_s = heartbeat_interval_ms / 1000
        self.log = logger
        self.conns: dict[tuple[int, str], PeerConnection] = {}

    def _conn(self, target: int, lane: str) -> PeerConnection:
        conn = self.conns.get((target, lane))
        if conn is None:
            host, port = self.voters[target]
            conn = self.conns[(target, lane)] = PeerConnection(
                host,
                port,
                f"broker-{self.me.node_id}" + ("-isr" if lane == "isr" else ""),
                credentials=self.credentials,
                peer_id=target,
            )
        return conn

    async def request(self, target: int, api_key: int, body: dict) -> dict:
        """One request to voter ``target`` (ISR changes on their own connection)."""
        if api_key == ApiKey.ALTER_PARTITION:
            return await self._conn(target, "isr").request(api_key, body, timeout=10)
        timeout = 30 if api_key in _CHANGES else 5
        return await self._conn(target, "main").request(api_key, body, timeout=timeout)

    async def run(self) -> None:
        me, cache, role = self.me, self.cache, self.role
        registration = {"broker_id": me.node_id, "host": me.host, "port": me.port}
        if me.kafka_port:  # only then: a peer from before the Kafka listener reads it too
            registration |= {"kafka_host": me.kafka_host, "kafka_port": me.kafka_port}
        interval = self.heartbeat_interval_s
        registered_with = -1
        while True:
            if registered_with != cache.controller_id or cache.controller_id < 0:
                answer = await self.controller_call(
                    ApiKey.BROKER_REGISTRATION, registration, role.register_broker, timeout=5
                )
                if answer.get("error_code", 0) == 0:
                    registered_with = cache.controller_id
                    self.log.info("registered_with_controller", controller=registered_with)
                else:
                    await trio.sleep(0.05)
                continue
            await trio.sleep(interval)
            answer = await self.controller_call(
                ApiKey.BROKER_HEARTBEAT,
                {"broker_id": me.node_id, "metadata_epoch": cache.metadata.epoch},
                role.heartbeat,
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
            self.role.create_topics,
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
            self.role.delete_topics,
            forwarded,
            lambda error: {"responses": [{"name": n, **error} for n in names]},
        )

    def alter_client_quotas(self, body: dict, *, forwarded: bool = False) -> dict | PendingResponse:
        """``{"entries": results}`` (AlterClientQuotas), from the active controller."""
        entries = body["entries"]
        return self._topic_change(
            ApiKey.ALTER_CLIENT_QUOTAS,
            body,
            self.role.alter_client_quotas,
            forwarded,
            lambda error: {"entries": [{"entity": e["entity"], **error} for e in entries]},
        )

    def create_partitions(
        self, topics: list[dict], validate_only: bool, *, forwarded: bool = False
    ) -> dict | PendingResponse:
        """``{"results": results}`` (CreatePartitions); see ``_topic_change``."""
        return self._topic_change(
            ApiKey.CREATE_PARTITIONS,
            {"topics": topics, "validate_only": validate_only},
            self.role.create_partitions,
            forwarded,
            lambda error: {"results": [{"name": t["name"], **error} for t in topics]},
        )

    def alter_configs(self, body: dict, *, forwarded: bool = False) -> dict | PendingResponse:
        """``{"responses": results}`` (IncrementalAlterConfigs, AlterConfigs as ``replace``)."""
        return self._topic_change(
            ApiKey.INCREMENTAL_ALTER_CONFIGS,
            body,
            self.role.alter_configs,
            forwarded,
            lambda error: {
                "responses": [
                    {
                        "resource_type": r["resource_type"],
                        "resource_name": r["resource_name"],
                        **error,
                    }
                    for r in body["resources"]
                ]
            },
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
        if forwarded:
            if self.role.controller is None:
                return refused(self._not_controller())
            return local(body)
        pending = PendingResponse()

        async def call() -> None:
            # Not idempotent: re-sent only where no controller can have acted on it.
            answer = await self.controller_call(api_key, body, local, timeout=30, idempotent=False)
            if not _RESULTS.intersection(answer):
                answer = refused(
                    {
                        "error_code": answer["error_code"],
                        "error_message": answer.get("error_message"),
                    }
                )
            pending.set(answer)

        self.tasks.start_soon(call)
        return pending

    def _not_controller(self) -> dict:
        return {
            "error_code": int(ErrorCode.NOT_CONTROLLER),
            "error_message": f"broker {self.me.node_id} is not the controller "
            f"(the controller is {self.cache.controller_id})",
        }

    async def controller_call(
        self,
        api_key: int,
        body: dict,
        local: Callable[[dict], Any],
        *,
        timeout: float,
        idempotent: bool = True,
    ) -> dict:
        """Ask the active controller, whoever it is now: locally when it is this broker,
        else over the link; NOT_CONTROLLER or an unreachable controller means wait for the
        quorum to name the next one and ask again, until ``timeout``.

        A request that is not ``idempotent`` (CreateTopics) is sent again only when the
        controller cannot have acted on it: refused with NOT_CONTROLLER, or a connection
        that failed. After a timed-out request (the controller may be working on it) the
        timeout goes back to the caller; a controller that appended the change and lost its
        role answers REQUEST_TIMED_OUT itself. Re-sending those to each new controller is
        how one oversized request once stalled controller after controller."""
        answer: dict = {"error_code": int(ErrorCode.NOT_CONTROLLER), "error_message": None}
        cache = self.cache
        with trio.move_on_after(timeout):
            while True:
                unreachable = False
                try:
                    if self.role.active:
                        answer = local(body)
                        if isinstance(answer, PendingResponse):
                            answer = await answer.wait()
                    elif cache.controller_id >= 0 and cache.controller_id != self.me.node_id:
                        answer = await self.request(cache.controller_id, api_key, body)
                    else:
                        answer = {
                            "error_code": int(ErrorCode.NOT_CONTROLLER),
                            "error_message": "no active controller yet",
                        }
                except KafkaError as exc:
                    answer = {
                        "error_code": int(exc.code),
                        "error_message": f"controller unreachable: {exc}",
                    }
                    if not idempotent and exc.code == ErrorCode.REQUEST_TIMED_OUT:
                        return answer
                    unreachable = True
                code = answer.get("error_code", 0)
                topic_codes = {t["error_code"] for key in _RESULTS for t in answer.get(key, ())}
                if not (
                    unreachable
                    or code == ErrorCode.NOT_CONTROLLER
                    or ErrorCode.NOT_CONTROLLER in topic_codes
                ):
                    return answer
                with trio.move_on_after(0.2):
                    await cache.leader_known.wait()
                await trio.sleep(0.02)
        return answer
