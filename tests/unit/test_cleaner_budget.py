"""The log cleaner in bounded memory (issue 34): a compressed batch's records streamed and
re-encoded in chunks, the offset map in its byte budget, and a batch the budget cannot
clean copied as it is while the rest of the log is cleaned.

A manual clock drives every timestamp decision; no test sleeps.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import threading
import time
import tracemalloc
from pathlib import Path

import psutil
import zstandard
from crc32c import crc32c

from minibroker.broker.storage import Log, LogConfig, cleaner
from minibroker.broker.storage.cleaner_batch import Budget
from minibroker.broker.storage.cleaner_manager import LogCleanerManager
from minibroker.broker.storage.offset_map import ENTRY_BYTES, OffsetMap
from minibroker.protocol import encode_batch, iter_batches, read_records
from minibroker.protocol.batch import (
    KAFKA_FLAG,
    patch_base_offset,
    unwrap_kafka_batch,
    wrap_kafka_batch,
)
from minibroker.protocol.kafka import records as kafka_records
from minibroker.protocol.kafka.messages import write_varint

NOW = 10_000_000
TS = NOW - 1000
# The big batch's record count. Each pass over it is Python work per record (~5 us a
# record on an idle core, two passes): 10^6 keeps the suite's time; the 10^7
# (~5 min on a loaded 2-core machine) is a MINIBROKER_CLEANER_TEST_RECORDS=10000000 run.
RECORDS = int(os.environ.get("MINIBROKER_CLEANER_TEST_RECORDS", 10**6))


class Clock:
    def __call__(self) -> int:
        return NOW


def compacted(path: Path, **config) -> Log:
    settings = {"cleanup_policy": "compact", "min_cleanable_dirty_ratio": 0.0, **config}
    return Log.open(path, LogConfig(**settings), now_ms=Clock())


def kafka_batch(
    records: list[tuple[bytes | None, bytes | None]], codec: int = kafka_records.ZSTD
) -> bytearray:
    raw = kafka_records.encode_batch([(TS, k, v, ()) for k, v in records], compression=codec)
    return wrap_kafka_batch(raw, 0, kafka_records.check_batch(raw, 0, len(raw)))


def zstd_batch(count: int, body: bytes | None = None, records=None) -> bytearray:
    """A zstd v2 batch built a megabyte at a time: ``records`` yields each record's bytes
    after its length (attributes on), or ``body`` is the whole (possibly bogus) block."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    parts = []
    if body is not None:
        parts.append(compressor.compress(body))
    else:
        chunk = bytearray()
        for rec in records:
            write_varint(chunk, len(rec))
            chunk += rec
            if len(chunk) >= 1 << 20:
                parts.append(compressor.compress(bytes(chunk)))
                chunk.clear()
        parts.append(compressor.compress(bytes(chunk)))
    parts.append(compressor.flush())
    fixed = struct.pack(">hiqqqhii", kafka_records.ZSTD, count - 1, TS, TS, -1, -1, -1, count)
    tail = fixed + b"".join(parts)
    head = kafka_records.PREFIX.pack(0, len(tail) + 9, -1) + struct.pack(">bI", 2, crc32c(tail))
    raw = head + tail
    return wrap_kafka_batch(raw, 0, kafka_records.check_batch(raw, 0, len(raw)))


def record(offset_delta: int, key: bytes, value: bytes) -> bytes:
    rec = bytearray(b"\x00\x00")  # attributes, timestamp delta 0
    write_varint(rec, offset_delta)
    write_varint(rec, len(key))
    rec += key
    write_varint(rec, len(value))
    rec += value
    rec += b"\x00"  # no headers
    return bytes(rec)


def store(log: Log, batch: bytes | bytearray) -> None:
    """Write one batch as a follower copies its leader's: no record validation, as data
    that reached the disk before anything checked it (what the cleaner must survive)."""
    data = bytearray(batch)
    patch_base_offset(data, 0, log.log_end_offset)
    log.append_as_follower(data)


