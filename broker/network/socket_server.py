"""The broker's SocketServer: accept, read every connection from one selector loop,
decode frames, dispatch, write responses.

Requests on a connection are *dispatched* in arrival order (so two produces on one
connection append in order), but a request that parks in a purgatory answers
later, from its completion (broker/network/pending.py); clients match responses by
correlation id. An answer is written at once when nothing is queued, the answers to one
read's pipelined requests in one write; a writer task drains only what the socket did
not take (broker/network/outbox.py). Only an unparseable frame, an idle timeout or a client
that stops reading its responses closes the connection; everything else gets an error
response.

The selector is the OS's own (broker/network/poller.py: epoll on Linux, kqueue on macOS
and BSD, plain poll elsewhere); a muted connection is still watched for its client
hanging up, so what it parked is freed at once.

Limits (Kafka's SocketServer): at ``max.connections`` the acceptor stops accepting
until a connection closes; a connection over ``max.connections.per.ip`` is closed at
once; each connection's queued answers are bounded (broker/network/outbox.py).
"""

from __future__ import annotations

import errno
import os
import time
from collections import defaultdict, deque
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import trio

from minibroker.broker.common.descriptors import fd_limit
from minibroker.broker.common.file_region import FileRegion, RegionBody
from minibroker.broker.network.outbox import Outbox
from minibroker.broker.network.parts import PartsFrame
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.network.poller import Poller, choose_backend, open_poller
from minibroker.broker.network.request_metrics import RequestMetrics
from minibroker.broker.network.session import ConnectionSession
from minibroker.protocol import (
    ApiKey,
    FrameDecoder,
    ProtocolError,
    RequestHeader,
    decode_request_body,
    decode_request_envelope,
    encode_packed_response,
    encode_response,
    encode_response_parts,
    error_body,
    pack,
    split_request_envelope,
    validate_request,
)
from minibroker.protocol.errors import (
    ErrorCode,
    FetchSessionIdNotFound,
    InvalidFetchSessionEpoch,
    InvalidRequest,
    KafkaError,
    UnsupportedVersion,
)

_now = time.monotonic

_RECV_BYTES = 1 << 18  # one read's most; the buffer is shared by every connection
_FRAMES_PER_TURN = 32
_FETCH_KEY = bytes([ApiKey.FETCH])  # a positive fixint: the envelope's second byte
_FETCHES_KEPT = 1024  # distinct Fetch bodies kept prepared (a hostile mix only clears it)
# What decoding and preparing a request may refuse it for, answered with that error.
_REFUSED_BEFORE_DISPATCH = (
    InvalidRequest,
    UnsupportedVersion,
    FetchSessionIdNotFound,
    InvalidFetchSessionEpoch,
)
# A pass of the reactor serves ready sockets for about _PASS_BUDGET_S, then yields: the
# timer's hand-offs (unmutes, expiries), accepts and writers wait at most that long. A
# fixed 256 sockets a pass was 13-25 ms of produces with 10,000 throttled connections:
# the broker's own unmute lateness averaged 31-57 ms, 4-6 ms with the budget (bench
# quotas --sockets 10000, alternated in one sitting).
_EVENTS_PER_PASS = 256  # the most ready sockets one pass takes
_EVENTS_PER_PASS_MIN = 8  # the fewest: each pass costs a trio checkpoint and a poll
_PASS_BUDGET_S = 0.002
_IDLE_SWEEPS = 10  # connections.max.idle.ms is swept this many times over
# What a parked request costs besides its answer (its task, operation and pending
# response): charged to the connection's budget, so a client cannot park without bound.
_PARKED_BYTES = 4096
# accept(2) errors that mean "no capacity now": retry after a pause (as trio.serve_listeners).
_ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


