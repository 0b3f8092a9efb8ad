"""A live broker against forged batches, bad topic configs, a small fd limit and bad
segment files: a clear error, the broker keeps serving, restarts, and every
acknowledged record comes back unchanged."""

from __future__ import annotations

import contextlib
import os
import struct
import zlib

import msgpack
import pytest

import minibroker.protocol as p
from minibroker.client import Admin, Consumer, NewTopic, Producer
from minibroker.protocol.errors import CorruptMessage, ErrorCode, InvalidConfig, KafkaError

from .test_broker_robustness import RawConnection, batch, make_topic, produce

pytestmark = pytest.mark.integration

INT_MAX = 2**31 - 1


def forged(count: int, base_offset: int = 0) -> bytes:
    """A CRC-valid batch whose header and array header claim ``count`` records."""
    payload = b"\xdd" + count.to_bytes(4, "big") + msgpack.packb([0, None, b"x"])
    tail = struct.pack(">hiqqi", 0, count - 1, 1000, 1000, count) + payload
    return struct.pack(">qiiI", base_offset, len(tail) + 8, -1, zlib.crc32(tail)) + tail


async def consume_all(address: str, topic: str, partitions: int, expected: int) -> dict:
    got: dict[tuple[int, int], bytes] = {}
    async with Consumer(address) as consumer:
        consumer.assign([(topic, i) for i in range(partitions)])
        consumer.seek_to_beginning()
        while len(got) < expected:
            records = await consumer.poll(timeout_ms=5000)
            assert records, f"only {len(got)} of {expected} records came back"
            got.update({(r.partition, r.offset): r.value for r in records})
    return got


async def test_forged_record_count_is_refused_and_nothing_lost(broker_factory, tmp_path):
    data = tmp_path / "forged"
    proc = broker_factory(data_dir=data)
    await make_topic(proc.address, name="f")
    conn = await RawConnection.open(proc.address)
    assert (await conn.request(p.ApiKey.PRODUCE, produce("f", batch(3))))["topics"][0][
        "partitions"
    ][0]["error_code"] == 0
    for _ in range(3):  # three times: the index overflowed on the third before
        answer = (await conn.request(p.ApiKey.PRODUCE, produce("f", forged(INT_MAX))))["topics"][0][
            "partitions"
        ][0]
        assert answer["error_code"] == ErrorCode.CORRUPT_MESSAGE
        assert "record_count 2147483647" in answer["error_message"]
    async with Producer(proc.address, acks=1) as producer:
        assert (await producer.send("f", b"after")).offset == 3
    proc.stop()
    proc2 = broker_factory(data_dir=data)
    got = await consume_all(proc2.address, "f", 1, 4)
    assert list(got.values()) == [b"A" * 10, b"B" * 10, b"C" * 10, b"after"]
    async with Producer(proc2.address, acks=1) as producer:
        assert (await producer.send("f", b"again")).offset == 4


async def test_restart_with_a_forged_batch_written_to_the_segment(broker_factory, tmp_path):
    """What an older broker wrote after accepting a forged batch: restart cuts it."""
    data = tmp_path / "wedged"
    proc = broker_factory(data_dir=data)
    await make_topic(proc.address, name="w")
    async with Producer(proc.address, acks=1, **{"linger.ms": 0}) as producer:
        acked = [await producer.send("w", f"v{i}".encode()) for i in range(5)]
    proc.stop()
    segment = next((data / "w-0").glob("*.log"))
    with open(segment, "ab") as fh:  # LEO jumps by 2^31, then a batch the index cannot hold
        fh.write(forged(INT_MAX, base_offset=5))
        fh.write(p.encode_batch([(1000, None, b"z", [])], base_offset=5 + INT_MAX))
    proc2 = broker_factory(data_dir=data)
    got = await consume_all(proc2.address, "w", 1, 5)
    assert [got[(0, m.offset)] for m in acked] == [f"v{i}".encode() for i in range(5)]
    assert "log_recovery_truncated" in proc2.log_path.read_text()
    async with Producer(proc2.address, acks=1) as producer:
        assert (await producer.send("w", b"next")).offset == 5


@pytest.mark.parametrize(
    ("configs", "named"),
    [
        ({"min.insync.replicas": "0"}, "'min.insync.replicas' = 0 is outside the allowed range"),
        ({"min.insync.replicas": "-5"}, "= -5"),
        ({"max.message.bytes": "-1"}, "'max.message.bytes' = -1"),
        ({"segment.ms": "0"}, "'segment.ms' = 0"),
        ({"retention.ms": "-7"}, "'retention.ms' = -7"),
        ({"segment.bytes": "4000000000"}, "[1048576, 2147483647]"),
    ],
)
async def test_bad_topic_configs_are_refused_before_saving(broker, configs, named):
    async with Admin(broker) as admin:
        with pytest.raises(InvalidConfig, match=named.replace("[", r"\[").replace("]", r"\]")):
            await admin.create_topics([NewTopic("bad", 1, 1, configs)])
        assert "bad" not in await admin.list_topics()
        await admin.create_topics([NewTopic("good", 1, 1, {"segment.bytes": "1048576"})])
    async with Producer(broker, acks=1) as producer:
        assert (await producer.send("good", b"x")).offset == 0


@contextlib.contextmanager
def fd_limit(limit: int):
    """Brokers started inside run under ``limit`` descriptors (a broker raises its soft
    limit to the hard one at start; $MINIBROKER_NOFILE_LIMIT sets both instead)."""
    old = os.environ.get("MINIBROKER_NOFILE_LIMIT")
    os.environ["MINIBROKER_NOFILE_LIMIT"] = str(limit)
    try:
        yield
    finally:
        if old is None:
            del os.environ["MINIBROKER_NOFILE_LIMIT"]
        else:
            os.environ["MINIBROKER_NOFILE_LIMIT"] = old


