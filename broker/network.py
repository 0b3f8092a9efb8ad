"""One trio task per connection: decode frames, dispatch, write responses.

Requests on a connection are *dispatched* in arrival order (so two produces on one
connection append in order), but a request that parks in a purgatory answers
later, from its completion (broker/pending.py); clients match responses by
correlation id. An answer is written at once when nothing is queued, the answers to one
read's pipelined requests in one write; a writer task drains only what the socket did
not take (broker/outbox.py). Only an unparseable frame, an idle timeout or a client
that stops reading its responses closes the connection; everything else gets an error
response.

Limits (Kafka's SocketServer): at ``max.connections`` the acceptor stops accepting
until a connection closes; a connection over ``max.connections.per.ip`` is closed at
once; each connection's queued answers are bounded (broker/outbox.py).
"""

from __future__ import annotations

import errno
import math
import os
import resource
import time
from collections import defaultdict
from typing import Any

import trio

from protocol import (
    FrameDecoder,
    ProtocolError,
    decode_request_envelope,
    encode_response,
    error_body,
    validate_request,
)
from protocol.errors import ErrorCode, InvalidRequest, UnsupportedVersion

from .outbox import Outbox
from .pending import PendingResponse
from .request_metrics import RequestMetrics
from .session import ConnectionSession

_now = time.monotonic

_RECV_BYTES = 1 << 18  # one read's most; the buffer is shared by every connection
_FRAMES_PER_TURN = 32
# What a parked request costs besides its answer (its task, operation and pending
# response): charged to the connection's budget, so a client cannot park without bound.
_PARKED_BYTES = 4096
# accept(2) errors that mean "no capacity now": retry after a pause (as trio.serve_listeners).
_ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


