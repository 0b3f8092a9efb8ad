"""Storage against forged batches, index overflow, bad segment files and descriptor use.

Every case checks the error (or the warning) *and* that the log still holds exactly
the good records, before and after a reopen.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import msgpack
import pytest
import structlog

from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.common.descriptors import descriptor_budget
from minibroker.broker.common.topic_config import TOPIC_CONFIGS, topic_configs_error, topic_value
from minibroker.broker.replication.replica_manager import log_config_from
from minibroker.broker.storage import Log, LogConfig
from minibroker.broker.storage import segment as segment_module
from minibroker.broker.storage.limits import (
    partition_cap,
    partition_cap_error,
    replica_counts,
)
from minibroker.protocol import encode_batch, read_records
from minibroker.protocol.errors import CorruptMessage, RecordListTooLarge

INT_MAX = 2**31 - 1


def batch(values: list[bytes], base_offset: int = 0) -> bytes:
    return encode_batch(
        [(1000 + i, None, v, []) for i, v in enumerate(values)], base_offset=base_offset
    )


def forged(
    count: int, *, base_offset: int = 0, last_delta: int | None = None, payload: bytes | None = None
) -> bytes:
    """A batch whose header claims ``count`` records, with a correct CRC."""
    if payload is None:
        payload = b"\xdd" + count.to_bytes(4, "big") + msgpack.packb([0, None, b"x"])
    delta = count - 1 if last_delta is None else last_delta
    tail = struct.pack(">hiqqi", 0, delta, 1000, 1000, count) + payload
    head = struct.pack(">qiiI", base_offset, len(tail) + 8, -1, zlib.crc32(tail))
    return head + tail


def open_log(path: Path, **config: int) -> Log:
    return Log.open(path, LogConfig(**config), now_ms=lambda: 1_000_000)


def values(log: Log) -> list[tuple[int, bytes]]:
    out = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 16)
        assert result.next_offset > offset
        out += [(r.offset, r.value) for r in read_records(result.data, min_offset=offset)]
        offset = result.next_offset
    return out


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# --- batch checks before a byte is written ----------------------------------------------


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (forged(INT_MAX), "record_count 2147483647 cannot fit"),
        (forged(3, payload=msgpack.packb([[0, None, b"x"]] * 2)), "records array holds 2"),
        (
            forged(2, last_delta=5, payload=msgpack.packb([[0, None, b"x"]] * 2)),
            "last_offset_delta 5",
        ),
        (forged(0, payload=msgpack.packb([])), "record_count 0"),
    ],
)
def test_forged_batch_is_refused_naming_the_field_and_nothing_is_written(
    tmp_path: Path, bad: bytes, field: str
) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch([b"a", b"b"]), 0)
    size = log.size_bytes
    with pytest.raises(CorruptMessage, match=field):
        log.append_as_leader(bad, 0)
    with pytest.raises(CorruptMessage, match=field):  # a good batch in front changes nothing
        log.append_as_leader(batch([b"c"]) + bad, 0)
    assert (log.log_end_offset, log.size_bytes) == (2, size)
    log.close()
    log = open_log(tmp_path)
    assert values(log) == [(0, b"a"), (1, b"b")]


@pytest.mark.parametrize("limit", ["MAX_POSITION", "MAX_RELATIVE_OFFSET"])
def test_segment_rolls_before_the_index_could_overflow(
    tmp_path: Path, monkeypatch, limit: str
) -> None:
    """With an index limit shrunk, every append still lands indexable, in a new segment
    when needed; a request no segment could index is refused before it is written."""
    monkeypatch.setattr(segment_module, limit, 400)
    log = open_log(tmp_path, index_interval_bytes=1)
    expected = []
    for i in range(12):
        values_ = [b""] * (20 + i * 3) if limit == "MAX_POSITION" else [b"%d" % i] * (100 + i * 20)
        info = log.append_as_leader(batch(values_), 0)
        expected += [(info.first_offset + j, v) for j, v in enumerate(values_)]
    assert len(log.segments) > 2
    for segment in log.segments:
        assert segment.size <= 400 or limit != "MAX_POSITION"
        assert segment.next_offset - 1 - segment.base_offset <= 400 or limit == "MAX_POSITION"
    size, leo = log.size_bytes, log.log_end_offset
    too_big = [b"x" * 500] if limit == "MAX_POSITION" else [b""] * 402
    with pytest.raises(RecordListTooLarge, match="do not fit one segment"):
        log.append_as_leader(batch(too_big), 0)
    assert (log.size_bytes, log.log_end_offset) == (size, leo)
    log.close()
    assert values(open_log(tmp_path)) == expected


# --- a broker always restarts -----------------------------------------------------------


def _write_segment(directory: Path, base: int, data: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{base:020d}.log"
    path.write_bytes(data)
    return path


def test_restart_with_a_forged_batch_in_the_active_segment(tmp_path: Path) -> None:
    good = batch([b"a", b"b"]) + batch([b"c"], base_offset=2)
    # The forged batch (record_count 2^31-1) moves the next base to 2^31+2: a batch at
    # relative offset 2^31 follows, as a broker that accepted the forgery wrote it.
    data = good + forged(INT_MAX, base_offset=3) + batch([b"z"], base_offset=3 + INT_MAX)
    _write_segment(tmp_path, 0, data)
    with structlog.testing.capture_logs() as logs:
        log = open_log(tmp_path)
    assert values(log) == [(0, b"a"), (1, b"b"), (2, b"c")]
    warning = next(e for e in logs if e["event"] == "log_recovery_truncated")
    assert warning["position"] == len(good)
    assert warning["bytes_removed"] == len(data) - len(good)
    assert log.append_as_leader(batch([b"d"]), 0).first_offset == 3
    log.close()
    assert values(open_log(tmp_path))[-1] == (3, b"d")


def test_restart_with_an_unindexable_offset_in_an_older_segment(tmp_path: Path) -> None:
    """A sealed segment (header-only scan) whose batch sits at relative offset 2^31:
    the segment is cut before it, later segments go aside as ``*.corrupt``."""
    good = batch([b"a", b"b"])
    bad_tail = forged(INT_MAX, base_offset=2) + batch([b"z"], base_offset=1 + 2**31)
    _write_segment(tmp_path, 0, good + bad_tail)
    later = _write_segment(tmp_path, 2 + 2**31, batch([b"later"], base_offset=2 + 2**31))
    with structlog.testing.capture_logs() as logs:
        log = open_log(tmp_path)
    assert values(log) == [(0, b"a"), (1, b"b")]
    assert log.log_end_offset == 2
    events = [e["event"] for e in logs]
    assert "log_recovery_bad_segment" in events
    assert "log_recovery_quarantined_segment" in events
    assert not later.exists()
    assert later.with_name(later.name + ".corrupt").exists()
    assert log.append_as_leader(batch([b"c"]), 0).first_offset == 2
    log.close()
    reopened = open_log(tmp_path)
    assert values(reopened) == [(0, b"a"), (1, b"b"), (2, b"c")]


@pytest.mark.parametrize(
    "garbage",
    [b"\xff" * 100, struct.pack(">qi", 0, -50) + b"\x00" * 40, struct.pack(">qi", 0, INT_MAX)],
)
def test_restart_with_garbage_after_good_batches(tmp_path: Path, garbage: bytes) -> None:
    _write_segment(tmp_path, 0, batch([b"a"]) + batch([b"b"], base_offset=1) + garbage)
    log = open_log(tmp_path)
    assert values(log) == [(0, b"a"), (1, b"b")]


# --- file descriptors -------------------------------------------------------------------


def test_only_the_active_segment_keeps_a_descriptor(tmp_path: Path) -> None:
    before = open_fds()
    log = open_log(tmp_path, segment_bytes=1)  # one batch per segment
    for i in range(150):
        log.append_as_leader(batch([f"v{i}".encode()]), 0)
    assert len(log.segments) == 150
    log.recovery.wait()  # a roll's flush holds a descriptor of its own while it runs
    assert open_fds() - before <= 1
    assert len(values(log)) == 150  # reads reopen sealed files through a bounded LRU
    assert open_fds() - before <= 1 + segment_module.MAX_OPEN_SEALED
    log.close()
    assert open_fds() <= before  # (<: the shared LRU may have closed other tests' files)
    log = open_log(tmp_path, segment_bytes=1)  # a restart does not keep every segment open
    assert open_fds() - before <= 1
    assert [v for _, v in values(log)] == [f"v{i}".encode() for i in range(150)]
    log.close()


def test_partition_cap_from_the_descriptor_limit() -> None:
    # 1024 - 112 reserved (48 own + 64 sealed) = 912, less a floor of 912 // 16 = 57 for
    # connections and a headroom of 16 that connections leave for partitions to come.
    assert partition_cap(1024) == 912 - 57 - 16
    assert partition_cap(10) == 1
    hosted = [[0, 1], [1, 2], [2, 0], [3]]  # two replicas on each of three brokers
    counts = replica_counts(hosted, [0, 1, 2])  # broker 3 is not live: not counted
    assert counts == {0: 2, 1: 2, 2: 2}
    cap = partition_cap(1024, brokers=3)
    assert partition_cap_error(counts, cap - 2, 1, limit=1024 * 3) is None
    room = (cap - 2) * 3
    assert partition_cap_error(counts, room, 1, limit=1024) is None
    problem = partition_cap_error(counts, room + 1, 1, limit=1024)
    assert problem is not None
    assert f"over its cap of {cap}" in problem and "ulimit -n = 1024" in problem


@pytest.mark.parametrize("limit", [64, 256, 400, 1024, 4096, 65536])
@pytest.mark.parametrize("brokers", [1, 3, 9])
@pytest.mark.parametrize("configured", [-1, 3, 100, 10**6])
def test_partitions_and_connections_at_their_caps_fit_the_limit(limit, brokers, configured):
    """Every cap reached at once still leaves the broker's own descriptors: the
    partitions, the connections and the reserve never add up past the limit (bar the
    minimum of one partition and one connection a tiny limit still gets)."""
    budget = descriptor_budget(brokers, max_connections=configured, limit=limit)
    assert budget.partitions >= 1 and budget.connections >= 1
    if configured > 0:
        assert budget.connections <= configured
    # Connections at their room with the partitions at their cap still fit.
    if limit >= budget.reserved + 2 * 16:
        room = budget.connection_room(budget.partitions)
        assert budget.reserved + room + budget.partitions <= limit


def test_connections_take_what_open_partitions_leave():
    """One shared budget: a 20,000 limit admits ~19,500 connections while few partitions
    are open (a fixed quarter held 4,969), fewer as partitions open, never fewer than the
    floor the partition cap keeps for them."""
    budget = descriptor_budget(3, limit=20_000)
    assert budget.reserved == 122 and budget.headroom == 310
    assert budget.connections == 19_568
    assert budget.connection_room(0) == 19_568
    assert budget.connection_room(1_000) == 18_568
    assert budget.connection_room(budget.partitions) == budget.connection_floor == 1_242
    assert budget.connection_room(10**6) == budget.connection_floor
    capped = descriptor_budget(3, max_connections=500, limit=20_000)
    assert capped.connection_room(0) == 500 and capped.connection_room(19_000) == 500


def test_a_max_connections_the_limit_cannot_hold_is_refused_not_cut(monkeypatch):
    from minibroker.broker.common import descriptors

    monkeypatch.setattr(descriptors, "fd_limit", lambda: 20_000)
    assert descriptors.connections_error(19_568, 3) is None
    problem = descriptors.connections_error(19_569, 3)
    assert problem is not None
    assert "'max.connections' = 19569" in problem and "`ulimit -n` = 20000" in problem
    assert "at most 19568" in problem


def test_a_broker_raises_its_soft_descriptor_limit_or_takes_the_one_it_is_given(tmp_path):
    """In a child process: setting a hard limit cannot be undone in this one."""
    import subprocess
    import sys

    code = (
        "import resource\n"
        "from minibroker.broker.common.descriptors import raise_fd_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "print(*raise_fd_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MINIBROKER_NOFILE_LIMIT"}
    raised = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    before, after, at_hard = raised.stdout.split()
    assert before == "256" and int(after) > 256 and at_hard == "True"
    env["MINIBROKER_NOFILE_LIMIT"] = "300"
    given = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert given.stdout.split()[:2] == ["256", "300"]
    env["MINIBROKER_NOFILE_LIMIT"] = "lots"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "MINIBROKER_NOFILE_LIMIT='lots'" in bad.stderr


# --- topic configs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("configs", "problem"),
    [
        (
            {"min.insync.replicas": "0"},
            "'min.insync.replicas' = 0 is outside the allowed range [1, ",
        ),
        ({"min.insync.replicas": "-5"}, "= -5 is outside"),
        ({"max.message.bytes": "-1"}, "'max.message.bytes' = -1 is outside the allowed range [0, "),
        ({"segment.ms": "0"}, "'segment.ms' = 0"),
        ({"retention.ms": "-7"}, "'retention.ms' = -7 is outside the allowed range [-1, "),
        ({"segment.bytes": "4000000000"}, "[1048576, 2147483647]"),
        ({"segment.bytes": "1"}, "'segment.bytes' = 1 is outside"),
        ({"segment.bytes": "big"}, "'segment.bytes' must be an integer, got 'big'"),
        ({"compression": "zstd"}, "unknown topic config 'compression'"),
    ],
)
def test_topic_config_bounds(configs: dict, problem: str) -> None:
    assert problem in (topic_configs_error(configs) or "")


def test_topic_config_values_and_broker_defaults() -> None:
    broker = {d.broker_key: 7 for d in TOPIC_CONFIGS.values() if d.broker_key}
    assert topic_configs_error({"segment.bytes": "1048576", "retention.ms": "-1"}) is None
    assert topic_value("segment.bytes", {"segment.bytes": "2097152"}, broker) == 2097152
    assert topic_value("segment.bytes", None, broker) == 7
    # A stored value from before the bounds falls back to the broker's, never crashes.
    assert topic_value("min.insync.replicas", {"min.insync.replicas": "-5"}, broker) == 7


def test_log_config_from_topic_overrides() -> None:
    broker = BrokerConfig({"log.segment.bytes": "2097152", "log.roll.ms": "5000"})
    config = log_config_from(broker, {"retention.ms": "-1", "segment.ms": "0"})
    assert (config.segment_bytes, config.retention_ms) == (2097152, -1)
    assert config.segment_ms == 5000  # a stored 0 is out of bounds: the broker's wins
    assert log_config_from(broker, {"internal.segment.bytes": "100"}).segment_bytes == 100