async def test_partition_cap_from_the_fd_limit(broker_factory, tmp_path):
    data = tmp_path / "fds"
    # cap = 400 - 112 reserved - 18 kept for connections - 16 headroom = 254 partitions
    # (common/descriptors.py)
    with fd_limit(400):
        proc = broker_factory(data_dir=data)
    async with Admin(proc.address) as admin:
        with pytest.raises(KafkaError) as refused:
            await admin.create_topics([NewTopic("huge", 5000, 1)])
        assert refused.value.code == ErrorCode.POLICY_VIOLATION
        assert "ulimit -n = 400" in str(refused.value) and "cap of 254" in str(refused.value)
        await admin.create_topics([NewTopic("many", 60, 1)])
        with pytest.raises(KafkaError, match="cap of 254"):
            await admin.create_topics([NewTopic("more", 200, 1)])
        assert sorted(await admin.list_topics()) == ["many"]
    async with Producer(proc.address, acks=1) as producer:
        acked = [await producer.send("many", b"p%d" % i, partition=i) for i in range(60)]
    proc.stop()
    with fd_limit(400):
        proc2 = broker_factory(data_dir=data)
    got = await consume_all(proc2.address, "many", 60, 60)
    assert {(m.partition, m.offset) for m in acked} == set(got)
    assert sorted(got.values()) == sorted(b"p%d" % i for i in range(60))


async def test_consumer_meeting_a_corrupt_batch_gets_one_line(broker_factory, tmp_path):
    data = tmp_path / "rot"
    proc = broker_factory(data_dir=data)
    async with Admin(proc.address) as admin:  # a segment per batch: the first gets sealed
        await admin.create_topics([NewTopic("rot", 1, 1, {"internal.segment.bytes": "100"})])
    async with Producer(proc.address, acks=1, **{"linger.ms": 0}) as producer:
        for i in range(4):
            await producer.send("rot", b"value-%d" % i)
    proc.stop()
    first = sorted((data / "rot-0").glob("*.log"))[0]
    raw = bytearray(first.read_bytes())
    raw[-3] ^= 0xFF  # inside the value: the CRC no longer matches (sealed: not rescanned)
    first.write_bytes(bytes(raw))
    proc2 = broker_factory(data_dir=data)
    async with Consumer(proc2.address) as consumer:
        consumer.assign([("rot", 0)])
        consumer.seek_to_beginning()
        with pytest.raises(CorruptMessage) as bad:
            for _ in range(10):
                await consumer.poll(timeout_ms=2000)
        assert "\n" not in str(bad.value) and "rot-0 at offset 0" in str(bad.value)
        consumer.seek(("rot", 0), 1)
        records = []
        while len(records) < 3:
            polled = await consumer.poll(timeout_ms=5000)
            assert polled
            records += polled
    assert [r.value for r in records] == [b"value-1", b"value-2", b"value-3"]


async def test_a_cluster_under_a_low_descriptor_limit_fills_to_its_cap(cluster_factory):
    """Three brokers under `ulimit -n 512`, every partition on every broker (RF 3): the
    partitions up to the cap are created and served, one more is refused naming the
    limit, no broker dies of EMFILE, descriptors match the budget (a followed partition
    costs one, not one plus a connection), and a restarted broker comes back."""
    import psutil

    from minibroker.broker.common.descriptors import descriptor_budget

    from .cluster_helpers import broker_stats, wait_for

    limit = 512
    budget = descriptor_budget(3, limit=limit)
    with fd_limit(limit):
        state = await cluster_factory(3, {"min.insync.replicas": 2})
    # The health topic (one partition, on every broker) is hosted already.
    room = budget.partitions - 1
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic("full", room, 3)])
        with pytest.raises(KafkaError) as refused:
            await admin.create_topics([NewTopic("over", 1, 3)])
        assert refused.value.code == ErrorCode.POLICY_VIOLATION
        assert f"ulimit -n = {limit}" in str(refused.value)
        assert f"cap of {budget.partitions}" in str(refused.value)
        assert "over" not in await admin.list_topics()

    async def all_in_sync():
        for b in range(3):
            parts = [
                x for x in (await broker_stats(state, b))["partitions"] if x["topic"] == "full"
            ]
            if len(parts) != room or any(len(x["isr"]) != 3 for x in parts):
                return False
        return True

    await wait_for(all_in_sync, 120, f"{room} partitions in sync on every broker")
    async with Producer(state.bootstrap, acks="all") as producer:
        acked = [await producer.send("full", b"p%d" % i, partition=i) for i in range(0, room, 7)]
    for b in range(3):
        process = state.process(b)
        assert process is not None and process.is_running(), f"broker {b} died"
        fds = process.num_fds()
        # Each broker: its partitions, its own files and links, its open connections.
        assert fds <= budget.reserved + budget.partitions + 40, (b, fds)
        assert fds < limit
    state.restart(1)
    await wait_for(all_in_sync, 120, "the restarted broker back in every ISR")
    got = await consume_all(state.bootstrap, "full", room, len(acked))
    assert {(m.partition, m.offset) for m in acked} <= set(got)
    for b in range(3):
        log = (state.data_dir / f"broker-{b}" / "broker.log").read_text()
        assert "EMFILE" not in log and "Too many open files" not in log, b
    assert all(psutil.pid_exists(state.process(b).pid) for b in range(3))
