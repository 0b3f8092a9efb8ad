"""Pure pieces of issue 11's limits: bounded messages, duplicates, fetch caps, the outbox."""

from __future__ import annotations

import pytest
import structlog
import trio
import trio.testing

import minibroker.protocol as p
from minibroker.broker.metadata.image import PartitionState
from minibroker.broker.network.outbox import Outbox
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.network.session import ConnectionSession
from minibroker.broker.network.socket_server import (
    _EVENTS_PER_PASS,
    _EVENTS_PER_PASS_MIN,
    _PASS_BUDGET_S,
    ConnectionHandler,
    next_pass_size,
)
from minibroker.broker.replication.fetch_request import MAX_FETCH_WAIT_MS, FetchRequest
from minibroker.broker.replication.replica_manager import duplicate_partition
from minibroker.deploy.launcher import free_port
from minibroker.protocol.errors import InvalidRequest
from minibroker.protocol.schema import MAX_ERROR_CHARS, bounded
from tests.unit.replica_helpers import manual_replica_manager


def test_bounded_cuts_long_messages_and_says_how_much():
    assert bounded("short") == "short"
    cut = bounded("x" * 1000)
    assert cut == "x" * MAX_ERROR_CHARS + f"... ({1000 - MAX_ERROR_CHARS} more)"


def test_every_schema_error_is_bounded():
    body = {"acks": 1, "timeout_ms": 1, "topics": [], **{f"k{i}": 0 for i in range(10_000)}}
    with pytest.raises(InvalidRequest) as caught:
        p.validate_request(p.RequestHeader(p.ApiKey.PRODUCE, 0, 1, None), body)
    # .message is what the broker sends back as error_message.
    assert len(caught.value.message) < MAX_ERROR_CHARS + 30
    assert caught.value.message.endswith(" more)")


_epoch = {"current_leader_epoch": -1}


def _topics(*pairs: tuple[str, int]) -> list[dict]:
    return [{"name": name, "partitions": [{"partition": index}]} for name, index in pairs]


def test_duplicate_partition_names_the_first_repeat():
    assert duplicate_partition(_topics(("a", 0), ("a", 1), ("b", 0))) is None
    assert duplicate_partition(_topics(("a", 0), ("b", 0), ("a", 0))) == "a-0"
    long = "t" * 500
    assert duplicate_partition(_topics((long, 3), (long, 3))) == "t" * 100 + "...-3"


def test_a_reactor_pass_is_sized_to_its_time_budget():
    # 100 us a produce: a pass of 256 held the timer's unmutes up ~25 ms; 20 fit in 2 ms.
    per_socket = _PASS_BUDGET_S / 20
    assert next_pass_size(_EVENTS_PER_PASS, 256, 256 * per_socket) == 20
    # Cheap sockets (an empty long poll, a hang-up) grow it back, up to the cap.
    assert next_pass_size(20, 20, 20 * per_socket / 8) == 160
    assert next_pass_size(160, 160, 160 * 1e-7) == _EVENTS_PER_PASS
    # A pass stretched by a slow socket or a preemption never goes below the floor.
    assert next_pass_size(20, 20, 1.0) == _EVENTS_PER_PASS_MIN
    # Nothing served says nothing about the cost: the size stays.
    assert next_pass_size(37, 0, 0.0) == 37


def test_fetch_request_is_capped_by_the_broker():
    body = {
        "replica_id": -1,
        "min_bytes": 1,
        "max_bytes": 2**31 - 1,
        "max_wait_ms": 2**31 - 1,
        "topics": [
            {
                "name": "t",
                "partitions": [
                    {"partition": i, "fetch_offset": 0, "partition_max_bytes": size, **_epoch}
                    for i, size in enumerate((2**31 - 1, 100))
                ],
            }
        ],
    }
    fetch = FetchRequest(body, fetch_max_bytes=5000)
    assert fetch.max_bytes == 5000
    assert fetch.max_wait_ms == MAX_FETCH_WAIT_MS  # clamped, not refused
    assert [cap for _, _, cap in fetch.targets] == [5000, 100]
    assert fetch.response_bound == 5000
    body["topics"][0]["partitions"] = body["topics"][0]["partitions"][1:]
    assert FetchRequest(body, fetch_max_bytes=5000).response_bound == 100


async def test_outbox_stops_taking_requests_until_the_client_reads(autojump_clock):
    outbox = Outbox(limit=1000, stall_s=60)
    send, receive = trio.testing.lockstep_stream_pair()
    room = trio.Event()
    full_at_room = []
    outbox.on_room = lambda: (full_at_room.append(outbox.full), room.set())
    outbox.reserve(600)  # a parked fetch that may answer 600 bytes
    outbox.put(b"x" * 500)
    assert outbox.full
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run_writer, send)
        with trio.move_on_after(5) as blocked:
            await room.wait()
        assert blocked.cancelled_caught and outbox.full  # nobody reads: no room
        assert await receive.receive_some(500) == b"x" * 500
        with trio.fail_after(5):
            await room.wait()
        assert full_at_room == [False]  # drained: 600 reserved < 1000
        outbox.release(600)
        assert outbox.queued == outbox.reserved == 0
        nursery.cancel_scope.cancel()


async def test_outbox_writer_gives_up_when_nothing_is_read(autojump_clock):
    outbox = Outbox(limit=1 << 20, stall_s=30)
    send, _receive = trio.testing.lockstep_stream_pair()
    outbox.put(b"y" * 100)
    with trio.fail_after(100):
        await outbox.run_writer(send)  # returns: the client stopped reading
    assert trio.current_time() >= 30


