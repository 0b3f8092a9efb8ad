"""`minibroker broker` that cannot start says why in one line: the port or the data dir,
never an ExceptionGroup traceback; too few file descriptors close partitions, not the
broker."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from minibroker.client import Admin, NewTopic
from minibroker.deploy.launcher import BrokerProcess, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def run_broker(
    *args: str, nofile: int | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    def limit_files() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return subprocess.run(
        [sys.executable, "-m", "minibroker.deploy.cli", "broker", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=limit_files,
    )


def the_error_line(result: subprocess.CompletedProcess) -> str:
    """The broker's own log lines may precede it; the failure itself is one line."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_a_busy_port_is_one_line_naming_it(tmp_path):
    with socket.create_server(("127.0.0.1", free_port())) as holder:
        port = holder.getsockname()[1]
        result = run_broker("--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "b"))
    line = the_error_line(result)
    assert f"port {port} on 127.0.0.1 is in use" in line


def test_a_busy_kafka_listener_port_is_named_with_its_setting_not_listen(tmp_path):
    """Issue 36: the free native port and --listen were blamed for the Kafka listener's."""
    native = free_port()
    with socket.create_server(("127.0.0.1", free_port())) as holder:
        port = holder.getsockname()[1]
        result = run_broker(
            "--listen", f"127.0.0.1:{native}", "--data-dir", str(tmp_path / "b"),
            "--set", f"kafka.listener=127.0.0.1:{port}",
        )  # fmt: skip
    line = the_error_line(result)
    assert f"port {port} on 127.0.0.1 is in use" in line
    assert "kafka.listener" in line and "--listen" not in line and str(native) not in line


def test_an_unusable_data_dir_is_named_as_the_data_dir_not_the_port(tmp_path):
    # As root a read-only directory is still writable; a path under a regular file fails
    # the same way (an OSError with a file name) on any account.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    port = free_port()
    result = run_broker("--listen", f"127.0.0.1:{port}", "--data-dir", str(blocker / "data"))
    line = the_error_line(result)
    assert f"cannot use data dir {blocker / 'data'}: not a directory" in line
    assert "listen" not in line


def test_a_max_connections_above_the_descriptor_limit_is_refused_naming_both(tmp_path):
    """Issue 40: max.connections=19000 was cut to 14,916 without a word."""
    port = free_port()
    result = run_broker(
        "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "b"),
        "--set", "max.connections=5000", nofile=1024,
    )  # fmt: skip
    line = the_error_line(result)
    assert "'max.connections' = 5000" in line and "`ulimit -n` = 1024" in line
    assert "at most 896" in line  # 1024 - 112 own - 16 headroom


async def test_too_few_file_descriptors_at_start_close_partitions_not_the_broker(tmp_path):
    data_dir = tmp_path / "b"
    broker = BrokerProcess(0, free_port(), data_dir)
    broker.start()
    try:
        await trio.to_thread.run_sync(broker.wait_ready)
        async with Admin(broker.address) as admin:
            await admin.create_topics([NewTopic("many", 40, 1)])
    finally:
        broker.stop()
    # Each partition keeps at least its active segment open, so 40 partitions cannot all
    # open under 40 descriptors. A broker never exits for EMFILE (issue 26): the ones
    # that do not fit stay closed, each named in the log with the limit.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "minibroker.deploy.cli",
            "broker",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--data-dir",
            str(data_dir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40)),
    )
    try:

        def first_refusal() -> str:
            for line in proc.stderr:
                if "partition_not_opened" in line or line.startswith("error: "):
                    return line
            return ""

        with trio.fail_after(60):
            line = await trio.to_thread.run_sync(first_refusal)
        assert "partition_not_opened" in line, line
        assert "fd_limit=40" in line and "EMFILE" in line
        assert proc.poll() is None, "the broker exited"
    finally:
        proc.kill()
        proc.wait(10)
