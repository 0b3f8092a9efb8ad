"""Compression bombs in a compacted topic (issue 34): the log cleaner streams them in its
memory budget, copies what it cannot clean as it is, and keeps cleaning the partition,
with the broker's resident size under 150 MB throughout (sampled every 20 ms).

Two bombs. One a produce's validation would accept (one record, a 60 MiB value of
zeros: ~2 KB of zstd), produced through the Kafka listener; the cleaner used to inflate
it whole. One it would refuse (a 2 GB value of zeros), written into the segment while
the broker is down, as old data on disk never checked: after the restart, the cleaner
must take it without exhausting memory, as often as it comes back to it.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import pytest
import zstandard
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import NewTopic as RdNewTopic
from crc32c import crc32c

from minibroker.deploy.testing import DEFAULT_CONFIG, LocalCluster, start_cluster
from minibroker.protocol.batch import iter_batches, wrap_kafka_batch
from minibroker.protocol.kafka import KafkaApi, KafkaRequestHeader, decode_response, encode_request
from minibroker.protocol.kafka import records as kafka_records
from minibroker.protocol.kafka.messages import write_varint
from tests.integration.cluster_helpers import read_segments

pytestmark = pytest.mark.integration

RSS_LIMIT_MB = 150
TOPIC = "bombed"
CONFIG = {**DEFAULT_CONFIG, "log.cleaner.backoff.ms": 100}


def bomb(value_bytes: int, key: bytes = b"bomb") -> bytes:
    """A zstd v2 batch of one record whose value is ``value_bytes`` zeros, compressed
    64 MiB at a time (the zeros are never all in memory)."""
    head = bytearray(b"\x00\x00\x00")  # attributes, timestamp delta, offset delta
    write_varint(head, len(key))
    head += key
    write_varint(head, value_bytes)
    rec = bytearray()
    write_varint(rec, len(head) + value_bytes + 1)
    rec += head
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    parts = [compressor.compress(bytes(rec))]
    zeros = bytes(min(value_bytes, 64 << 20))
    left = value_bytes
    while left:
        parts.append(compressor.compress(zeros[: min(left, len(zeros))]))
        left -= min(left, len(zeros))
    parts.append(compressor.compress(b"\x00"))  # no headers
    parts.append(compressor.flush())
    now = int(time.time() * 1000)
    fixed = struct.pack(">hiqqqhii", kafka_records.ZSTD, 0, now, now, -1, -1, -1, 1)
    tail = fixed + b"".join(parts)
    return (
        kafka_records.PREFIX.pack(0, len(tail) + 9, -1) + struct.pack(">bI", 2, crc32c(tail)) + tail
    )


def produce(cluster: LocalCluster, batch: bytes, correlation_id: int) -> int:
    """One Produce (v8, acks=1) through the Kafka listener; the base offset."""
    header = KafkaRequestHeader(KafkaApi.PRODUCE, 8, correlation_id, "bomber")
    body = {
        "transactional_id": None,
        "acks": 1,
        "timeout_ms": 30_000,
        "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": batch}]}],
    }
    address = (cluster.state.host, cluster.state.kafka_base_port)
    with socket.create_connection(address, timeout=60) as sock:
        sock.sendall(encode_request(header, body))
        stream = sock.makefile("rb")
        (size,) = struct.unpack(">i", stream.read(4))
        payload = stream.read(size)
    part = decode_response(header, payload)["responses"][0]["partition_responses"][0]
    assert part["error_code"] == 0, part
    return part["base_offset"]


def overwrite(cluster: LocalCluster, rounds: int, first_id: int) -> None:
    """Small batches overwriting a few keys, the bomb's among them: dirty records enough
    to roll segments (4 KB) and make every pass drop something."""
    for r in range(rounds):
        records = [(int(time.time() * 1000), b"k%d" % k, b"v%d" % r, ()) for k in range(5)]
        records.append((int(time.time() * 1000), b"bomb", b"defused-%d" % r, ()))
        produce(cluster, kafka_records.encode_batch(records), first_id + r)


class RssWatch:
    """The broker's peak resident size, sampled every 20 ms from a thread."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.peak_mb = 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.02):
            process = self.cluster.state.process(0)
            if process is not None:
                try:
                    self.peak_mb = max(self.peak_mb, process.memory_info().rss / 2**20)
                except Exception:  # the process went (a restart): the next one is sampled
                    pass

    def stop(self) -> float:
        self.done.set()
        self.thread.join()
        return self.peak_mb


def cleaner_stats(cluster: LocalCluster) -> dict:
    return cluster.stats(0)["log_cleaner"]


def checkpoint(directory: Path) -> int:
    try:
        return int((directory / "cleaner-offset-checkpoint").read_text())
    except (FileNotFoundError, ValueError):
        return -1


def wait_until(predicate, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.1)


def test_compression_bombs_are_cleaned_in_bounded_memory_even_after_a_restart(tmp_path: Path):
    cluster = start_cluster(tmp_path / "c", 1, CONFIG)
    watch = RssWatch(cluster)
    try:
        admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
        configs = {
            "cleanup.policy": "compact",
            "internal.segment.bytes": "4096",
            "min.cleanable.dirty.ratio": "0.01",
        }
        for future in admin.create_topics([RdNewTopic(TOPIC, 1, 1, config=configs)]).values():
            future.result(30)
        accepted = bomb(60 << 20)
        assert len(accepted) < 64 << 10
        assert produce(cluster, accepted, 1) == 0
        overwrite(cluster, 40, 100)
        # The 60 MiB record is dropped (overwritten): rewriting its batch would hold it,
        # so the batch is copied as it is, and the rest of the partition cleaned.
        wait_until(lambda: cleaner_stats(cluster)["batches_copied_uncleaned"] >= 1, "a copy")
        wait_until(lambda: cleaner_stats(cluster)["passes"] >= 1, "a pass")
        assert cleaner_stats(cluster)["uncleanable_partitions"] == []
        directory = next(Path(tmp_path / "c").rglob(f"{TOPIC}-0"))

        # Down: a 2 GB bomb appended to the active segment as if written long ago.
        cluster.stop(0)
        active = max(directory.glob("*.log"))
        data = active.read_bytes()
        batches = list(iter_batches(data, verify=False))
        end = batches[-1][1].next_offset if batches else int(active.stem)
        epoch = batches[-1][1].leader_epoch if batches else 0
        raw = bomb(2**31 - 64)
        wrapped = wrap_kafka_batch(raw, 0, kafka_records.check_batch(raw, 0, len(raw)))
        struct.pack_into(">q", wrapped, 0, end)
        struct.pack_into(">i", wrapped, 12, epoch)
        with open(active, "ab") as fh:
            fh.write(wrapped)
        cluster.restart(0)
        overwrite(cluster, 40, 1000)  # rolls the bomb's segment and makes it dirty
        # A pass that went past the 2 GB bomb moves the clean/dirty boundary beyond it,
        # copying both bombs as they are.
        wait_until(lambda: checkpoint(directory) > end, "a pass over the 2 GB bomb", 120)
        stats = cleaner_stats(cluster)
        assert stats["uncleanable_partitions"] == [] and stats["batches_copied_uncleaned"] >= 2
        assert cluster.status(0) == "alive"
        assert raw[16:] in b"".join(read_segments(directory))
    finally:
        peak = watch.stop()
        cluster.close()
    assert peak < RSS_LIMIT_MB, f"the broker reached {peak:.0f} MB"