async def test_a_parked_fetch_is_clamped_and_dies_with_its_connection(tmp_path):
    manager = manual_replica_manager(tmp_path)
    fetches, timer, clock = manager.fetch_purgatory, manager.timer, manager.clock
    manager.host_partition("t", 0, PartitionState(0, 0, [0], [0]))
    raw = {
        "max_wait_ms": 2**31 - 1,
        "min_bytes": 1,
        "topics": [{"name": "t", "partitions": [{"partition": 0, "fetch_offset": 0}]}],
    }
    body = p.validate_request(p.RequestHeader(p.ApiKey.FETCH, 0, 1, None), raw)
    session = ConnectionSession("127.0.0.1:1")
    try:
        pending = manager.fetch(manager.fetch_request(body), session)
        assert isinstance(pending, PendingResponse)
        assert pending.max_bytes == 1048576  # the partition's cap: what its connection budgets
        (op,) = manager._parked[session]
        assert op.delay_ms == MAX_FETCH_WAIT_MS  # 2^31-1 ms clamped
        assert fetches.pending == 1 and timer.size == 1
        session.close()
        assert fetches.pending == 0 and timer.size == 0
        assert pending.body is None and op.fetch is None  # nobody answered, nothing held
        clock.advance(MAX_FETCH_WAIT_MS)
        assert fetches.stats()["expired"] == 0
    finally:
        manager.close()


async def test_outbox_writes_at_once_and_starts_a_writer_only_for_what_is_left():
    import socket

    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    started = []
    outbox = Outbox(limit=1 << 30, stall_s=60)
    outbox.attach(stream, lambda: started.append(True))
    outbox.put(b"hello")
    assert theirs.recv(100) == b"hello" and not started and outbox.queued == 0
    # Far more than a socket buffer holds: the rest waits for a writer task.
    outbox.put(b"z" * (64 << 20))
    assert started == [True] and 0 < outbox.queued < 64 << 20
    outbox.close()
    outbox.put(b"after close")  # a parked request completing as its connection goes
    assert outbox.queued == 0 and not outbox._frames
    theirs.close()
    await stream.aclose()


async def test_idle_connections_close_after_100_to_110_percent_of_the_idle_time(autojump_clock):
    """connections.max.idle.ms by trio's clock: 10 s of it pass in little real time here."""
    # Jump only once the loop has been idle a little: the poll backend waits in a worker
    # thread, and jumping while its answer is on the way would starve the reader.
    autojump_clock.autojump_threshold = 0.05
    handler = ConnectionHandler(
        None, max_frame_bytes=1 << 20, idle_ms=10_000, logger=structlog.get_logger()
    )
    port = free_port()
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler.serve, listeners)
        idle = await trio.open_tcp_stream("127.0.0.1", port)
        busy = await trio.open_tcp_stream("127.0.0.1", port)
        opened = trio.current_time()

        async def keep_busy() -> None:
            await busy.send_all((1000).to_bytes(4, "big"))  # a frame that never completes:
            while True:  # read, so not idle, yet never a request
                await trio.sleep(3)
                await busy.send_all(b"x")

        nursery.start_soon(keep_busy)
        with trio.fail_after(60):
            assert await idle.receive_some(1) == b""  # closed by the broker
        assert 10 <= trio.current_time() - opened <= 11
        await trio.sleep(15)
        assert handler.open_connections == 1  # the one that kept sending stays
        nursery.cancel_scope.cancel()


class _CountingDispatcher:
    """The request handler's two calls, counted: what the socket server asks of it."""

    def __init__(self) -> None:
        self.prepared: list[dict] = []
        self.handled: list[object] = []

    def prepare(self, header: p.RequestHeader, body: dict) -> object:
        self.prepared.append(body)
        return {"prepared": len(self.prepared)}

    def handle(self, header: p.RequestHeader, body: object, session: ConnectionSession) -> dict:
        self.handled.append(body)
        return {"error_code": 0}


async def test_the_same_fetch_bytes_are_prepared_once_for_every_connection():
    dispatcher = _CountingDispatcher()
    server = ConnectionHandler(
        dispatcher, max_frame_bytes=1 << 20, idle_ms=60_000, logger=structlog.get_logger()
    )
    port = free_port()
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")

    def fetch_frame(correlation_id: int, offset: int) -> bytes:
        body = {
            "max_wait_ms": 0,
            "min_bytes": 1,
            "topics": [{"name": "t", "partitions": [{"partition": 0, "fetch_offset": offset}]}],
        }
        return p.encode_request(p.ApiKey.FETCH, 0, correlation_id, "c", body)

    async def ask(stream: trio.SocketStream, frame: bytes) -> None:
        await stream.send_all(frame)
        decoder = p.FrameDecoder()
        while not list(decoder.feed(await stream.receive_some(1 << 16))):
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve, listeners)
        with trio.fail_after(30):
            first = await trio.open_tcp_stream("127.0.0.1", port)
            second = await trio.open_tcp_stream("127.0.0.1", port)
            await ask(first, fetch_frame(1, 0))
            await ask(second, fetch_frame(7, 0))  # other connection, other correlation id
            await ask(first, fetch_frame(2, 5))  # other bytes
        nursery.cancel_scope.cancel()
    assert len(dispatcher.prepared) == 2  # offset 0 once for both connections, offset 5
    assert dispatcher.handled[0] is dispatcher.handled[1]
    assert dispatcher.handled[2] is not dispatcher.handled[0]
