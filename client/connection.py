"""One TCP connection to one broker, with many requests in flight.

Requests are written as they come (a lock keeps frames whole) and a reader task
matches responses to callers by correlation id, so a slow long-poll fetch never
holds up a produce on the same socket. When the socket dies every caller still
waiting gets a NetworkException instead of hanging.
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any

import trio

from protocol import FrameDecoder, api_name, decode_response_envelope, encode_request
from protocol.codec import validate_response
from protocol.errors import (
    BrokerNotAvailable,
    KafkaError,
    NetworkException,
    ProtocolError,
    RequestTimedOut,
    raise_for,
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


class _Pending:
    """A caller waiting for one response: one Event per request, never per record."""

    __slots__ = ("api_key", "body", "done", "error", "version")

    def __init__(self, api_key: int, version: int) -> None:
        self.api_key = api_key
        self.version = version
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
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
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
        return len(self._pending)

    async def request(
        self,
        api_key: int,
        body: dict,
        version: int = 0,
        timeout: float | None = None,
        expect_response: bool = True,
    ) -> dict:
        """Send one request and return its validated response body.

        A top-level ``error_code`` raises the exception named after it; no response within
        ``timeout`` seconds is RequestTimedOut; a dead socket is NetworkException.
        With ``expect_response=False`` (acks=0 produce) it returns ``{}`` once written.
        """
        if self._error is not None:
            raise self._error
        corr = next(self._ids) & 0x7FFFFFFF
        frame = encode_request(api_key, version, corr, self.client_id, body)
        pending = None
        if expect_response:
            pending = self._pending[corr] = _Pending(api_key, version)
        try:
            await self._send(frame)
            if pending is None:
                return {}
            with trio.move_on_after(math.inf if timeout is None else timeout):
                await pending.done.wait()
        finally:
            if pending is not None and not pending.done.is_set():
                self._pending.pop(corr, None)
        if pending.error is not None:
            raise pending.error
        if pending.body is None:
            raise RequestTimedOut(
                f"no {api_name(api_key)} response from {self.address} within {timeout:g}s"
            )
        body = pending.body
        if body.get("error_code"):
            raise_for(body["error_code"], body.get("error_message") or "")
        return body

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
        decoder = FrameDecoder()
        try:
            while True:
                data = await self._stream.receive_some(_RECEIVE_BYTES)
                if not data:
                    self._fail(NetworkException(f"broker {self.address} closed the connection"))
                    return
                for payload in decoder.feed(data):
                    self._deliver(payload)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._fail(NetworkException(f"connection to {self.address} broke: {exc}"))
        except ProtocolError as exc:
            self._fail(NetworkException(f"unreadable data from {self.address}: {exc}"))
        finally:
            self._fail(NetworkException(f"connection to {self.address} is closed"))
            with trio.CancelScope(shield=True):
                await self._stream.aclose()

    def _deliver(self, payload: bytes) -> None:
        corr, raw = decode_response_envelope(payload)
        pending = self._pending.pop(corr, None)
        if pending is None:
            return  # the caller gave up (timeout or cancel); drop the late answer
        try:
            pending.body = validate_response(pending.api_key, pending.version, raw)
        except ProtocolError as exc:
            pending.error = NetworkException(f"bad response from {self.address}: {exc}")
        pending.done.set()

    def _fail(self, error: KafkaError) -> None:
        """Mark the connection dead and wake every waiting caller with ``error``."""
        if self._error is None:
            self._error = error
        pending, self._pending = self._pending, {}
        for p in pending.values():
            p.error = self._error
            p.done.set()
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