def read_all(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    offset, out = log.log_start_offset, []
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        out += [(r.offset, r.key, r.value) for r in read_records(result.data, min_offset=offset)]
        offset = result.next_offset
    return out


def clean(log: Log, budget: Budget | None = None) -> cleaner.Stats | None:
    plan = cleaner.plan(log, log.log_end_offset, NOW, budget)
    return None if plan is None else cleaner.clean_now(plan)


class PeakRss:
    """This process's resident size sampled every 5 ms from a thread: its peak over the
    baseline taken when it starts."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.base = self.peak = self.process.memory_info().rss
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.done.wait(0.005):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    @property
    def grown_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def test_the_offset_map_stays_in_its_budget() -> None:
    """The map's capacity comes from ENTRY_BYTES: filled to capacity it must take no more
    than its budget (peak, the dict's growth included), for short keys (kept as they are)
    and long ones (kept as digests)."""
    budget = 16 << 20
    for make in (lambda i: b"%016d" % i, lambda i: b"a-long-key-%040d" % i):
        tracemalloc.start()
        m = OffsetMap(budget)
        before = tracemalloc.get_traced_memory()[0]
        i = 0
        while m.put(make(i), 2**40 + i):
            i += 1
        peak = tracemalloc.get_traced_memory()[1] - before
        tracemalloc.stop()
        assert i == m.capacity == len(m) > 80_000
        assert peak <= budget, (peak, budget)
        assert m.get(make(5)) == 2**40 + 5 and m.get(b"absent") == -1
        assert m.put(make(5), 7) and m.get(make(5)) == 7  # a known key still updates


def test_a_full_offset_map_cleans_up_to_where_it_reached_and_the_next_pass_goes_on(
    tmp_path: Path,
) -> None:
    """A map of 20 keys over a log of 100: each pass cleans below the offset where its
    map filled and checkpoints that; passes repeat until the log is clean, and the result
    is what an unbounded map (and the default io buffer) gives."""
    # A tiny io buffer too: its batches (~60 bytes) are streamed, not decoded at once as
    # the unbounded log's are, and both must come out the same.
    budget = Budget(io_buffer_size=64, dedupe_buffer_size=20 * ENTRY_BYTES * 10 // 9 + 1)
    assert OffsetMap(budget.dedupe_buffer_size).capacity == 20
    log = compacted(tmp_path / "small", segment_bytes=2000)
    unbounded = compacted(tmp_path / "big", segment_bytes=2000)
    for target in (log, unbounded):
        for r in range(3):
            for k in range(100):
                target.append_as_leader(encode_batch([(TS, b"k%d" % k, b"%d" % r, ())]), 1)
        target.roll()
    clean(unbounded)
    first = clean(log, budget)
    assert first is not None
    assert log.first_dirty_offset == 20  # the 21st distinct key did not fit
    after_first = dict((o, (k, v)) for o, k, v in read_all(log))
    assert all(o in after_first for o in range(20, 300))  # nothing from 20 on went yet
    passes = 1
    while clean(log, budget) is not None:
        passes += 1
        assert passes < 30
    assert read_all(log) == read_all(unbounded)
    assert [(o, k) for o, k, _ in read_all(log)] == [(200 + k, b"k%d" % k) for k in range(100)]


def test_a_compressed_batch_of_many_records_is_cleaned_in_bounded_memory(tmp_path: Path) -> None:
    """RECORDS (10^7) one-byte-value records in one zstd batch (~11 bytes a record
    decompressed: 110 MB; decoded whole as before, ~1.5 GB of Python objects). The dirty
    section overwrites the 1,000 keys of all but its last fifth, whose keys are unique:
    the cleaner drops 80% and re-compresses the kept run in batches of about half the
    io buffer. Bound: the process grows by less than two copies of the compressed batch
    (read whole, then unwrapped: 2 MB each at 10^6, 22 MB at 10^7) plus 24 MB (windows,
    chunks, the map), sampled every 5 ms. The topic's decompression limit is raised (its
    default, 64 MiB, would have it copied as it is at 10^7)."""
    n, unique = RECORDS, RECORDS // 5

    def records():
        for i in range(n):
            key = b"k%03d" % (i % 1000) if i < n - unique else b"u%08d" % i
            yield record(i, key, b"v")

    big = zstd_batch(n, records=records())
    log = compacted(tmp_path, max_message_bytes=len(big) + 1, max_decompressed_bytes=1 << 30)
    store(log, big)
    log.roll()
    log.append_as_leader(kafka_batch([(b"k%03d" % k, b"w") for k in range(1000)]), 1)
    log.roll()
    log.first_dirty_offset = n  # the big batch was cleaned before: its keys are not mapped
    bound_mb = 2 * len(big) / 2**20 + 24
    del big
    with PeakRss() as rss:
        stats = clean(log)
    assert stats is not None and stats.copied_count == 0
    assert stats.records_kept == unique + 1000
    assert rss.grown_mb < bound_mb, f"grew {rss.grown_mb:.1f} MB, bound {bound_mb:.1f} MB"
    data = log.read(0, 1 << 30).data
    headers = [h for _, h in iter_batches(data)]
    assert len(headers) > 2  # the kept run came out in several chunks
    assert all(h.attributes & KAFKA_FLAG for h in headers)
    kept = [h for h in headers if h.base_offset < n]
    assert kept[0].base_offset == n - unique
    assert sum(h.record_count for h in kept) == unique
    assert all(
        kafka_records.unpack_header(unwrap_kafka_batch(data, p, h)).compression
        == kafka_records.ZSTD
        for p, h in iter_batches(data)
    )
    first = read_records(data[: kept[0].size])
    assert (first[0].offset, first[0].key, first[0].value) == (
        n - unique,
        b"u%08d" % (n - unique),
        b"v",
    )


def test_a_batch_over_the_budget_is_copied_as_is_and_the_rest_is_cleaned(tmp_path: Path) -> None:
    """Three batches the budget cannot clean, among ordinary ones: a zstd block of 256 MB
    of zeros (not records: its first window says so), a record whose 8 MB value is over
    the record limit in a batch that loses a record, and a batch over max.message.bytes
    read in pieces. Each is copied byte for byte and reported; everything else is
    cleaned. The manager logs each by partition and offset and keeps the log cleanable."""
    log = compacted(tmp_path, max_message_bytes=4 << 20, segment_bytes=1 << 30)
    zeros = zstd_batch(3, body=bytes(256 << 20))
    huge_value = zstd_batch(2, records=[record(0, b"big", bytes(8 << 20)), record(1, b"x", b"1")])
    budget = Budget(io_buffer_size=1 << 16)
    for r in range(5):
        log.append_as_leader(encode_batch([(TS, b"x", b"old-%d" % r, ())]), 1)  # 0-4
    store(log, zeros)  # 5-7
    store(log, huge_value)  # 8-9
    wide = encode_batch([(TS, b"w%d" % i, bytes(100), ()) for i in range(20_000)])
    assert len(wide) > (1 << 20)
    log.append_as_leader(wide, 1)  # 10-20009, over max.message.bytes: not read whole
    log.append_as_leader(kafka_batch([(b"x", b"new")]), 1)  # 20010
    log.roll()
    log.config = dataclasses.replace(log.config, max_message_bytes=1 << 20)  # lowered since
    with open(log.segments[0].path, "rb") as fh:
        before = fh.read()
    events = []

    class Recorder:
        def __getattr__(self, level: str):
            return lambda event, **fields: events.append((event, fields))

    manager = LogCleanerManager(lambda: [(log, log.log_end_offset)], 60_000, Recorder(), budget)
    import trio

    assert trio.run(manager.clean_filthiest)
    copied = [f for e, f in events if e == "log_cleaner_batch_copied"]
    assert [f["offset"] for f in copied] == [5, 8, 10], events
    assert all(f["partition"] == tmp_path.name for f in copied)
    assert "record length" in copied[0]["reason"]
    assert "over the" in copied[1]["reason"]
    assert "over the read limit" in copied[2]["reason"]
    assert manager.stats()["uncleanable_partitions"] == []
    assert manager.stats()["batches_copied_uncleaned"] == 3
    with open(log.segments[0].path, "rb") as fh:
        after = fh.read()
    for batch in (zeros, huge_value, wide):
        assert bytes(batch[16:]) in after  # CRC onwards as written: copied as it is
    assert len(after) < len(before)
    offsets = [h.base_offset for _, h in iter_batches(after)]
    assert offsets == [5, 8, 10, 20010]  # the overwritten x's (0-4) went
    assert log.first_dirty_offset == log.segments[0].next_offset


def test_the_loop_is_not_held_while_a_bomb_is_cleaned(tmp_path: Path) -> None:
    """The manager's worker thread reads a zstd block of 2 GB of zeros, value of one
    record, skipping it (values are never held) up to the decompression limit: trio's
    loop keeps waking within 100 ms meanwhile (Python's switch interval is 5 ms)."""
    import trio

    body = bytearray()
    write_varint(body, 2**31 - 100)  # the record's length: its value is all that follows
    body += b"\x00\x00\x00\x02k"
    write_varint(body, 2**31 - 120)
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    parts = [compressor.compress(bytes(body))]
    zeros = bytes(64 << 20)
    for _ in range(2**31 // len(zeros)):
        parts.append(compressor.compress(zeros))
    parts.append(compressor.flush())
    fixed = struct.pack(">hiqqqhii", kafka_records.ZSTD, 0, TS, TS, -1, -1, -1, 1)
    tail = fixed + b"".join(parts)
    raw = kafka_records.PREFIX.pack(0, len(tail) + 9, -1) + struct.pack(">bI", 2, crc32c(tail))
    raw += tail
    assert len(raw) < 1 << 20
    log = compacted(tmp_path)
    store(log, wrap_kafka_batch(raw, 0, kafka_records.check_batch(raw, 0, len(raw))))
    log.append_as_leader(kafka_batch([(b"k", b"new")]), 1)
    log.roll()
    late: list[float] = []

    async def main() -> None:
        manager = LogCleanerManager(lambda: [(log, log.log_end_offset)], 60_000, _Quiet())
        done = trio.Event()

        async def watch() -> None:
            while not done.is_set():
                start = time.perf_counter()
                await trio.sleep(0.001)
                late.append(time.perf_counter() - start)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            with PeakRss() as rss:
                assert await manager.clean_filthiest()
            done.set()
        assert manager.stats()["batches_copied_uncleaned"] == 1
        assert rss.grown_mb < 40, f"grew {rss.grown_mb:.1f} MB"

    trio.run(main)
    assert max(late) < 0.1, max(late)


class _Quiet:
    def __getattr__(self, name: str):
        return lambda *a, **k: None


def test_records_that_cannot_be_encoded_again_are_copied_as_is(tmp_path: Path) -> None:
    """A CRC-valid batch of ours whose timestamp delta puts a record past int64 (bytes
    no client of ours writes, but the disk may hold): losing a record, it cannot be
    re-encoded, so it is copied as it is, and the pass goes on."""
    from minibroker.protocol.batch import encode_rows

    log = compacted(tmp_path)
    odd = encode_rows([(0, b"x", b"1"), (2**63 - 1, b"k", b"v")], TS, TS)
    store(log, odd)  # 0-1
    log.append_as_leader(encode_batch([(TS, b"x", b"2", ())]), 1)  # 2: x overwritten
    log.append_as_leader(encode_batch([(TS, b"y", b"1", ())]), 1)  # 3
    log.append_as_leader(encode_batch([(TS, b"y", b"2", ())]), 1)  # 4
    log.roll()
    stats = clean(log)
    assert stats is not None and [o for o, _ in stats.copied] == [0]
    assert "error" in stats.copied[0][1]
    data = log.read(0, 1 << 20).data
    assert bytes(odd[16:]) in data
    assert [h.base_offset for _, h in iter_batches(data)] == [0, 2, 4]