def next_pass_size(size: int, served: int, spent_s: float) -> int:
    """How many ready sockets the reactor's next pass takes: as many as fit in
    _PASS_BUDGET_S at the last pass's cost per socket (``size`` again if it served none)."""
    if served <= 0 or spent_s <= 0:
        return size
    fit = int(_PASS_BUDGET_S * served / spent_s)
    return max(_EVENTS_PER_PASS_MIN, min(_EVENTS_PER_PASS, fit))


class Dispatcher(Protocol):
    """What the socket server asks of the request handler (Kafka's KafkaApis)."""

    def prepare(self, header: RequestHeader, body: dict) -> Any:
        """A validated body as the handler takes it (InvalidRequest if it cannot be);
        kept by the body's bytes for Fetch, so it must not change once made."""

    def handle(
        self, header: RequestHeader, body: Any, session: ConnectionSession
    ) -> dict | PendingResponse | None:
        """An answer now, a parked one, or None (acks=0: no answer)."""


def _open_spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


class _SharedBodyPacker:
    """Packs answers; the same body object twice running is packed once.

    Identical long polls completing together share one answer body (ReplicaManager
    _consumer_read): 5,000 woken by one append are one packing and 5,000 splices of a
    correlation id; so are pipelined empty fetches and ApiVersions (one constant body).
    Answers are never changed once made, so identity is enough.
    """

    __slots__ = ("_body", "_packed")

    def __init__(self) -> None:
        self._body: dict | None = None
        self._packed = b""

    def __call__(self, correlation_id: int, body: dict) -> bytes | PartsFrame:
        if type(body) is RegionBody:
            # Records sent from the segment files (a follower's fetch): never shared, as
            # each region is one send's (broker/network/parts.py).
            return PartsFrame(encode_response_parts(correlation_id, body, FileRegion))
        if body is not self._body:
            self._packed = pack(body)
            self._body = body
        return encode_packed_response(correlation_id, self._packed)


class _ParkedAnswer:
    """Answers one parked request from its completion, in the same turn.

    An object, not a closure: a closure over these seven names was eight objects per
    parked request for the cyclic collector to walk; this is one.
    """

    __slots__ = (
        "correlation_id",
        "frame",
        "in_order",
        "log",
        "outbox",
        "packer",
        "reserved",
        "timing",
    )

    def __init__(
        self,
        correlation_id: int,
        outbox: Outbox,
        reserved: int,
        log: Any,
        timing: tuple[RequestMetrics, int, float, float, float] | None,
        packer: _SharedBodyPacker,
        in_order: Callable[[], None] | None = None,
    ) -> None:
        self.correlation_id = correlation_id
        self.outbox = outbox
        self.reserved = reserved
        self.log = log
        self.timing = timing
        self.packer = packer
        # An in-order connection keeps this answer in its queue of answers owed (see
        # _run): ``frame`` is set when it is made, and ``in_order()`` sends what may go.
        self.in_order = in_order
        self.frame: bytes | None = None

    def __call__(self, body: dict) -> None:
        outbox = self.outbox
        outbox.release(self.reserved)
        try:
            frame = self.packer(self.correlation_id, body)
        except Exception:  # never let one answer break the purgatory pass completing it
            self.log.exception("response_encoding_failed", correlation_id=self.correlation_id)
            frame = encode_response(
                self.correlation_id,
                error_body(ErrorCode.UNKNOWN_SERVER_ERROR, "unencodable answer"),
            )
        if self.in_order is None:
            outbox.put(frame)
        else:
            outbox.reserve(len(frame))  # held until sent: counted as a queued answer
            self.frame = frame
            self.in_order()
        timing = self.timing
        if timing is not None:
            metrics, api_key, received, started, parked = timing
            done = _now()
            metrics.record(
                api_key, started - received, parked - started, done - parked, done - received
            )


_DISCONNECTS = (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError)


