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
from typing import Any

import trio

from minibroker.protocol import api_name
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
        self._error: KafkaError | None = None
        self._closed = trio.Event()

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
    ) -> BrokerConnection:
        """Connect; an unreachable broker is BrokerNotAvailable with the reason in words."""
        try:
            with trio.fail_after(connect_timeout):
                stream = await trio.open_tcp_stream(host, port)
        except trio.TooSlowError:
            raise BrokerNotAvailable(
                f"cannot connect to {host}:{port}: no answer within {connect_timeout:g}s"
            ) from None
        except OSError as exc:
            raise BrokerNotAvailable(
                f"cannot connect to {host}:{port}: {describe_os_error(exc)}"
            ) from None
        conn = cls(stream, host, port, client_id)
        nursery.start_soon(conn._read_loop)
        return conn

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
        version: int = 0,
        timeout: float | None = None,
        expect_response: bool = True,
    ) -> dict:
        """Send one request and return its validated response body.

        A top-level ``error_code`` raises the exception named after it (the rule, and its
        one exception, are protocol.connection.check_error's); no response within
        ``timeout`` seconds is RequestTimedOut; a dead socket is NetworkException.
        With ``expect_response=False`` (acks=0 produce) it returns ``{}`` once written.
        """
        if self._error is not None:
            raise self._error
        waiter = _Waiter() if expect_response else None
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
                self._fail(NetworkException(f"connection to {self.address} broke: {exc}"))
                raise self._error from None

    async def _read_loop(self) -> None:
        conn = self._conn
        try:
            while True:
                data = await self._stream.receive_some(_RECEIVE_BYTES)
                if not data:
                    self._fail(NetworkException(f"broker {self.address} closed the connection"))
                    return
                for response in conn.receive_data(data):
                    waiter = response.waiter
                    if response.problem is None:
                        waiter.body = response.body
                    else:
                        waiter.error = NetworkException(
                            f"bad response from {self.address}: {response.problem}"
                        )
                    waiter.done.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._fail(NetworkException(f"connection to {self.address} broke: {exc}"))
        except ProtocolError as exc:
            self._fail(NetworkException(f"unreadable data from {self.address}: {exc}"))
        finally:
            self._fail(NetworkException(f"connection to {self.address} is closed"))
            with trio.CancelScope(shield=True):
                await self._stream.aclose()

    def _fail(self, error: KafkaError) -> None:
        """Mark the connection dead and wake every waiting caller with ``error``."""
        if self._error is None:
            self._error = error
        for waiter in self._conn.fail_all():
            waiter.error = self._error
            waiter.done.set()
        self._closed.set()

    async def aclose(self) -> None:
        self._fail(NetworkException(f"connection to {self.address} was closed by the client"))
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
