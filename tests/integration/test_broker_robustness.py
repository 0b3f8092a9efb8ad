"""A live broker against bad input, crashes and restarts: clear errors, nothing lost."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import msgpack
import pytest
import trio

import minibroker.protocol as p
from minibroker.broker.network.poller import POLLER_ENV, available_backends
from minibroker.client import Admin, Consumer, NewTopic, Producer
from minibroker.deploy.launcher import ping
from minibroker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration


class RawConnection:
    """Speaks bytes to the broker, so tests can send what no client would."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = p.FrameDecoder()
        self.corr = 0

    @classmethod
    async def open(cls, address: str) -> RawConnection:
        host, port = address.split(":")
        return cls(await trio.open_tcp_stream(host, int(port)))

    async def request(self, api_key: int, body, version: int = 0) -> dict:
        self.corr += 1
        await self.stream.send_all(p.encode_request(api_key, version, self.corr, "raw", body))
        return await self.response()

    async def response(self) -> dict:
        while True:
            with trio.fail_after(10):
                data = await self.stream.receive_some(1 << 16)
            assert data, "broker closed the connection"
            frames = self.decoder.feed(data)
            if frames:
                return p.decode_response_envelope(frames[0])[1]

    async def closed_by_broker(self, timeout: float = 10) -> bool:
        with trio.fail_after(timeout):
            try:
                while await self.stream.receive_some(1 << 16):
                    pass
            except trio.BrokenResourceError:
                pass
        return True


def produce(topic: str, records: bytes, acks: int = 1) -> dict:
    return {
        "acks": acks,
        "timeout_ms": 5000,
        "topics": [{"name": topic, "partitions": [{"partition": 0, "records": records}]}],
    }


def partition_error(body: dict) -> int:
    return body["topics"][0]["partitions"][0]["error_code"]


async def make_topic(address: str, name: str = "t", partitions: int = 1) -> None:
    async with Admin(address) as admin:
        await admin.create_topics([NewTopic(name, partitions, 1)])


def batch(n: int = 3, size: int = 10) -> bytes:
    return p.encode_batch([(1000 + i, None, bytes([65 + i % 26]) * size, []) for i in range(n)])


async def test_garbage_and_hostile_frames_close_only_that_connection(broker):
    host, port = broker.split(":")
    healthy = await RawConnection.open(broker)
    for junk in (
        b"\xff" * 64,
        struct.pack(">I", 2**31),
        struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1",
        p.encode_frame(msgpack.packb(["not", "a", "request"])),
    ):
        bad = await RawConnection.open(broker)
        await bad.stream.send_all(junk)
        assert await bad.closed_by_broker()
    # A truncated frame followed by a hang-up.
    cut = await RawConnection.open(broker)
    await cut.stream.send_all(p.encode_request(18, 0, 1, "x", {})[:-2])
    await cut.stream.aclose()
    assert (await healthy.request(p.ApiKey.API_VERSIONS, {}))["error_code"] == 0
    assert ping(host, int(port))


async def test_wrong_shapes_and_versions_get_error_responses(broker):
    conn = await RawConnection.open(broker)
    body = await conn.request(p.ApiKey.PRODUCE, {"acks": "1", "timeout_ms": 1, "topics": []})
    assert body["error_code"] == ErrorCode.INVALID_REQUEST
    assert "acks: expected int16" in body["error_message"]
    body = await conn.request(4242, {})
    assert body["error_code"] == ErrorCode.UNSUPPORTED_VERSION
    body = await conn.request(p.ApiKey.FETCH, {}, version=99)
    assert body["error_code"] == ErrorCode.UNSUPPORTED_VERSION
    assert "FETCH version 99 is not supported" in body["error_message"]
    # Same connection keeps working.
    assert (await conn.request(p.ApiKey.API_VERSIONS, {}))["error_code"] == 0


async def test_a_fetch_naming_a_session_the_broker_does_not_hold_is_refused_by_name(broker):
    """Fetch v2 (sessions, broker/replication/fetch_sessions.py): an incremental fetch of an
    unknown session gets FETCH_SESSION_ID_NOT_FOUND, a consumer's full one no session, and
    the connection goes on serving."""
    await make_topic(broker, "sessions")
    conn = await RawConnection.open(broker)
    fetch = {
        "max_wait_ms": 0,
        "min_bytes": 0,
        "topics": [{"name": "sessions", "partitions": [{"partition": 0, "fetch_offset": 0}]}],
    }
    body = await conn.request(p.ApiKey.FETCH, {**fetch, "session_id": 777, "session_epoch": 3}, 2)
    assert body["error_code"] == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert "no fetch session 777" in body["error_message"]
    body = await conn.request(p.ApiKey.FETCH, {**fetch, "session_epoch": 0}, 2)
    assert body.get("session_id", 0) == 0
    assert partition_error(body) == ErrorCode.NONE
    assert (await conn.request(p.ApiKey.API_VERSIONS, {}))["error_code"] == 0


