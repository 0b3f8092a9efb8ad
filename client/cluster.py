"""What the client knows about the cluster: brokers, partition leaders, one connection per broker.

Metadata is asked of any broker that answers (client/hedge.py: the next address is
asked too after ``hedge.delay.ms`` without an answer, the first answer wins), known
ones first, then the bootstrap list, and an address that failed to answer last is
asked last. Concurrent refreshes share one request, and connections are opened
lazily and reopened after they die, so callers just say "node 2" and retry on errors.
A topic is missing only when a broker said so: when no broker answered, the error
names every address and what happened to it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from minibroker.client.connection import BrokerConnection, failure_reason, no_answer
from minibroker.client.hedge import AllFailed, NoAnswer, first_answer
from minibroker.client.throttle import ThrottleMetrics
from minibroker.protocol import ApiKey, api_name
from minibroker.protocol.errors import (
    BrokerNotAvailable,
    ErrorCode,
    KafkaError,
    LeaderNotAvailable,
    NetworkException,
    RequestTimedOut,
    UnknownTopicOrPartition,
    error_class,
)

# How the error that lists every address tried begins (the CLI adds its hint to it).
NO_BROKER_ANSWERED = "no broker answered"

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
        self.api_version_timeout = config["api.version.request.timeout.ms"] / 1000
        self.hedge_delay = config["hedge.delay.ms"] / 1000
        self.max_age = config["metadata.max.age.ms"] / 1000
        # A consumer's allow.auto.create.topics (producers and admins always allow it).
        self.allow_auto_create: bool = config.get("allow.auto.create.topics", True)
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
        # Why the latest refresh got no metadata (None: it did), so a topic nobody has
        # answered about is reported as that, never as missing.
        self.refresh_error: KafkaError | None = None
        # Addresses that did not answer when last asked: asked last until they do.
        self._unanswered: set[tuple[str, int]] = set()
        # Quota throttles the brokers gave (KIP-219): metrics, and the throttle_cb setting.
        self.throttles = ThrottleMetrics(config.get("throttle_cb"))

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
        ours; when no broker could be asked, why not; UNKNOWN_TOPIC_OR_PARTITION when the
        metadata does not mention the topic. A broker's message that already begins with
        ours ("topic 'x' does not exist") is said once, not twice."""
        failed = self.refresh_error
        if topic not in self.topic_errors and failed is not None:
            return type(failed)(f"{message}: {failed.message}")
        code, said = self.topic_errors.get(topic, (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None))
        if not said:
            return error_class(code)(message)
        return error_class(code)(said if said.startswith(message) else f"{message} ({said})")

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
        instead of sending another request (and sends its own if that one's caller gave
        up on it: a cancellation is not an answer).
        """
        asked = None if topics is None else set(topics)
        if asked is not None:
            self.wanted.update(asked)
            running = self._refreshing
            while running is not None and asked <= self._refresh_names:
                await running.wait()
                if not isinstance(self._refresh_error, trio.Cancelled):
                    if self._refresh_error is not None:
                        raise self._refresh_error
                    return {}
                running = self._refreshing
        names = None if asked is None else sorted(self.wanted)
        event = self._refreshing = trio.Event()
        self._refresh_names = set(names or ())
        self._refresh_error = None
        try:
            body = await self.any_request(ApiKey.METADATA, self._metadata_request(names))
            self._apply(body)
            self.refresh_error = None
            return body
        except BaseException as exc:
            self._refresh_error = exc
            if isinstance(exc, KafkaError):
                self.refresh_error = exc
            raise
        finally:
            if self._refreshing is event:
                self._refreshing = None
            event.set()

    def _metadata_request(self, names: list[str] | None) -> dict:
        if self.allow_auto_create:
            return {"topics": names}
        return {"topics": names, "allow_auto_topic_creation": False}  # Metadata v1+

    async def wait_for_topic(
        self, topic: str, timeout: float, backoff: float, keep_waiting: Container[int] = NOT_YET
    ) -> None:
        """Refresh until ``topic`` is in the metadata, as Kafka's send waits (max.block.ms).

        A retriable failure to get metadata is retried; a topic error in ``keep_waiting``
        means "not yet" and is waited out; any other topic error raises at once. After
        ``timeout`` seconds it raises UnknownTopicOrPartition if a broker said the topic
        is not there, or why no broker answered.
        """
        answered = False
        failed: KafkaError | None = None
        with trio.move_on_after(timeout):
            while True:
                try:
                    await self.refresh([topic])
                    answered = True
                except KafkaError as exc:
                    if not exc.retriable:
                        raise
                    failed = exc
                if self.partition_count(topic) is not None:
                    return
                code = self.topic_errors.get(topic, (ErrorCode.NONE, None))[0]
                if code and code not in keep_waiting:
                    raise self.topic_error(topic, f"topic '{topic}'")
                await trio.sleep(backoff)
        message = f"topic '{topic}' not in the cluster metadata after {round(timeout * 1000)} ms"
        if answered:
            raise UnknownTopicOrPartition(message)
        if failed is not None:
            raise type(failed)(f"{message}: {failed.message}")
        raise RequestTimedOut(f"{message}: no broker answered METADATA")

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
        we have not needed yet costs nothing), then the bootstrap list, then the rest;
        those that did not answer when last asked go last."""
        order = [addr for addr, conn in self._conns.items() if not conn.closed]
        order += [a for a in self.bootstrap if a not in order]
        order += [(b.host, b.port) for b in self.brokers.values() if (b.host, b.port) not in order]
        order.sort(key=self._unanswered.__contains__)  # stable: the order above otherwise
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
                    api_version_timeout=self.api_version_timeout,
                )
                conn.on_throttle = self.throttles.throttled
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
        version: int | None = None,
        timeout: float | None = None,
        expect_response: bool = True,
    ) -> dict:
        """``body`` to broker ``node_id`` in ``version`` (default: the connection's
        negotiated one)."""
        conn = await self.connection(node_id)
        try:
            answer = await conn.request(
                api_key,
                body,
                version,
                timeout=self.request_timeout if timeout is None else timeout,
                expect_response=expect_response,
            )
        except (RequestTimedOut, NetworkException):
            # Asked last for metadata from now on: a paused leader must not also cost
            # every refresh a hedge delay.
            self._unanswered.add((conn.host, conn.port))
            raise
        if self._unanswered:
            self._unanswered.discard((conn.host, conn.port))
        return answer

    async def any_request(
        self, api_key: int, body: dict, timeout: float | None = None, *, hedge: bool = True
    ) -> dict:
        """The first answer from any broker, trying every address we know (bootstrap list
        and brokers from metadata), so one dead or silent broker never hides the live ones.

        With ``hedge`` the next address is asked after ``hedge.delay.ms`` without an
        answer; without it (a request that must not be done twice) only after a failure.
        A broker's error is raised as it is; when no broker answered, BrokerNotAvailable
        names each address and what happened to it.
        """
        timeout = self.request_timeout if timeout is None else timeout

        async def ask(addr: tuple[str, int]) -> dict:
            try:
                answer = await self._ask(addr, api_key, body, timeout)
            except BaseException:  # silent, refused, or cancelled because another answered
                self._unanswered.add(addr)
                raise
            self._unanswered.discard(addr)
            return answer

        try:
            return (
                await first_answer(self._addresses(), ask, self.hedge_delay if hedge else math.inf)
            )[1]
        except AllFailed as exc:
            raise self._no_answer_error(api_key, exc.failures) from None

    async def _ask(self, addr: tuple[str, int], api_key: int, body: dict, timeout: float) -> dict:
        """One attempt of any_request: NoAnswer unless a broker answered."""
        address = f"{addr[0]}:{addr[1]}"
        try:
            conn = await self.connect(*addr)
            if api_key == ApiKey.METADATA and conn.versions.get(api_key, 0) < 1:
                # A broker from before Metadata v1 knows no allow_auto_topic_creation (and
                # would refuse the request for it): ask as before, it decides alone.
                body = {"topics": body["topics"]}
            with trio.move_on_after(timeout):
                return await conn.request(api_key, body)
        except (BrokerNotAvailable, NetworkException) as exc:
            raise NoAnswer(failure_reason(exc, address)) from None
        raise NoAnswer(no_answer(timeout))

    @staticmethod
    def _no_answer_error(api_key: int, failures: list) -> KafkaError:
        """A broker's own error if one gave any (NOT_CONTROLLER...), else every address
        and what happened to it."""
        said = [exc for _, exc in failures if isinstance(exc, KafkaError)]
        if said:
            return said[-1]
        if not failures:
            return BrokerNotAvailable("no broker address to connect to")
        tried = ", ".join(f"{host}:{port} ({exc.reason})" for (host, port), exc in failures)
        return BrokerNotAvailable(f"{NO_BROKER_ANSWERED} {api_name(api_key)}: {tried}")

    async def aclose(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            await conn.aclose()