def is_disconnect(exc: BaseException) -> bool:
    """True if ``exc`` (or every leaf of an exception group) is a peer going away."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_disconnect(e) for e in exc.exceptions)
    return isinstance(exc, _DISCONNECTS)


class _Connection:
    """One client connection: what the reactor keeps per socket (no task, no scope)."""

    __slots__ = (
        "backlog",
        "closed",
        "codec",
        "decoder",
        "fd",
        "held",
        "host",
        "idle_sweeps",
        "muted",
        "outbox",
        "overtakable",
        "owed",
        "session",
        "stream",
        "throttled",
    )

    def __init__(
        self, stream: trio.SocketStream, host: str, peer: str, handler, codec: Any = None
    ) -> None:
        self.stream = stream
        self.codec = codec  # None: our protocol; else the listener's (see ConnectionHandler)
        self.fd = stream.socket.fileno()
        self.host = host
        self.session = ConnectionSession(peer)
        self.decoder = FrameDecoder(handler.max_frame_bytes)
        self.outbox = Outbox(handler.queued_response_bytes, handler.send_stall_s)
        self.backlog: list | None = None  # frames read but not dispatched yet
        self.idle_sweeps = 0  # idle sweeps since the last read (see _idle_sweeper)
        self.muted = False  # not read while its answers pile up (backpressure)
        # A coded connection answers in request order. While one of its requests is
        # parked, the answers after it wait here (_ParkedAnswer, or a frame made already)
        # and ``held`` mutes it when a request that may not overtake comes next.
        self.owed: deque | None = None
        self.held = False
        self.overtakable = True  # every request owed is one the codec lets others overtake
        self.closed = False
        self.throttled = 0  # quota throttles not ended yet: not read until none is left


class ConnectionHandler:
    """Accepts connections within the limits and serves them all (the broker's SocketServer).

    Kafka's Processor: one selector loop reads every connection, instead of a task per
    connection. With thousands of long-polling connections a trio task per connection
    cost a task switch, an epoll re-registration and a wake-up per request; here one
    poller (level-triggered, each socket registered once) reports the readable
    sockets of a pass and each is read and dispatched in turn (bench longpoll, py-spy).
    ``poller`` is ``socket.poller``: auto, epoll, kqueue or poll (broker/network/poller.py).

    A listener may speak another protocol (the Kafka listener): ``serve`` takes it with
    a codec, and its connections go through this same path (limits, reactor, mute,
    parked answers, metrics); only decoding a request, dispatching it and encoding its
    answer are the codec's. A codec has ``decode(payload)`` -> ``(header, body)`` (a
    ProtocolError closes the connection; one carrying ``answer`` bytes is answered
    instead), ``dispatcher`` (``handle`` as ours) and ``packer(header)`` ->
    ``(correlation_id, body) -> frame``. A coded connection is answered in request
    order, as Kafka's protocol requires (its clients check each answer's correlation id
    against the oldest request in flight). While a request is parked, a next request the
    codec's ``overtakes(payload)`` allows (Kafka: a Produce) is still dispatched, its
    answer queued behind the parked one, as long as every request owed is one it allows
    too: a client's pipelined acks=all produces are appended at once and one replication
    round acknowledges them all, instead of one round each (bench kafka-clients). Any
    other request waits until every answer owed is sent, as Kafka's Processor mutes a
    channel with a request in flight.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        max_frame_bytes: int,
        idle_ms: int,
        logger: Any,
        max_connections: int = 2**31 - 1,
        connection_room: Callable[[], int] | None = None,
        max_connections_per_ip: int = 2**31 - 1,
        queued_response_bytes: int = 1 << 25,
        send_stall_ms: int = 60000,
        metrics: RequestMetrics | None = None,
        poller: str = "auto",
    ) -> None:
        self.dispatcher = dispatcher
        self.poller_name = choose_backend(poller)
        self.metrics = metrics
        self.max_frame_bytes = max_frame_bytes
        self.idle_s = idle_ms / 1000
        self.log = logger
        self.max_connections = max_connections
        # The descriptor budget's say (common/descriptors.py): fewer while partitions are open.
        self.connection_room = connection_room or (lambda: max_connections)
        self.max_connections_per_ip = max_connections_per_ip
        self.queued_response_bytes = queued_response_bytes
        self.send_stall_s = send_stall_ms / 1000
        self.open_connections = 0
        self.refused_connections = 0
        self.muted_connections = 0  # not read until their answers drain (backpressure)
        self.throttled_connections = 0  # muted by a quota's throttle (KIP-219)
        self._per_ip: defaultdict[str, int] = defaultdict(int)
        self._slot_free = trio.lowlevel.ParkingLot()
        self._connections: dict[int, _Connection] = {}  # by socket descriptor
        self._poller: Poller | None = None
        # Given up to accept (and close) a connection when descriptors run out.
        self._spare_fd: int | None = None
        # Connections with frames left over from a long read, served before new reads.
        self._backlogged: list[_Connection] = []
        self._nursery: trio.Nursery | None = None
        self._packer = _SharedBodyPacker()
        # Prepared Fetch requests by (version, body bytes): see _one.
        self._fetches: dict[tuple[int, bytes], Any] = {}
        # Every read lands here and is copied out by the connection's FrameDecoder before
        # anything else runs, so one buffer serves all: os.read(fd, 256 KiB) allocated and
        # shrank a 256 KiB bytes object per read, ~9 us of a ~10 us read (measured).
        self._received = bytearray(_RECV_BYTES)
        self._received_into = (self._received,)
        self._received_view = memoryview(self._received)

    # --- accepting --------------------------------------------------------------------------

    async def serve(
        self,
        listeners: list[trio.SocketListener],
        coded: list[tuple[trio.SocketListener, Any]] = (),
    ) -> None:
        """Serve our protocol on ``listeners``, and each of ``coded`` with its codec."""
        self._poller = open_poller(self.poller_name)
        self._spare_fd = _open_spare()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._reactor)
                nursery.start_soon(self._idle_sweeper)
                for listener in listeners:
                    nursery.start_soon(self._accept_loop, listener)
                for listener, codec in coded:
                    nursery.start_soon(self._accept_loop, listener, codec)
        finally:
            # Cancelled (shutdown) or failed: every connection ends with the server.
            for conn in list(self._connections.values()):
                self._close(conn)
            self._poller.close()
            if self._spare_fd is not None:
                os.close(self._spare_fd)

    async def _accept_loop(self, listener: trio.SocketListener, codec: Any = None) -> None:
        async with listener:
            while True:
                if self.open_connections >= self.connection_room():
                    await self._wait_for_a_slot()
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                        raise
                    await self._refuse_at_capacity(listener, exc)
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
                self._open(stream, host, f"{host}:{port}", codec)

    async def _wait_for_a_slot(self) -> None:
        """Kafka's acceptor: at max.connections, stop accepting until one closes. New
        clients wait in the listen backlog; served ones are not disturbed. The room also
        grows when partitions close, which wakes nobody: look again every second."""
        self.log.warning(
            "max_connections_reached",
            limit=self.connection_room(),
            configured=self.max_connections,
        )
        while self.open_connections >= self.connection_room():
            with trio.move_on_after(1):
                await self._slot_free.park()

    async def _refuse_at_capacity(self, listener: trio.SocketListener, exc: OSError) -> None:
        """Out of descriptors (EMFILE) or kernel memory: close the waiting connection.

        Left in the backlog it would make accept fail again at once, forever; a client
        waiting there learns nothing. The spare descriptor kept for this moment (as
        libuv and nginx keep one) is given up to accept it, it is closed with a log line
        naming the limit, and the spare is taken back. Nothing else is disturbed.
        """
        why = errno.errorcode.get(exc.errno, str(exc.errno))
        spare, self._spare_fd = self._spare_fd, None
        if spare is not None:
            os.close(spare)
            try:
                stream = await listener.accept()
            except OSError:
                stream = None
            if stream is not None:
                self.refused_connections += 1
                await trio.aclose_forcefully(stream)
        self.log.error(
            "connection_refused_descriptor_limit",
            error=why,
            fd_limit=fd_limit(),
            open_connections=self.open_connections,
            hint="raise `ulimit -n` before starting the broker",
        )
        self._spare_fd = _open_spare()
        if self._spare_fd is None or spare is None:
            await trio.sleep(0.1)  # no spare: let descriptors free up before trying again

    # --- connections ------------------------------------------------------------------------

    def _open(self, stream: trio.SocketStream, host: str, peer: str, codec: Any = None) -> None:
        conn = _Connection(stream, host, peer, self, codec)
        nursery = self._nursery
        conn.outbox.attach(stream, lambda: nursery.start_soon(self._write, conn))
        conn.outbox.on_room = lambda: self._unmute(conn)
        conn.session.throttle_hook = partial(self._throttle, conn)
        try:
            self._poller.register(conn.fd)
        except OSError as exc:  # out of kernel memory for poller entries: refuse this one
            self.log.error("connection_refused", peer=peer, error=str(exc))
            stream.socket.close()
            return
        self._per_ip[host] += 1
        self.open_connections += 1
        self._connections[conn.fd] = conn

    def _close(self, conn: _Connection) -> None:
        """End a connection (peer gone, bad frame, idle, stalled, shutdown), once."""
        if conn.closed:
            return
        conn.closed = True
        if conn.muted:
            self.muted_connections -= 1
        del self._connections[conn.fd]
        self._poller.unregister(conn.fd)
        # Before the socket closes and its descriptor can be reused: a writer still
        # running stops at its next frame, and a late answer is dropped.
        conn.outbox.close()
        conn.outbox.on_room = None  # it refers to conn: a cycle left to the collector
        conn.session.throttle_hook = None  # likewise; a throttle ending later finds None
        if conn.throttled:
            conn.throttled = 0
            self.throttled_connections -= 1
        conn.backlog = None
        conn.owed = None  # its parked answers refer back to conn: no cycle left behind
        # trio's close wakes a writer blocked on the socket (ClosedResourceError).
        conn.stream.socket.close()
        # Parked requests die with their connection (ReplicaManager registers them).
        conn.session.close()
        self.open_connections -= 1
        left = self._per_ip[conn.host] - 1
        if left:
            self._per_ip[conn.host] = left
        else:
            del self._per_ip[conn.host]
        self._slot_free.unpark()

    def _mute(self, conn: _Connection) -> None:
        # Backpressure (Kafka mutes the channel): read no more requests from this client
        # until its answers drain; its socket buffer fills and TCP slows it down. The
        # poller still reports the client hanging up (issue 25: a muted connection whose
        # client left held its parked fetches until max_wait_ms, its descriptor in
        # CLOSE_WAIT).
        if conn.muted:  # muted already, for another reason (a throttle, a held request)
            return
        conn.muted = True
        self.muted_connections += 1
        self._poller.mute(conn.fd)

    def _unmute(self, conn: _Connection) -> None:
        # Muted for two reasons (answers piling up, a request waiting for the answers owed
        # before it): read again only when neither holds.
        if not conn.muted or conn.closed or conn.held or conn.throttled or conn.outbox.full:
            return
        conn.muted = False
        self.muted_connections -= 1
        self._poller.unmute(conn.fd)
        conn.idle_sweeps = 0  # waiting for room is not idleness
        if conn.backlog:
            # Its socket may have nothing new to read: the reactor must run regardless.
            self._backlogged.append(conn)
            self._poller.wake()

    def _throttle(self, conn: _Connection, start: bool) -> None:
        """A quota throttle starts (``start``) or ends (Kafka's ThrottledChannel, KIP-219).

        The answer that carried the throttle time is already on its way; from here the
        connection is not read until every throttle on it has ended, so a client that
        ignores ``throttle_time_ms`` waits all the same. Its hang-up is still seen, as for
        any muted connection. The end comes from the shared timer (broker/quota/throttle.py).
        """
        if conn.closed:
            return
        if start:
            if not conn.throttled:
                self.throttled_connections += 1
            conn.throttled += 1
            self._mute(conn)
        else:
            conn.throttled -= 1
            if not conn.throttled:
                self.throttled_connections -= 1
                self._unmute(conn)

    def _send_owed(self, conn: _Connection) -> None:
        """A parked answer of ``conn`` is made: send every answer owed up to the first
        still parked; with none left owed, a held request may go. An answer waiting in
        ``owed`` is charged to the connection's send budget like a queued one, so a
        client pipelining behind a parked request is muted as any other."""
        owed = conn.owed
        outbox = conn.outbox
        while owed:
            head = owed[0]
            if type(head) is _ParkedAnswer:
                if head.frame is None:
                    return
                head = head.frame
            owed.popleft()
            outbox.release(len(head))
            outbox.put(head)
        conn.overtakable = True
        if conn.held:
            conn.held = False
            self._unmute(conn)

    @staticmethod
    def _put_in_order(conn: _Connection, frame: bytes) -> None:
        """An answer made now: sent, or queued (and charged) behind an answer still owed."""
        if conn.owed:
            conn.outbox.reserve(len(frame))
            conn.owed.append(frame)
        else:
            conn.outbox.put(frame)

    async def _write(self, conn: _Connection) -> None:
        """The writer for what the socket did not take at once (see Outbox)."""
        try:
            if await conn.outbox.run_writer(conn.stream):
                return  # drained: the next frame put in the queue starts a writer again
        except Exception as exc:
            # The socket closed under a slow send (the connection ended). Nothing may
            # escape into the server's nursery.
            if not is_disconnect(exc):
                self.log.error("connection_write_failed", peer=conn.session.peer, exc_info=exc)
            self._close(conn)
            return
        # Nothing was accepted by the client's socket for send_stall_s.
        self.log.warning(
            "connection_closed_send_stalled",
            peer=conn.session.peer,
            stall_ms=int(self.send_stall_s * 1000),
            queued_bytes=conn.outbox.queued,
        )
        self._close(conn)

    async def _idle_sweeper(self) -> None:
        """connections.max.idle.ms: one sweep a tenth of it apart, not a deadline per read
        (a deadline moved at every request was a heap entry per request in trio). A read
        zeroes the connection's count of sweeps, each sweep adds one, and the eleventh
        closes it: after 100 to 110 % of the idle time, measured by trio's clock alone
        (a read costs no clock call, and trio's MockClock tests it). A muted connection
        is waiting for its client to read, which the send-stall timeout bounds."""
        idle_ms = int(self.idle_s * 1000)
        while True:
            await trio.sleep(max(self.idle_s / _IDLE_SWEEPS, 0.01))
            idle = []
            for conn in self._connections.values():
                conn.idle_sweeps += 1
                if conn.idle_sweeps > _IDLE_SWEEPS and not conn.muted and not conn.outbox.queued:
                    idle.append(conn)
            for conn in idle:
                self.log.info("connection_idle_closed", peer=conn.session.peer, idle_ms=idle_ms)
                self._close(conn)

    # --- the reactor ------------------------------------------------------------------------

    async def _reactor(self) -> None:
        """Read every readable connection, a bounded pass at a time.

        A pass takes as many ready sockets as fit in _PASS_BUDGET_S (next_pass_size) and
        then yields, so expiring operations and replication run between passes; the
        level-triggered poller reports the rest on the next pass, in turn (Linux rotates
        epoll's ready list; the other backends rotate theirs).
        """
        poller = self._poller
        poll = poller.poll
        wait = poller.wait
        wakeup = poller.wakeup_fd
        connections = self._connections
        serve = self._serve_readable
        checkpoint = trio.lowlevel.checkpoint
        more = False
        size = _EVENTS_PER_PASS
        while True:
            if more or self._backlogged:
                await checkpoint()
            else:
                await wait()
            if self._backlogged:
                # Frames read earlier come before new reads.
                backlogged, self._backlogged = self._backlogged, []
                for conn in backlogged:
                    if not conn.closed and not conn.muted:
                        self._dispatch(conn)
            events = poll(size)
            more = len(events) == size
            started = _now()
            for fd, _ in events:
                conn = connections.get(fd)
                if conn is not None:
                    if conn.muted:
                        # A muted socket is reported only when its client hung up (the
                        # poller's contract): what it parked is cancelled now.
                        self.log.debug("connection_closed_muted_peer_gone", peer=conn.session.peer)
                        self._close(conn)
                    elif not conn.backlog:
                        try:
                            serve(conn)
                        except Exception as exc:
                            # Whatever one connection does, it must never take the broker
                            # down.
                            self._failed(conn, exc)
                elif fd == wakeup:
                    poller.woken()
            size = next_pass_size(size, len(events), _now() - started)

    def _serve_readable(self, conn: _Connection) -> None:
        try:
            count = os.readv(conn.fd, self._received_into)
        except BlockingIOError:
            return
        except OSError:  # reset by the peer
            self._close(conn)
            return
        if not count:
            self._close(conn)
            return
        conn.idle_sweeps = 0
        received = _now()
        try:
            frames = conn.decoder.feed(self._received_view[:count])
        except ProtocolError as exc:
            self.log.warning("connection_closed_bad_frame", peer=conn.session.peer, error=str(exc))
            self._close(conn)
            return
        if frames:
            conn.backlog = frames
            self._dispatch(conn, received)

    def _dispatch(self, conn: _Connection, received: float | None = None) -> None:
        """Dispatch the connection's read frames in arrival order, up to a pass's share.

        The answers to one read's requests leave together (Outbox.cork). A read can hold
        thousands of small requests: after _FRAMES_PER_TURN the rest waits for the next
        pass, so other connections and expiring operations run in between.
        """
        frames = conn.backlog
        outbox = conn.outbox
        if received is None:
            received = _now()
        outbox.cork()
        try:
            for n in range(min(len(frames), _FRAMES_PER_TURN)):
                if conn.owed and not (conn.overtakable and conn.codec.overtakes(frames[n])):
                    # In order: this request waits until every answer before it is sent.
                    del frames[:n]
                    conn.backlog = frames
                    conn.held = True
                    self._mute(conn)
                    return
                if not self._one(frames[n], conn, received):
                    self._close(conn)
                    return
                if outbox.full or conn.throttled:
                    # Checked after a request, so one always goes through whatever its
                    # answer's size; the socket is not read again until there is room
                    # (or, throttled by a quota, until the throttle ends: its pipelined
                    # requests wait too).
                    del frames[: n + 1]
                    conn.backlog = frames or None
                    self._mute(conn)
                    return
            del frames[:_FRAMES_PER_TURN]
            if frames:
                self._backlogged.append(conn)
            else:
                conn.backlog = None
        except Exception as exc:
            self._failed(conn, exc)
        finally:
            outbox.uncork()

    def _failed(self, conn: _Connection, exc: Exception) -> None:
        self.log.error("connection_failed", peer=conn.session.peer, exc_info=exc)
        self._close(conn)

    def _one(self, payload: bytes, conn: _Connection, received: float) -> bool:
        if conn.codec is not None:
            return self._one_coded(payload, conn, received)
        log = self.log
        session = conn.session
        body = split = None
        try:
            # A Fetch is looked up by its bytes first: thousands of consumers long-polling
            # one partition send the same ones, over and over, and decoding, validating and
            # preparing the body was 40 % of reading a request (bench longpoll, py-spy).
            if payload[1:2] == _FETCH_KEY:
                split = split_request_envelope(payload)
            if split is None:
                header, raw = decode_request_envelope(payload)
            else:
                header, body_bytes = split
                body = self._fetches.get((header.api_version, body_bytes))
                if body is None:  # new bytes: decode the body alone, the header is read
                    raw = decode_request_body(body_bytes)
        except ProtocolError as exc:
            # A well-framed request over a decoding limit (protocol.codec's
            # MAX_REQUEST_VALUES) is answered when its header can be named.
            if isinstance(exc, InvalidRequest) and split is None:
                split = split_request_envelope(payload)
            if not isinstance(exc, InvalidRequest) or split is None:
                log.warning("connection_closed_bad_request", peer=session.peer, error=str(exc))
                return False
            self._reject(conn, split[0], exc)
            return True
        try:
            if body is None:
                validated = validate_request(header, raw)
                body = self.dispatcher.prepare(header, validated)
                if split is not None and validated.get("session_epoch", -1) < 0:
                    # Prepared requests are never changed, so one serves every sender (not
                    # a Fetch in a session: it reads what its session holds).
                    fetches = self._fetches
                    if len(fetches) >= _FETCHES_KEPT:
                        fetches.clear()
                    fetches[header.api_version, body_bytes] = body
        except _REFUSED_BEFORE_DISPATCH as exc:
            self._reject(conn, header, exc)
            return True
        return self._run(conn, header, body, received, self.dispatcher, self._packer)

    def _one_coded(self, payload: bytes, conn: _Connection, received: float) -> bool:
        """A request on another protocol's listener: its codec decodes and encodes."""
        codec = conn.codec
        try:
            header, body = codec.decode(payload)
        except ProtocolError as exc:
            answer = getattr(exc, "answer", None)
            if answer is None:
                self.log.warning(
                    "connection_closed_bad_request", peer=conn.session.peer, error=str(exc)
                )
                return False
            self.log.info("request_rejected", peer=conn.session.peer, reason=str(exc))
            self._put_in_order(conn, answer)
            return True
        ok = self._run(conn, header, body, received, codec.dispatcher, codec.packer(header))
        if conn.owed and not codec.overtakes(payload):
            conn.overtakable = False  # it parked: nothing may overtake it
        return ok

    def _run(
        self,
        conn: _Connection,
        header: Any,
        body: Any,
        received: float,
        dispatcher: Any,
        packer: Any,
    ) -> bool:
        """Dispatch one decoded request; answer it now or park it (either protocol)."""
        log = self.log
        outbox = conn.outbox
        session = conn.session
        started = _now()
        try:
            result = dispatcher.handle(header, body, session)
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
            answer = _ParkedAnswer(header.correlation_id, outbox, reserved, log, timing, packer)
            if conn.codec is not None:
                if conn.owed is None:
                    conn.owed = deque()
                conn.owed.append(answer)  # before it can complete (it may have already)
                answer.in_order = partial(self._send_owed, conn)
            result.add_done_callback(answer)
            return True
        if result is not None:
            frame = packer(header.correlation_id, result)
            # _put_in_order, inline: every answer of either listener passes here.
            if conn.owed:
                outbox.reserve(len(frame))  # behind an answer still owed
                conn.owed.append(frame)
            else:
                outbox.put(frame)
        if metrics is not None:
            done = _now()
            metrics.record(header.api_key, started - received, done - started, 0.0, done - received)
        return True

    def _reject(self, conn: _Connection, header: RequestHeader, exc: KafkaError) -> None:
        """Answer a request its decoding (or its fetch session) refused, with the verdict."""
        self.log.info(
            "request_rejected",
            peer=conn.session.peer,
            api_key=header.api_key,
            api_version=header.api_version,
            error=exc.code.name,
            reason=exc.message,
        )
        conn.outbox.put(encode_response(header.correlation_id, error_body(exc.code, exc.message)))
