"""Broker-to-broker RPC: one request at a time over a lazily (re)opened connection.

Replica fetchers and controller pushes talk to other brokers with this. (The broker
never imports ``client``; this is the small part of a client a broker needs.)
Every failure surfaces as ``NetworkException`` naming the peer.
"""

from __future__ import annotations

import itertools

import trio

from protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    FrameDecoder,
    ProtocolError,
    api_name,
    decode_response_envelope,
    encode_request,
    raise_for,
    validate_response,
)
from protocol.errors import NetworkException


class PeerConnection:
    def __init__(
        self, host: str, port: int, client_id: str, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    ) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self.max_frame_bytes = max_frame_bytes
        self._stream: trio.SocketStream | None = None
        self._decoder = FrameDecoder(max_frame_bytes)
        self._lock = trio.Lock()
        self._ids = itertools.count(1)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.aclose()

    async def request(self, api_key: int, body: dict, *, timeout: float, version: int = 0) -> dict:
        """Send one request and return its validated body; top-level errors raise their class."""
        async with self._lock:
            try:
                with trio.fail_after(timeout):
                    body = await self._round_trip(api_key, version, body)
            except trio.TooSlowError:
                await self._reset()
                raise NetworkException(
                    f"{api_name(api_key)} to {self.address} timed out after {timeout}s"
                ) from None
            except (
                OSError,
                trio.BrokenResourceError,
                trio.ClosedResourceError,
                ProtocolError,
            ) as exc:
                await self._reset()
                raise NetworkException(
                    f"{api_name(api_key)} to {self.address} failed: {exc}"
                ) from None
        if set(body) <= {"error_code", "error_message"}:
            raise_for(body["error_code"], body.get("error_message") or "")
        return body

    async def _reset(self) -> None:
        stream, self._stream = self._stream, None
        self._decoder = FrameDecoder(self.max_frame_bytes)
        if stream is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _round_trip(self, api_key: int, version: int, body: dict) -> dict:
        if self._stream is None:
            self._stream = await trio.open_tcp_stream(self.host, self.port)
        correlation_id = next(self._ids) & 0x7FFFFFFF
        await self._stream.send_all(
            encode_request(api_key, version, correlation_id, self.client_id, body)
        )
        while True:
            data = await self._stream.receive_some(1 << 20)
            if not data:
                raise ProtocolError("connection closed by peer")
            frames = self._decoder.feed(data)
            if frames:
                if len(frames) > 1:
                    raise ProtocolError("unexpected extra response")
                corr, raw = decode_response_envelope(frames[0])
                if corr != correlation_id:
                    raise ProtocolError(f"correlation id {corr} does not match {correlation_id}")
                return validate_response(api_key, version, raw)
