"""What the client knows about the cluster: brokers, partition leaders, one connection per broker.

Metadata is asked of any reachable broker (known ones first, then the bootstrap
list), concurrent refreshes share one request, and connections are opened lazily
and reopened after they die, so callers just say "node 2" and retry on errors.
"""

from __future__ import annotations

import time
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from minibroker.client.connection import BrokerConnection
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import (
    BrokerNotAvailable,
    ErrorCode,
    KafkaError,
    LeaderNotAvailable,
    UnknownTopicOrPartition,
    error_class,
)

# What a metadata answer says about a topic that is on its way: not created yet (it
# may be being created, or auto-created by this very request) or no leader elected yet.
NOT_YET = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE})


@dataclass(frozen=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int


@dataclass(frozen=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int] = field(default_factory=list)
    isr: list[int] = field(default_factory=list)
    offline_replicas: list[int] = field(default_factory=list)
    error_code: int = 0


class Cluster:
    """Metadata and connections for one client; open it inside a nursery."""

    def __init__(self, config: dict[str, Any], nursery: trio.Nursery) -> None:
        self.config = config
        self.bootstrap: list[tuple[str, int]] = config["bootstrap.servers"]
        self.client_id: str = config["client.id"]
        self.request_timeout = config["request.timeout.ms"] / 1000
        self.connect_timeout = config["socket.connection.setup.timeout.ms"] / 1000
        self.max_age = config["metadata.max.age.ms"] / 1000
        self.nursery = nursery
        self.brokers: dict[int, BrokerInfo] = {}
        self.controller_id = -1
        self.topics: dict[str, list[PartitionInfo]] = {}
        self.topic_errors: dict[str, tuple[int, str | None]] = {}
        self.wanted: set[str] = set()
        self.updated_at = 0.0
        self.version = 0
        self._conns: dict[tuple[str, int], BrokerConnection] = {}
        self._connecting: dict[tuple[str, int], trio.Lock] = {}
        self._refreshing: trio.Event | None = None
        self._refresh_error: BaseException | None = None
        self._refresh_names: set[str] = set()

    # --- lookups (pure, no I/O) -----------------------------------------------------------

    def partition_count(self, topic: str) -> int | None:
        parts = self.topics.get(topic)
        return len(parts) if parts else None

    def leader(self, topic: str, partition: int) -> int | None:
        parts = self.topics.get(topic)
        if parts is None or partition >= len(parts):
            return None
        leader = parts[partition].leader
        return leader if leader >= 0 and leader in self.brokers else None

    def topic_error(self, topic: str, message: str) -> KafkaError:
        """Why ``topic`` is not in the metadata: the broker's error for it, its message after
        ours; UNKNOWN_TOPIC_OR_PARTITION when the metadata does not mention the topic."""
        code, said = self.topic_errors.get(topic, (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None))
        return error_class(code)(f"{message} ({said})" if said else message)

    @property
    def stale(self) -> bool:
        return time.monotonic() > self.expires_at

    @property
    def expires_at(self) -> float:
        """Monotonic time at which the metadata is older than ``metadata.max.age.ms``."""
        return self.updated_at + self.max_age

    # --- metadata ---------------------------------------------------------------------------

    async def refresh(self, topics: Iterable[str] | None = ()) -> dict:
        """Fetch metadata for the wanted topics plus ``topics`` (None: every topic).

        A caller whose topics are already part of a running refresh waits for that one
        instead of sending another request.
        """
        asked = None if topics is None else set(topics)
        if asked is not None:
            self.wanted.update(asked)
            running = self._refreshing
            if running is not None and asked <= self._refresh_names:
                await running.wait()
                if self._refresh_error is not None:
                    raise self._refresh_error
                return {}
        names = None if asked is None else sorted(self.wanted)
        event = self._refreshing = trio.Event()
        self._refresh_names = set(names or ())
        self._refresh_error = None
        try:
            body = await self.any_request(ApiKey.METADATA, {"topics": names})
            self._apply(body)
            return body
        except BaseException as exc:
            self._refresh_error = exc
            raise
        finally:
            if self._refreshing is event:
                self._refreshing = None
            event.set()

    async def wait_for_topic(
        self, topic: str, timeout: float, backoff: float, keep_waiting: Container[int] = NOT_YET
    ) -> None:
        """Refresh until ``topic`` is in the metadata, as Kafka's send waits (max.block.ms).

        A retriable failure to get metadata is retried; a topic error in ``keep_waiting``
        means "not yet" and is waited out; any other topic error raises at once. After
        ``timeout`` seconds it raises UnknownTopicOrPartition.
        """
        with trio.move_on_after(timeout):
            while True:
                try:
                    await self.refresh([topic])
                except KafkaError as exc:
                    if not exc.retriable:
                        raise
                if self.partition_count(topic) is not None:
                    return
                code = self.topic_errors.get(topic, (ErrorCode.NONE, None))[0]
                if code and code not in keep_waiting:
                    raise self.topic_error(topic, f"topic '{topic}'")
                await trio.sleep(backoff)
        raise UnknownTopicOrPartition(
            f"topic '{topic}' not in the cluster metadata after {round(timeout * 1000)} ms"
        )

    def _apply(self, body: dict) -> None:
        self.brokers = {
            b["node_id"]: BrokerInfo(b["node_id"], b["host"], b["port"]) for b in body["brokers"]
        }
        self.controller_id = body["controller_id"]
        for t in body["topics"]:
            name = t["name"]
            if t["error_code"]:
                self.topics.pop(name, None)
                self.topic_errors[name] = (t["error_code"], t.get("error_message"))
                continue
            self.topic_errors.pop(name, None)
            parts = sorted(t["partitions"], key=lambda p: p["partition"])
            self.topics[name] = [
                PartitionInfo(
                    name,
                    p["partition"],
                    p["leader"],
                    p["leader_epoch"],
                    p["replicas"],
                    p["isr"],
                    p.get("offline_replicas", []),
                    p["error_code"],
                )
                for p in parts
            ]
        self.updated_at = time.monotonic()
        self.version += 1

    # --- connections -----------------------------------------------------------------------

    def _addresses(self) -> list[tuple[str, int]]:
        """Where to ask for metadata: brokers we are already talking to first (a stalled one
        we have not needed yet costs nothing), then the bootstrap list, then the rest."""
        order = [addr for addr, conn in self._conns.items() if not conn.closed]
        order += [a for a in self.bootstrap if a not in order]
        order += [(b.host, b.port) for b in self.brokers.values() if (b.host, b.port) not in order]
        return order

    async def connect(self, host: str, port: int) -> BrokerConnection:
        addr = (host, port)
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        lock = self._connecting.setdefault(addr, trio.Lock())
        async with lock:
            conn = self._conns.get(addr)
            if conn is None or conn.closed:
                conn = await BrokerConnection.open(
                    self.nursery,
                    host,
                    port,
                    client_id=self.client_id,
                    connect_timeout=self.connect_timeout,
                )
                self._conns[addr] = conn
        return conn

    async def connection(self, node_id: int) -> BrokerConnection:
        broker = self.brokers.get(node_id)
        if broker is None:
            raise LeaderNotAvailable(f"broker {node_id} is not in the cluster metadata")
        return await self.connect(broker.host, broker.port)

    async def request(
        self,
        node_id: int,
        api_key: int,
        body: dict,
        *,
        timeout: float | None = None,
        expect_response: bool = True,
    ) -> dict:
        conn = await self.connection(node_id)
        return await conn.request(
            api_key,
            body,
            timeout=self.request_timeout if timeout is None else timeout,
            expect_response=expect_response,
        )

    async def any_request(self, api_key: int, body: dict, timeout: float | None = None) -> dict:
        """Send to the first broker that answers, trying every address we know (bootstrap
        list and brokers from metadata), so one dead broker never hides the live ones.
        Failing on all of them raises the last error, naming every address when none of
        them could even be reached."""
        last: KafkaError | None = None
        unreachable: list[str] = []
        addresses = self._addresses()
        for host, port in addresses:
            try:
                conn = await self.connect(host, port)
                return await conn.request(
                    api_key, body, timeout=self.request_timeout if timeout is None else timeout
                )
            except BrokerNotAvailable as exc:
                last = exc
                unreachable.append(exc.message.removeprefix("cannot connect to "))
            except KafkaError as exc:
                if not exc.retriable:
                    raise
                last = exc
        if len(unreachable) > 1 and len(unreachable) == len(addresses):
            raise BrokerNotAvailable("cannot connect to any of " + ", ".join(unreachable))
        raise last or BrokerNotAvailable("no broker address to connect to")

    async def aclose(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            await conn.aclose()
