"""One trio task per connection: decode frames, dispatch, write responses.

Requests on a connection are *dispatched* in arrival order (so two produces on one
connection append in order), but a request that parks in a purgatory answers
later from its own task; clients match responses by correlation id. A writer
task batches ready responses into one send. Only an unparseable frame or an
idle timeout closes the connection; everything else gets an error response.
"""

from __future__ import annotations

from typing import Any

import trio

from protocol import (
    FrameDecoder,
    ProtocolError,
    decode_request_envelope,
    encode_response,
    error_body,
    error_for_exception,
    validate_request,
)
from protocol.errors import ErrorCode

from .pending import PendingResponse
from .session import ConnectionSession

_RECV_BYTES = 1 << 18
_MAX_COALESCE = 64


async def _writer(stream: trio.abc.Stream, responses: trio.MemoryReceiveChannel) -> None:
    async for first in responses:
        chunks = [first]
        while len(chunks) < _MAX_COALESCE:
            try:
                chunks.append(responses.receive_nowait())
            except trio.WouldBlock:
                break
        await stream.send_all(chunks[0] if len(chunks) == 1 else b"".join(chunks))


async def _answer_later(
    correlation_id: int, pending: PendingResponse, responses: trio.MemorySendChannel
) -> None:
    body = await pending.wait()
    await responses.send(encode_response(correlation_id, body))


_DISCONNECTS = (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError)


def is_disconnect(exc: BaseException) -> bool:
    """True if ``exc`` (or every leaf of an exception group) is a peer going away."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_disconnect(e) for e in exc.exceptions)
    return isinstance(exc, _DISCONNECTS)


class ConnectionHandler:
    def __init__(self, dispatcher: Any, *, max_frame_bytes: int, idle_ms: int, logger: Any) -> None:
        self.dispatcher = dispatcher
        self.max_frame_bytes = max_frame_bytes
        self.idle_s = idle_ms / 1000
        self.log = logger
        self.open_connections = 0

    async def __call__(self, stream: trio.SocketStream) -> None:
        try:
            peer = "{}:{}".format(*stream.socket.getpeername()[:2])
        except OSError:
            peer = "?"
        log = self.log.bind(peer=peer)
        session = ConnectionSession(peer)
        self.open_connections += 1
        try:
            async with stream:
                await self._serve(stream, session, log)
        except Exception as exc:
            # Whatever one connection does, it must never take the broker down: a peer
            # that resets mid-request arrives here wrapped in an ExceptionGroup.
            if not is_disconnect(exc):
                log.error("connection_failed", exc_info=exc)
        finally:
            self.open_connections -= 1
            session.close()

    async def _serve(self, stream: trio.SocketStream, session: ConnectionSession, log: Any) -> None:
        decoder = FrameDecoder(self.max_frame_bytes)
        send, receive = trio.open_memory_channel(_MAX_COALESCE * 4)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_writer, stream, receive)
            try:
                await self._read_loop(stream, decoder, send, nursery, session, log)
            finally:
                nursery.cancel_scope.cancel()

    async def _read_loop(self, stream, decoder, send, nursery, session, log) -> None:
        while True:
            with trio.move_on_after(self.idle_s) as idle:
                data = await stream.receive_some(_RECV_BYTES)
            if idle.cancelled_caught:
                log.info("connection_idle_closed", idle_ms=int(self.idle_s * 1000))
                return
            if not data:
                return
            try:
                frames = decoder.feed(data)
            except ProtocolError as exc:
                log.warning("connection_closed_bad_frame", error=str(exc))
                return
            for payload in frames:
                if not await self._one(payload, send, nursery, session, log):
                    return
            # Let writers and parked requests run between bursts from a fast client.
            await trio.lowlevel.checkpoint()

    async def _one(self, payload: bytes, send, nursery, session, log) -> bool:
        try:
            header, raw = decode_request_envelope(payload)
        except ProtocolError as exc:
            log.warning("connection_closed_bad_request", error=str(exc))
            return False
        try:
            body = validate_request(header, raw)
        except ProtocolError as exc:
            code = error_for_exception(exc)
            log.info(
                "request_rejected",
                api_key=header.api_key,
                api_version=header.api_version,
                error=code.name,
                reason=str(exc),
            )
            await send.send(encode_response(header.correlation_id, error_body(code, str(exc))))
            return True
        try:
            result = self.dispatcher.handle(header, body, session)
        except Exception as exc:
            log.exception("request_failed", api_key=header.api_key)
            result = error_body(ErrorCode.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
        if result is None:
            return True
        if isinstance(result, PendingResponse):
            nursery.start_soon(_answer_later, header.correlation_id, result, send)
        else:
            await send.send(encode_response(header.correlation_id, result))
        return True
