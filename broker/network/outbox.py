"""One connection's responses on their way out, counted in bytes: the broker's backpressure.

A client that pipelines requests and never reads its responses must not make the broker
buffer them without bound (issue 11: four such connections took RSS from 38 MB to
1.5 GB). Kafka mutes a channel while its response is in flight; we keep pipelining
but count what a connection costs: the bytes of responses queued here plus the most its
parked requests may still answer (``reserve``). Past ``limit`` the reactor stops
reading that connection (broker/network/socket_server.py) until ``on_room`` says it has drained, so
the client's own socket buffer fills and TCP slows it down. A connection always has
room for one request, so a response bigger than the limit still goes out.

A client that stops reading altogether would hold its queue forever: the writer sends
in slices and gives up (the connection is closed) when one slice makes no progress for
``stall_s``.

The queue exists only while used: with ten thousand mostly idle connections, an empty
deque (768 B) was ~1 KB a connection.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable

import trio

from minibroker.broker.network.parts import PartsFrame

# Small frames are joined into one send (fewer syscalls); big ones go out as slices of a
# memoryview, never copied, each slice under the stall timeout.
_COALESCE_BYTES = 1 << 18
_COALESCE_FRAMES = 64
_SEND_SLICE = 1 << 18


class Outbox:
    __slots__ = (
        "_busy",
        "_closed",
        "_corked",
        "_fd",
        "_frames",
        "_start_writer",
        "limit",
        "on_room",
        "queued",
        "reserved",
        "stall_s",
    )

    def __init__(self, limit: int, stall_s: float) -> None:
        self.limit = limit
        self.stall_s = stall_s
        self._fd = -1  # the socket, once attached to one
        self._busy = False  # a writer task is draining the queue
        self._closed = False
        self._corked = False  # answers to one burst of requests: queue, write once
        self._start_writer: Callable[[], None] | None = None
        # None while nothing waits (``not self._frames`` reads the same either way).
        self._frames: deque[bytes | memoryview | PartsFrame] | None = None
        self.queued = 0  # bytes in _frames or being written now
        self.reserved = 0  # bytes promised to parked requests, not answered yet
        # Called when a full connection has room again (the reactor reads it again).
        self.on_room: Callable[[], None] | None = None

    def attach(self, stream: trio.abc.SendStream, start_writer: Callable[[], None]) -> None:
        """Write to ``stream``; ``start_writer()`` starts a task running ``run_writer``.

        A writer task exists only while something waits to be sent: most answers are
        written by ``put`` itself, so an idle or long-polling connection costs no task
        for writing (with 10,000 connections, one task fewer each).
        """
        sock = getattr(stream, "socket", None)  # memory streams (tests) get no fast path
        self._fd = sock.fileno() if sock is not None else -1
        self._start_writer = start_writer

    def close(self) -> None:
        """The connection is ending: later answers (a parked request completing as its
        connection goes) are dropped, never written to a descriptor that may already
        belong to a new connection."""
        self._closed = True
        self._fd = -1
        self._start_writer = None
        if self._frames is not None:
            self._frames.clear()  # a writer mid-send stops at its next frame
        self._frames = None
        self.queued = 0

    @property
    def full(self) -> bool:
        return self.queued + self.reserved >= self.limit

    def put(self, frame: bytes | PartsFrame) -> None:
        """Queue ``frame``; when nothing is queued or being sent, write it at once.

        Written in the caller's turn (the read loop answering, or a purgatory completing a
        parked request), a frame costs no wake-up of the writer task: with thousands of
        long polls expiring in one tick that wake-up was the larger part of each answer.
        What the socket does not take now is queued for the writer. A frame in parts
        (broker/network/parts.py) goes the same way, its rest queued as it is.
        """
        if self._closed:
            return
        if self._fd >= 0 and not self._frames and not self._busy and not self._corked:
            if type(frame) is PartsFrame:
                try:
                    if frame.send(self._fd):
                        return
                except OSError:  # the peer is gone, or a file was cut: the writer will see
                    pass
            else:
                try:
                    sent = os.write(self._fd, frame)
                except OSError:  # would block, or the peer is gone: the writer will see
                    sent = 0
                if sent == len(frame):
                    return
                if sent:
                    frame = memoryview(frame)[sent:]
        if self._frames is None:
            self._frames = deque()
        self._frames.append(frame)
        self.queued += len(frame)
        if not self._busy and not self._corked and self._start_writer is not None:
            self._busy = True
            self._start_writer()

    def cork(self) -> None:
        """Hold the answers to a burst of pipelined requests (one read's worth) so they
        leave in one write: written one by one, 64 answers were 64 syscalls here and 64
        wake-ups for the client (bench requests: -10-15 % against one coalesced write)."""
        self._corked = True

    def uncork(self) -> None:
        """End the burst: one answer goes the direct way, several to a writer that joins
        them. Call it before anything awaits, or the held answers would wait too."""
        self._corked = False
        frames = self._frames
        if not frames or self._busy or self._closed:
            return
        if len(frames) == 1:
            frame = frames.popleft()
            self.queued -= len(frame)
            self.put(frame)
        elif self._start_writer is not None:
            self._busy = True
            self._start_writer()

    def reserve(self, nbytes: int) -> None:
        self.reserved += nbytes

    def release(self, nbytes: int) -> None:
        self.reserved -= nbytes
        self._wake_reader()

    def _wake_reader(self) -> None:
        if self.on_room is not None and not self.full:
            self.on_room()

    async def run_writer(self, stream: trio.abc.SendStream) -> bool:
        """Send queued frames until none is left (True), or until the client stopped
        reading (False: a slice made no progress for ``stall_s``)."""
        self._busy = True
        frames = self._frames
        fd = self._fd
        while frames:
            first = frames.popleft()
            if type(first) is PartsFrame:
                size = len(first)
                if not await self._send_parts(stream, fd, first):
                    return False
                self.queued -= size
                self._wake_reader()
                continue
            if len(first) >= _COALESCE_BYTES:
                chunk: bytes | memoryview = first
            else:
                parts = [first]
                size = len(first)
                while (
                    frames
                    and len(parts) < _COALESCE_FRAMES
                    and size < _COALESCE_BYTES
                    and type(frames[0]) is not PartsFrame  # sent in place, never joined
                ):
                    part = frames.popleft()
                    parts.append(part)
                    size += len(part)
                chunk = first if len(parts) == 1 else b"".join(parts)
            if not await self._send(stream, fd, chunk):
                return False
            self.queued -= len(chunk)
            self._wake_reader()
        if self._frames is frames:  # not closed meanwhile: drop the emptied queue
            self._frames = None
        self._busy = False
        return True

    async def _send_parts(self, stream: trio.abc.SendStream, fd: int, frame: PartsFrame) -> bool:
        """Send a frame in parts, waiting for room while the socket is full; False when
        the socket took nothing for ``stall_s`` (as ``_send``'s slices)."""
        if fd < 0:
            return await self._send(stream, fd, frame.flatten())
        sock = stream.socket
        while not frame.send(fd):
            with trio.move_on_after(self.stall_s) as stalled:
                await trio.lowlevel.wait_writable(sock)
            if stalled.cancelled_caught:
                return False
            if self._closed:  # the descriptor may belong to another connection by now
                raise trio.ClosedResourceError("connection closed during a send")
        return True

    async def _send(self, stream: trio.abc.SendStream, fd: int, chunk: bytes | memoryview) -> bool:
        # Fast path, measured (bench longpoll): nearly every answer fits the socket buffer,
        # so one write(2) on the non-blocking socket sends it without trio's per-send
        # machinery (a cancel scope, the stream's conflict detector, error translation),
        # which was a quarter of the broker's time with thousands of long polls. Only what
        # does not fit goes the slow way, in slices under the stall timeout.
        sent = 0
        if fd >= 0:
            try:
                sent = os.write(fd, chunk)
            except BlockingIOError:
                pass
        if sent == len(chunk):
            return True
        view = memoryview(chunk)[sent:]
        for start in range(0, len(view), _SEND_SLICE):
            with trio.move_on_after(self.stall_s) as stalled:
                await stream.send_all(view[start : start + _SEND_SLICE])
            if stalled.cancelled_caught:
                return False
        return True