async def test_bad_batches_are_refused_and_nothing_is_stored(broker_factory):
    proc = broker_factory({"message.max.bytes": 2000})
    await make_topic(proc.address)
    conn = await RawConnection.open(proc.address)
    good = batch(3)
    assert partition_error(await conn.request(p.ApiKey.PRODUCE, produce("t", good))) == 0
    flipped = bytearray(good)
    flipped[-1] ^= 0x01
    assert (
        partition_error(await conn.request(p.ApiKey.PRODUCE, produce("t", bytes(flipped))))
        == ErrorCode.CORRUPT_MESSAGE
    )
    assert (
        partition_error(await conn.request(p.ApiKey.PRODUCE, produce("t", good[:-4])))
        == ErrorCode.CORRUPT_MESSAGE
    )
    big = batch(3, size=1000)
    assert (
        partition_error(await conn.request(p.ApiKey.PRODUCE, produce("t", good + big)))
        == ErrorCode.MESSAGE_TOO_LARGE
    )
    assert (
        partition_error(await conn.request(p.ApiKey.PRODUCE, produce("t", good, acks=2)))
        == ErrorCode.INVALID_REQUIRED_ACKS
    )
    assert (
        partition_error(await conn.request(p.ApiKey.PRODUCE, produce("nope", good)))
        == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    fetch = {
        "max_wait_ms": 0,
        "min_bytes": 1,
        "topics": [{"name": "t", "partitions": [{"partition": 0, "fetch_offset": 0}]}],
    }
    body = await conn.request(p.ApiKey.FETCH, fetch)
    part = body["topics"][0]["partitions"][0]
    assert part["high_watermark"] == 3
    assert [r.value for r in p.read_records(part["records"])] == [b"A" * 10, b"B" * 10, b"C" * 10]
    fetch["topics"][0]["partitions"][0]["fetch_offset"] = 99
    body = await conn.request(p.ApiKey.FETCH, fetch)
    assert partition_error(body) == ErrorCode.OFFSET_OUT_OF_RANGE


async def test_auto_create_topics_when_enabled(broker_factory):
    proc = broker_factory({"auto.create.topics.enable": True, "num.partitions": 2})
    async with Producer(proc.address, acks=1) as producer:
        md = await producer.send("fresh", b"x", partition=1)
    assert (md.topic, md.partition, md.offset) == ("fresh", 1, 0)


async def test_a_produce_to_a_topic_it_auto_creates_is_held_until_the_topic_exists(
    broker_factory,
):
    """The first produce to a new topic creates it (auto.create.topics.enable) and is held
    until this broker has applied the topic (RequestDeferral.after_topics_known), so it
    is written rather than answered UNKNOWN_TOPIC_OR_PARTITION for the client to retry."""
    proc = broker_factory({"auto.create.topics.enable": True, "num.partitions": 1})
    conn = await RawConnection.open(proc.address)
    body = await conn.request(p.ApiKey.PRODUCE, produce("made-by-its-first-write", batch()))
    assert partition_error(body) == ErrorCode.NONE
    assert body["topics"][0]["partitions"][0]["base_offset"] == 0


async def test_silent_client_is_closed_after_idle_timeout(broker_factory):
    proc = broker_factory({"connections.max.idle.ms": 300})
    silent = await RawConnection.open(proc.address)
    assert await silent.closed_by_broker(timeout=10)
    assert ping(proc.host, proc.port)


def test_bad_config_stops_the_broker_with_one_line(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "minibroker.deploy.cli",
        "broker",
        "--data-dir",
        str(tmp_path),
        "--listen",
        "127.0.0.1:1",
    ]
    result = subprocess.run(
        [*cmd, "--set", "min.insync.replica=2"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error: unknown config key 'min.insync.replica' (did you mean 'min.insync.replicas'?)"
    )
    assert "Traceback" not in result.stderr
    result = subprocess.run(
        [*cmd, "--set", "log.segment.bytes=big"], capture_output=True, text=True, timeout=30
    )
    assert "config 'log.segment.bytes': expected an integer" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    missing = next(b for b in ("epoll", "kqueue") if b not in available_backends())
    env = {k: v for k, v in os.environ.items() if k != POLLER_ENV}  # it would win
    result = subprocess.run(
        [*cmd, "--set", f"socket.poller={missing}"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: config 'socket.poller': '{missing}' is not available")


async def test_sigkill_and_restart_keeps_every_acknowledged_record(broker_factory, tmp_path):
    data = tmp_path / "killed"
    proc = broker_factory(data_dir=data)
    await make_topic(proc.address, partitions=2)
    async with Producer(proc.address, acks=1, **{"linger.ms": 1}) as producer:
        handles = [
            producer.send_nowait("t", f"r{i}".encode(), key=str(i).encode()) for i in range(2000)
        ]
        acked = [await h for h in handles]
    proc.kill()
    proc2 = broker_factory(data_dir=data)
    async with Consumer(proc2.address) as consumer:
        consumer.assign([("t", 0), ("t", 1)])
        consumer.seek_to_beginning()
        got = {}
        while len(got) < len(acked):
            records = await consumer.poll(timeout_ms=3000)
            assert records, f"only {len(got)} of {len(acked)} records came back"
            for r in records:
                got[(r.partition, r.offset)] = r.value
    assert {(m.partition, m.offset) for m in acked} == set(got)
    assert sorted(got.values()) == sorted(f"r{i}".encode() for i in range(2000))


async def test_torn_and_corrupt_segments_are_cut_on_restart(broker_factory, tmp_path):
    data = tmp_path / "corrupt"
    proc = broker_factory(data_dir=data)
    await make_topic(proc.address, name="c")
    async with Producer(proc.address, acks=1, **{"linger.ms": 0}) as producer:
        for i in range(10):
            await producer.send("c", f"v{i}".encode())
    proc.stop()
    segment = next((data / "c-0").glob("*.log"))
    raw = bytearray(segment.read_bytes())
    sizes = [h.size for _, h in p.iter_batches(raw)]
    assert len(sizes) == 10
    cut_at = sum(sizes[:7])
    raw[cut_at + 30] ^= 0xFF  # flip a byte inside batch 8: batches 8.. go
    segment.write_bytes(bytes(raw[: len(raw) - 5]))  # and tear the tail
    proc2 = broker_factory(data_dir=data)
    async with Consumer(proc2.address) as consumer:
        consumer.assign([("c", 0)])
        consumer.seek_to_beginning()
        records = await consumer.poll(timeout_ms=3000)
    assert [r.value for r in records] == [f"v{i}".encode() for i in range(7)]
    assert "log_recovery_truncated" in proc2.log_path.read_text()
    async with Producer(proc2.address, acks=1) as producer:
        assert (await producer.send("c", b"again")).offset == 7


async def test_peer_reset_with_parked_requests_leaves_the_broker_serving(broker):
    import socket

    await make_topic(broker, name="rst")
    host, port = broker.split(":")
    fetch = {
        "max_wait_ms": 30000,
        "min_bytes": 1000,
        "topics": [{"name": "rst", "partitions": [{"partition": 0, "fetch_offset": 0}]}],
    }
    for _ in range(5):
        sock = socket.create_connection((host, int(port)))
        for corr in range(3):
            sock.sendall(p.encode_request(p.ApiKey.FETCH, 0, corr, "rst", fetch))
        # SO_LINGER 0: close sends RST, the broker's next recv fails with ECONNRESET.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await trio.sleep(0.05)
        sock.close()
    await trio.sleep(0.2)
    assert ping(host, int(port))
    async with Producer(broker, acks=1) as producer:
        await producer.send("rst", b"still here")


def bomb_frames(count: int = 30_000_000) -> dict[str, bytes]:
    """Valid envelopes whose bodies decode to huge objects: the map bomb of issue 26
    (30 million one-byte empty maps took a broker from 44 MB to 2,163 MB and held its
    loop 7.6 s), a nesting bomb, a huge array of small ints, and many short arrays (no
    container long, together too many values: the decoder has to walk these)."""
    head = b"\x95\x00\x00\x07\xa4bomb"  # [PRODUCE, 0, 7, "bomb", <body>]
    n = count.to_bytes(4, "big")
    shapes = {
        "empty maps": head + b"\xdd" + n + b"\x80" * count,
        "deep nesting": head + b"\x91" * count + b"\xc0",
        "small ints": head + b"\xdd" + n + b"\x01" * count,
        "arrays of 15": head
        + b"\xdd"
        + (count // 16).to_bytes(4, "big")
        + (b"\x9f" + b"\x80" * 15) * (count // 16),
    }
    return {name: p.encode_frame(payload) for name, payload in shapes.items()}


async def test_request_bombs_take_neither_memory_nor_the_loop(broker_process):
    """Each bomb is answered INVALID_REQUEST naming the limit; meanwhile the broker's RSS
    stays under 200 MB and another connection's ApiVersions is answered within a second."""
    import psutil

    broker = broker_process.address
    process = psutil.Process(broker_process.pid)
    limit_rss = 200 << 20
    worst = {"lag": 0.0, "rss": process.memory_info().rss}
    done = trio.Event()

    async def watch() -> None:
        conn = await RawConnection.open(broker)
        while not done.is_set():
            started = trio.current_time()
            assert (await conn.request(p.ApiKey.API_VERSIONS, {}))["error_code"] == 0
            worst["lag"] = max(worst["lag"], trio.current_time() - started)
            worst["rss"] = max(worst["rss"], process.memory_info().rss)
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        for name, frame in bomb_frames().items():
            bad = await RawConnection.open(broker)
            await bad.stream.send_all(frame)
            answer = await bad.response()
            assert answer["error_code"] == ErrorCode.INVALID_REQUEST, name
            assert "msgpack values: split it" in answer["error_message"], name
            worst["rss"] = max(worst["rss"], process.memory_info().rss)
            await bad.stream.aclose()
        done.set()
    assert worst["rss"] < limit_rss, worst
    assert worst["lag"] < 1.0, worst
    await make_topic(broker, name="after")
    async with Producer(broker, acks=1) as producer:
        assert (await producer.send("after", b"still serving")).offset == 0
