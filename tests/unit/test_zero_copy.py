"""Zero-copy fetch answers: regions of segment files, frames in parts, sent on real sockets.

The region read must return exactly what the bytes read returns; a frame in parts must
put exactly ``encode_response``'s bytes on the wire, in order with ordinary frames,
resumed after short sends, with the outbox's byte budget counted as for any frame.
"""

from __future__ import annotations

import errno
import os
import resource
import socket

import msgpack
import pytest
import trio

import minibroker.protocol as p
from minibroker.broker.common.file_region import FileRegion, RegionBody
from minibroker.broker.metadata.image import PartitionState
from minibroker.broker.network.outbox import Outbox
from minibroker.broker.network.parts import PartsFrame
from minibroker.broker.storage import Log, LogConfig
from minibroker.protocol import encode_batch, encode_response, encode_response_parts, iter_batches
from tests.unit.replica_helpers import manual_replica_manager


def _log(tmp_path) -> Log:
    """Batches of 1 to 40 records of 300 bytes: some well past a walk chunk (8 KiB)."""
    log = Log.open(tmp_path, LogConfig(), now_ms=lambda: 5000)
    for i, n in enumerate([1, 3, 40, 2, 1, 25, 7, 1, 1, 33, 4]):
        log.append_as_leader(encode_batch([(1000 + i, None, bytes([i]) * 300, [])] * n), 0)
    return log


def _expected(log: Log, offset: int, max_bytes: int, upper: int, min_one: bool) -> bytes:
    """What a read returns, by its definition, from every batch of the (one) segment."""
    (segment,) = log.segments
    data = segment.pread(segment.size, 0)
    out = b""
    for pos, header in iter_batches(data, verify=False):
        last = header.base_offset + header.last_offset_delta
        if last < offset:
            continue
        if last + 1 > upper:
            break
        if len(out) + header.size > max_bytes and not (min_one and not out):
            break
        out += data[pos : pos + header.size]
        if len(out) > max_bytes:
            break
    return out


def test_a_region_read_is_the_bytes_read(tmp_path) -> None:
    log = _log(tmp_path)
    leo = log.log_end_offset
    checked = 0
    for offset in range(0, leo + 1, 3):
        for max_bytes in (1, 500, 9000, 20_000, 1 << 20):
            for min_one in (True, False):
                for upper in (None, leo - 5):
                    if upper is not None and offset > upper:
                        continue
                    args = dict(max_offset=upper, min_one_batch=min_one)
                    want = log.read(offset, max_bytes, **args)
                    got = log.read_region(offset, max_bytes, **args)
                    data = got.data.read() if isinstance(got.data, FileRegion) else got.data
                    assert data == want.data, (offset, max_bytes, min_one, upper)
                    assert data == _expected(log, offset, max_bytes, upper or leo, min_one)
                    assert (got.first_offset, got.next_offset) == (
                        want.first_offset,
                        want.next_offset,
                    )
                    checked += isinstance(got.data, FileRegion)
    assert checked > 100  # most reads were served as regions
    log.close()


def test_a_region_outlives_its_segment_and_closes_its_descriptor(tmp_path) -> None:
    log = _log(tmp_path)
    want = log.read(0, 1 << 20).data
    region = log.read_region(0, 1 << 20).data
    fd = region.fd
    for segment in log.segments:
        segment.delete()  # retention or a replaced segment, while the answer is queued
    assert region.read() == want
    del region
    with pytest.raises(OSError) as gone:
        os.fstat(fd)
    assert gone.value.errno == errno.EBADF


def _region_body(tmp_path) -> tuple[dict, dict]:
    """A follower's fetch answer from a ReplicaManager, and the same body with bytes."""
    manager = manual_replica_manager(tmp_path)
    manager.on_isr_change = lambda partition, isr: None
    for index in (0, 1):
        manager.host_partition("t", index, PartitionState(0, 1, [0, 1], [0, 1], 1))
        rows = [(1000 + i, None, b"v" * 200, []) for i in range(50)]
        raw = {
            "acks": 1,
            "timeout_ms": 30_000,
            "topics": [
                {"name": "t", "partitions": [{"partition": index, "records": encode_batch(rows)}]}
            ],
        }
        manager.produce(p.validate_request(p.RequestHeader(p.ApiKey.PRODUCE, 0, 1, None), raw))
    raw = {
        "replica_id": 1,
        "max_wait_ms": 0,
        "min_bytes": 1,
        "topics": [
            {"name": "t", "partitions": [{"partition": i, "fetch_offset": 0} for i in (0, 1)]}
        ],
    }
    body = manager.fetch(
        manager.fetch_request(p.validate_request(p.RequestHeader(p.ApiKey.FETCH, 0, 1, None), raw))
    )
    plain = {
        "topics": [
            {
                **t,
                "partitions": [
                    {**e, "records": e["records"].read() if e["records"] else b""}
                    for e in t["partitions"]
                ],
            }
            for t in body["topics"]
        ]
    }
    return body, plain


