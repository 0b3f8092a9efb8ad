"""One TCP connection to one broker, with many requests in flight.

Requests are written as they come (a lock keeps frames whole) and a reader task
matches responses to callers by correlation id, so a slow long-poll fetch never
holds up a produce on the same socket. When the socket dies every caller still
waiting gets a NetworkException instead of hanging. Correlation ids, framing and the
rule for a top-level error are protocol.connection's (the broker's peer links share
them); this module adds the socket, the reader task and the waiting.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import trio

from minibroker.protocol import ApiKey, api_name
from minibroker.protocol.api import SCHEMAS
from minibroker.protocol.connection import Connection, check_error
from minibroker.protocol.errors import (
    BrokerNotAvailable,
    KafkaError,
    NetworkException,
    ProtocolError,
    RequestTimedOut,
)

_RECEIVE_BYTES = 1 << 20


def describe_os_error(exc: BaseException) -> str:
    """``connection refused`` rather than ``all attempts to connect to 127.0.0.1:9092 failed``."""
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup) and cause.exceptions:
        return describe_os_error(cause.exceptions[0])
    if isinstance(exc, OSError) and exc.errno is not None:
        text = os.strerror(exc.errno) if exc.errno > 0 else exc.strerror  # <0: getaddrinfo
        return (text or str(exc)).lower()
    return str(exc) or type(exc).__name__


# What a connection's failures say, after the address: one wording for the exceptions
# below and for failure_reason, which reads it back to list every address tried.
NOT_OUR_PROTOCOL = "does not speak minibroker's protocol"
CLOSED_BY_PEER = "closed the connection"
CONNECTION_BROKE = "the connection broke"


def no_answer(seconds: float) -> str:
    return f"no answer in {round(seconds * 1000)} ms"


def failure_reason(exc: KafkaError, address: str) -> str:
    """What happened to ``address`` in words ("connection refused", "no answer in 2000 ms"),
    from an error this module raised about it."""
    return exc.message.removeprefix(f"cannot connect to {address}: ").removeprefix(f"{address}: ")


def negotiated_versions(advertised: list[list[int]]) -> dict[int, int]:
    """Per API both sides have: the newest version within both ranges (``advertised`` is
    ApiVersions' ``[[api_key, min, max], ...]``)."""
    out = {}
    for entry in advertised:
        if len(entry) != 3:
            continue  # not an entry we can read: that API stays at version 0
        key, low, high = entry
        ours = SCHEMAS.get(key)
        common = [v for v in ours or () if low <= v <= high]
        if common:
            out[key] = max(common)
    return out


class _Waiter:
    """A caller waiting for one response: one Event per request, never per record."""

    __slots__ = ("body", "done", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.body: dict | None = None
        self.error: BaseException | None = None


class BrokerConnection:
    """Use :meth:`open`; the reader runs in the nursery given there."""

    def __init__(
        self, stream: trio.SocketStream, host: str, port: int, client_id: str | None
    ) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self._stream = stream
        self._send_lock = trio.Lock()
        self._conn = Connection(client_id)
        # api key -> the version requests go in: the newest both sides have, from the
        # broker's ApiVersions answer (Kafka's clients negotiate the same way). Without
        # the handshake, or for an API the broker did not list, version 0.
        self.versions: dict[int, int] = {}
        self._error: KafkaError | None = None
        self._closed = trio.Event()
        # KIP-219: the trio time until which the broker holds this connection (a quota's
        # throttle_time_ms); the next request waits for it. ``on_throttle(address, ms)``
        # is told of each (the Cluster's ThrottleMetrics).
        self.throttled_until = 0.0
        self.on_throttle: Callable[[str, int], None] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    async def open(
        cls,
        nursery: trio.Nursery,
        host: str,
        port: int,
        *,
        client_id: str | None = None,
        connect_timeout: float = 10.0,
        api_version_timeout: float | None = None,
    ) -> BrokerConnection:
        """Connect; an unreachable broker is BrokerNotAvailable with the reason in words.

        With ``api_version_timeout`` the connection is ready only once the peer has
        answered ApiVersions within that many seconds (librdkafka's
        ``api.version.request.timeout.ms``, as Kafka's clients open every connection
        with ApiVersions): a paused broker, or a port where something else listens (an
        HTTP server), is then BrokerNotAvailable at once instead of a request that
        waits out ``request.timeout.ms``.
        """
        address = f"{host}:{port}"
        try:
            with trio.fail_after(connect_timeout):
                stream = await trio.open_tcp_stream(host, port)
        except trio.TooSlowError:
            raise BrokerNotAvailable(
                f"cannot connect to {address}: no TCP connection in {round(connect_timeout * 1000)} ms"
            ) from None
        except OSError as exc:
            raise BrokerNotAvailable(
                f"cannot connect to {address}: {describe_os_error(exc)}"
            ) from None
        conn = cls(stream, host, port, client_id)
        nursery.start_soon(conn._read_loop)
        if api_version_timeout is not None:
            await conn._handshake(api_version_timeout)
        return conn

    async def _handshake(self, timeout: float) -> None:
        """ApiVersions before anything else; the connection is closed unless it is answered."""
        try:
            with trio.move_on_after(timeout):
                answer = await self.request(ApiKey.API_VERSIONS, {})
                self.versions = negotiated_versions(answer["api_versions"])
                return
            reason = no_answer(timeout)
        except NetworkException as exc:
            reason = failure_reason(exc, self.address)
        except BaseException:  # cancelled (another broker answered first), or an error code
            await self.aclose()
            raise
        await self.aclose()
        raise BrokerNotAvailable(f"cannot connect to {self.address}: {reason}")

    @property
    def closed(self) -> bool:
        return self._error is not None

    @property
    def in_flight(self) -> int:
        return self._conn.in_flight

    async def request(
        self,
        api_key: int,
        body: dict,
        version: int | None = None,
        timeout: float | None = None,
        expect_response: bool = True,
    ) -> dict:
        """Send one request (in ``version``, by default the negotiated one) and return its
        validated response body.

        A top-level ``error_code`` raises the exception named after it (the rule, and its
        one exception, are protocol.connection.check_error's); no response within
        ``timeout`` seconds is RequestTimedOut; a dead socket is NetworkException.
        With ``expect_response=False`` (acks=0 produce) it returns ``{}`` once written.
        """
        if self._error is not None:
            raise self._error
        if self.throttled_until and self.throttled_until > trio.current_time():
            await trio.sleep_until(self.throttled_until)  # the broker would not read it anyway
        waiter = _Waiter() if expect_response else None
        if version is None:
            version = self.versions.get(api_key, 0)
        corr, frame = self._conn.send_request(
            api_key, body, version, waiter=waiter, expect_response=expect_response
        )
        try:
            await self._send(frame)
            if waiter is None:
                return {}
            with trio.move_on_after(math.inf if timeout is None else timeout):
                await waiter.done.wait()
        finally:
            if waiter is not None and not waiter.done.is_set():
                self._conn.forget(corr)
        if waiter.error is not None:
            raise waiter.error
        if waiter.body is None:
            raise RequestTimedOut(
                f"no {api_name(api_key)} response from {self.address} within {timeout:g}s"
            )
        return check_error(api_key, waiter.body)

    async def _send(self, frame: bytes) -> None:
        async with self._send_lock:
            if self._error is not None:
                raise self._error
            try:
                await self._stream.send_all(frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._fail(NetworkException(f"{self.address}: {CONNECTION_BROKE} ({exc})"))
                raise self._error from None

    async def _read_loop(self) -> None:
        conn = self._conn
        try:
            while True:
                data = await self._stream.receive_some(_RECEIVE_BYTES)
                if not data:
                    self._fail(NetworkException(f"{self.address}: {CLOSED_BY_PEER}"))
                    return
                for response in conn.receive_data(data):
                    waiter = response.waiter
                    if response.problem is None:
                        body = waiter.body = response.body
                        if type(body) is dict and body.get("throttle_time_ms"):
                            self._throttled(body["throttle_time_ms"])
                    else:
                        waiter.error = NetworkException(
                            f"{self.address}: {NOT_OUR_PROTOCOL} (bad response: {response.problem})"
                        )
                    waiter.done.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._fail(NetworkException(f"{self.address}: {CONNECTION_BROKE} ({exc})"))
        except ProtocolError as exc:
            said = str(exc).removeprefix("the peer ")  # framing's own words for text, kept
            reason = said if said.startswith(NOT_OUR_PROTOCOL) else f"{NOT_OUR_PROTOCOL} ({said})"
            self._fail(NetworkException(f"{self.address}: {reason}"))
        finally:
            self._fail(NetworkException(f"{self.address}: the connection is closed"))
            with trio.CancelScope(shield=True):
                await self._stream.aclose()

    def _throttled(self, throttle_ms: int) -> None:
        self.throttled_until = max(self.throttled_until, trio.current_time() + throttle_ms / 1000)
        if self.on_throttle is not None:
            self.on_throttle(self.address, throttle_ms)

    def _fail(self, error: KafkaError) -> None:
        """Mark the connection dead and wake every waiting caller with ``error``."""
        if self._error is None:
            self._error = error
        for waiter in self._conn.fail_all():
            waiter.error = self._error
            waiter.done.set()
        self._closed.set()

    async def aclose(self) -> None:
        self._fail(NetworkException(f"{self.address}: the connection was closed by the client"))
        with trio.CancelScope(shield=True):
            await self._stream.aclose()

    async def wait_closed(self) -> None:
        await self._closed.wait()


def response_errors(body: dict[str, Any]) -> list[tuple[str, int, int, str | None]]:
    """``(topic, partition, error_code, message)`` for every failed partition of a response."""
    return [
        (t["name"], p["partition"], p["error_code"], p.get("error_message"))
        for t in body.get("topics", [])
        for p in t.get("partitions", [])
        if p.get("error_code")
    ]