def max_connections_for(configured: int) -> int:
    """``max.connections``, with -1 derived from the open-file limit.

    Every connection is a file descriptor, and so is every open segment and index: keep a
    fifth of the soft RLIMIT_NOFILE (at least 256) for files, so accepting never starves
    storage of descriptors (EMFILE) and the broker keeps serving the connections it has.
    """
    if configured > 0:
        return configured
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 2**31 - 1
    return max(16, soft - max(256, soft // 5))


def _answer_when_done(
    correlation_id: int,
    pending: PendingResponse,
    outbox: Outbox,
    reserved: int,
    log: Any,
    timing: tuple[RequestMetrics, int, float, float, float] | None,
) -> None:
    """Queue a parked request's answer from its completion, in the same turn."""

    def answer(body: dict) -> None:
        outbox.release(reserved)
        try:
            frame = encode_response(correlation_id, body)
        except Exception:  # never let one answer break the purgatory pass completing it
            log.exception("response_encoding_failed", correlation_id=correlation_id)
            frame = encode_response(
                correlation_id, error_body(ErrorCode.UNKNOWN_SERVER_ERROR, "unencodable answer")
            )
        outbox.put(frame)
        if timing is not None:
            metrics, api_key, received, started, parked = timing
            done = _now()
            metrics.record(
                api_key, started - received, parked - started, done - parked, done - received
            )

    pending.add_done_callback(answer)


_DISCONNECTS = (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError)


def is_disconnect(exc: BaseException) -> bool:
    """True if ``exc`` (or every leaf of an exception group) is a peer going away."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_disconnect(e) for e in exc.exceptions)
    return isinstance(exc, _DISCONNECTS)


class ConnectionHandler:
    """Accepts connections within the limits and serves each one (the broker's SocketServer)."""

    def __init__(
        self,
        dispatcher: Any,
        *,
        max_frame_bytes: int,
        idle_ms: int,
        logger: Any,
        max_connections: int = 2**31 - 1,
        max_connections_per_ip: int = 2**31 - 1,
        queued_response_bytes: int = 1 << 25,
        send_stall_ms: int = 60000,
        metrics: RequestMetrics | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.max_frame_bytes = max_frame_bytes
        self.idle_s = idle_ms / 1000
        self.log = logger
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self.queued_response_bytes = queued_response_bytes
        self.send_stall_s = send_stall_ms / 1000
        self.open_connections = 0
        self.refused_connections = 0
        self._per_ip: defaultdict[str, int] = defaultdict(int)
        self._slot_free = trio.lowlevel.ParkingLot()
        # Every read lands here and is copied out by the connection's FrameDecoder before
        # anything awaits, so one buffer serves all: os.read(fd, 256 KiB) allocated and
        # shrank a 256 KiB bytes object per read, ~9 us of a ~10 us read (measured).
        self._received = bytearray(_RECV_BYTES)
        self._received_into = (self._received,)
        self._received_view = memoryview(self._received)

    # --- accepting --------------------------------------------------------------------------

    async def serve(self, listeners: list[trio.SocketListener]) -> None:
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept_loop, listener, nursery)

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        async with listener:
            while True:
                if self.open_connections >= self.max_connections:
                    # Kafka's acceptor: at max.connections, stop accepting until one closes.
                    # New clients wait in the listen backlog; served ones are not disturbed.
                    self.log.warning("max_connections_reached", limit=self.max_connections)
                    while self.open_connections >= self.max_connections:
                        await self._slot_free.park()
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                        raise
                    self.log.error("accept_failed", error=errno.errorcode[exc.errno])
                    await trio.sleep(0.1)
                    continue
                try:
                    host, port = stream.socket.getpeername()[:2]
                except OSError:  # gone already
                    await trio.aclose_forcefully(stream)
                    continue
                if self._per_ip[host] >= self.max_connections_per_ip:
                    # Kafka's TooManyConnectionsException: closed at once, before any request.
                    self.refused_connections += 1
                    self.log.info(
                        "connection_refused_too_many_from_ip",
                        ip=host,
                        limit=self.max_connections_per_ip,
                    )
                    await trio.aclose_forcefully(stream)
                    continue
                # Counted here, not in the task: the next accept must see this connection.
                self._per_ip[host] += 1
                self.open_connections += 1
                nursery.start_soon(self._run, stream, host, f"{host}:{port}", nursery)

    # --- one connection ---------------------------------------------------------------------

    async def _run(
        self, stream: trio.SocketStream, host: str, peer: str, nursery: trio.Nursery
    ) -> None:
        """One connection, as one task: at 10,000 connections every object here is
        multiplied, so there is no nursery, bound logger or idle queue per connection (a
        writer task, when one is needed, runs in the server's nursery)."""
        session = ConnectionSession(peer)
        try:
            async with stream:
                await self._serve(stream, session, nursery)
        except Exception as exc:
            # Whatever one connection does, it must never take the broker down.
            if not is_disconnect(exc):
                self.log.error("connection_failed", peer=peer, exc_info=exc)
        finally:
            # Parked requests die with their connection (ReplicaManager registers them).
            session.close()
            self.open_connections -= 1
            left = self._per_ip[host] - 1
            if left:
                self._per_ip[host] = left
            else:
                del self._per_ip[host]
            self._slot_free.unpark()

    async def _serve(
        self, stream: trio.SocketStream, session: ConnectionSession, nursery: trio.Nursery
    ) -> None:
        decoder = FrameDecoder(self.max_frame_bytes)
        outbox = Outbox(self.queued_response_bytes, self.send_stall_s)
        # One scope for the connection's life: connections.max.idle.ms is its deadline, and
        # a writer whose client stopped reading cancels it.
        scope = trio.CancelScope(deadline=trio.current_time() + self.idle_s)
        outbox.attach(
            stream, lambda: nursery.start_soon(self._write, stream, outbox, scope, session.peer)
        )
        try:
            with scope:
                await self._read_loop(stream, decoder, outbox, session, scope)
        finally:
            # Before the socket closes and its descriptor can be reused: a writer still
            # running stops at its next frame, and a late answer is dropped.
            outbox.close()
        if scope.cancelled_caught and not outbox.stalled:
            self.log.info(
                "connection_idle_closed", peer=session.peer, idle_ms=int(self.idle_s * 1000)
            )

    async def _write(
        self, stream: trio.SocketStream, outbox: Outbox, scope: trio.CancelScope, peer: str
    ) -> None:
        try:
            if await outbox.run_writer(stream):
                return  # drained: the next frame put in the queue starts a writer again
        except Exception as exc:
            # The socket closed under a slow send (the connection ended): the read side
            # has finished it. Nothing may escape into the server's nursery.
            if not is_disconnect(exc):
                self.log.error("connection_write_failed", peer=peer, exc_info=exc)
            scope.cancel()
            return
        # Nothing was accepted by the client's socket for send_stall_s.
        outbox.stalled = True
        self.log.warning(
            "connection_closed_send_stalled",
            peer=peer,
            stall_ms=int(self.send_stall_s * 1000),
            queued_bytes=outbox.queued,
        )
        scope.cancel()

    async def _read_loop(
        self, stream, decoder, outbox: Outbox, session, idle: trio.CancelScope
    ) -> None:
        # Reads go straight to the non-blocking socket, under the connection's one cancel
        # scope (``idle``, deadline connections.max.idle.ms): a scope and trio's socket
        # wrapper per receive were the broker's largest cost with thousands of long-polling
        # connections (bench longpoll, py-spy). The deadline moves only once a tenth of the
        # idle time has passed since it last did (moving it at every wait left trio's
        # deadline heap a stale entry per request, 7 % of the broker), so an idle
        # connection is closed after 90 to 100 % of connections.max.idle.ms.
        fd = stream.socket.fileno()
        idle_s = self.idle_s
        slack = idle_s / 10
        received_into = self._received_into  # shared, as the buffer is
        received_view = self._received_view
        drained = False  # the last read was short: the socket had nothing more just then
        while True:
            # Backpressure: take no more requests while this connection's answers pile up.
            if outbox.full:
                idle.deadline = math.inf
                await outbox.wait_room()
                idle.deadline = trio.current_time() + idle_s
            if drained:
                # Wait before reading again: a read of a socket just found empty fails,
                # a syscall and an exception per request (bench longpoll, py-spy).
                now = trio.current_time()
                if idle.deadline - now < idle_s - slack:
                    idle.deadline = now + idle_s
                await trio.lowlevel.wait_readable(fd)
            try:
                count = os.readv(fd, received_into)
                received = _now()
            except BlockingIOError:
                drained = True
                continue
            if not count:
                return
            drained = count < _RECV_BYTES
            try:
                frames = decoder.feed(received_view[:count])
            except ProtocolError as exc:
                self.log.warning("connection_closed_bad_frame", peer=session.peer, error=str(exc))
                return
            # The answers to one read's requests leave together (Outbox.cork); every
            # await below is preceded by uncork, so nothing held waits with it.
            outbox.cork()
            try:
                for n, payload in enumerate(frames, 1):
                    if outbox.full:  # checked first: the common case costs no call
                        outbox.uncork()
                        idle.deadline = math.inf
                        await outbox.wait_room()
                        idle.deadline = trio.current_time() + idle_s
                        outbox.cork()
                    if not self._one(payload, outbox, session, received):
                        return
                    if not n % _FRAMES_PER_TURN:
                        # A 256 KiB read can hold thousands of small requests: let the
                        # others (and expired operations) run in between.
                        outbox.uncork()
                        await trio.lowlevel.checkpoint()
                        outbox.cork()
            finally:
                outbox.uncork()
            if not drained:
                # More is waiting: let writers and parked requests run between bursts
                # from a fast client (a drained socket's wait_readable yields anyway).
                await trio.lowlevel.checkpoint()

    def _one(self, payload: bytes, outbox: Outbox, session, received: float) -> bool:
        log = self.log
        try:
            header, raw = decode_request_envelope(payload)
        except ProtocolError as exc:
            log.warning("connection_closed_bad_request", peer=session.peer, error=str(exc))
            return False
        try:
            body = validate_request(header, raw)
        except (InvalidRequest, UnsupportedVersion) as exc:
            log.info(
                "request_rejected",
                peer=session.peer,
                api_key=header.api_key,
                api_version=header.api_version,
                error=exc.code.name,
                reason=exc.message,
            )
            outbox.put(encode_response(header.correlation_id, error_body(exc.code, exc.message)))
            return True
        started = _now()
        try:
            result = self.dispatcher.handle(header, body, session)
        except Exception as exc:
            log.exception("request_failed", peer=session.peer, api_key=header.api_key)
            result = error_body(ErrorCode.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
        metrics = self.metrics
        if isinstance(result, PendingResponse):
            # Charge the most it may answer now, so many parked fetches completing at once
            # cannot overshoot the budget.
            reserved = max(result.max_bytes, _PARKED_BYTES)
            outbox.reserve(reserved)
            timing = None
            if metrics is not None:
                timing = (metrics, header.api_key, received, started, _now())
            _answer_when_done(header.correlation_id, result, outbox, reserved, log, timing)
            return True
        if result is not None:
            outbox.put(encode_response(header.correlation_id, result))
        if metrics is not None:
            done = _now()
            metrics.record(header.api_key, started - received, done - started, 0.0, done - received)
        return True