def test_a_followers_answer_in_parts_is_the_packed_frame(tmp_path) -> None:
    body, plain = _region_body(tmp_path)
    assert type(body) is RegionBody
    parts = encode_response_parts(7, body, FileRegion)
    assert [type(x) for x in parts] == [bytes, FileRegion, bytes, FileRegion, bytes]
    joined = b"".join(x.read() if type(x) is FileRegion else x for x in parts)
    assert joined == encode_response(7, plain)
    # and it decodes as the follower decodes any answer
    assert msgpack.unpackb(joined[4:])[1]["topics"][0]["partitions"][0]["records"]


def _pair(family: str = "unix") -> tuple[trio.SocketStream, socket.socket]:
    if family == "unix":
        a, b = socket.socketpair()
    else:  # TCP on loopback, as a follower connection
        with socket.create_server(("127.0.0.1", 0)) as server:
            b = socket.create_connection(server.getsockname())
            a, _ = server.accept()
        a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for s in (a, b):  # small buffers: every big frame goes out in many short sends
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    a.setblocking(False)
    return trio.SocketStream(trio.socket.from_stdlib_socket(a)), b


async def _drain(sock: socket.socket, want: int) -> bytes:
    got = bytearray()
    sock.setblocking(False)
    while len(got) < want:
        await trio.lowlevel.wait_readable(sock)
        got += sock.recv(65536)
    return bytes(got)


@pytest.mark.parametrize("family", ["unix", "tcp"])
async def test_frames_in_parts_keep_order_resume_short_sends_and_count_bytes(
    tmp_path, family
) -> None:
    body, plain = _region_body(tmp_path)
    stream, peer = _pair(family)
    outbox = Outbox(limit=1 << 20, stall_s=30)
    frames = [
        b"first" * 3,
        PartsFrame(encode_response_parts(1, body, FileRegion)),
        b"between" * 2000,
        PartsFrame(encode_response_parts(2, body, FileRegion)),
        b"last",
    ]
    want = b"".join(
        [frames[0], encode_response(1, plain), frames[2], encode_response(2, plain), b"last"]
    )
    total = sum(map(len, frames))
    async with trio.open_nursery() as nursery:
        outbox.attach(stream, lambda: nursery.start_soon(outbox.run_writer, stream))
        for frame in frames:
            outbox.put(frame)
        # Far more than the socket takes at once: most of it is queued and counted.
        assert 0 < outbox.queued < total
        with trio.fail_after(10):
            got = await _drain(peer, len(want))
        assert got == want
        with trio.fail_after(10):
            while outbox.queued:
                await trio.sleep(0.001)
    assert outbox.queued == 0
    peer.close()
    await stream.aclose()


async def test_a_frame_in_parts_resumes_where_a_short_send_stopped(tmp_path) -> None:
    body, plain = _region_body(tmp_path)
    stream, peer = _pair()
    frame = PartsFrame(encode_response_parts(3, body, FileRegion))
    want = encode_response(3, plain)
    assert len(frame) == len(want)
    fd = stream.socket.fileno()
    got = bytearray()
    peer.setblocking(False)
    left = [len(frame)]
    while not frame.send(fd):  # the socket fills: a short send; read some, then resume
        assert len(frame) < left[-1]  # each send went on from where the last stopped
        left.append(len(frame))
        got += _read_all(peer)
    got += _read_all(peer)
    assert bytes(got) == want and len(frame) == 0
    assert len(left) > 2
    peer.close()
    await stream.aclose()


def _read_all(peer: socket.socket) -> bytes:
    out = bytearray()
    while True:
        try:
            data = peer.recv(65536)
        except BlockingIOError:
            return bytes(out)
        if not data:
            return bytes(out)
        out += data


def test_a_region_cut_under_the_send_breaks_the_frame(tmp_path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"z" * 1000)
    fd = os.open(path, os.O_RDONLY)
    region = FileRegion(fd, 0, 1000)
    os.close(fd)
    os.truncate(path, 100)
    a, b = socket.socketpair()
    frame = PartsFrame([b"head", region, b"tail"])
    assert not frame.send(a.fileno())  # a short send, as a full socket's
    with pytest.raises(OSError) as cut:  # resumed: the file has ended, the frame cannot
        frame.send(a.fileno())
    assert cut.value.errno == errno.EIO
    assert b.recv(1000) == b"head" + b"z" * 100
    a.close()
    b.close()


def test_without_a_descriptor_to_spare_a_region_read_returns_the_bytes(tmp_path) -> None:
    log = _log(tmp_path)
    want = log.read(0, 20_000)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    spare = []
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 8, hard))
        while True:  # use every descriptor left, so os.dup fails (EMFILE)
            try:
                spare.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        got = log.read_region(0, 20_000)
    finally:
        for fd in spare:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert spare and type(got.data) is bytes
    assert got.data == want.data and got.next_offset == want.next_offset
    log.close()
