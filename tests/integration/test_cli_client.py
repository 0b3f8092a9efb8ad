"""`minibroker topics|produce|consume` as a user runs them: real processes, real broker."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio

from minibroker.deploy.launcher import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MINIBROKER_BOOTSTRAP", None)
    return subprocess.run(
        [sys.executable, "-m", "minibroker.deploy.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr
    return lines[0]


def test_topics_create_list_describe(broker):
    created = cli(
        "topics",
        "create",
        "clitopic",
        "--partitions",
        "3",
        "--replication-factor",
        "1",
        "--bootstrap",
        broker,
    )
    assert created.returncode == 0, created.stderr
    assert "clitopic" in cli("topics", "list", "--bootstrap", broker).stdout.split()
    described = cli("topics", "describe", "clitopic", "--bootstrap", broker)
    assert "PartitionCount: 3" in described.stdout
    assert described.stdout.count("Leader: 0") == 3
    again = cli("topics", "create", "clitopic", "--bootstrap", broker)
    assert again.returncode != 0
    assert "TOPIC_ALREADY_EXISTS" in one_error_line(again)


def test_produce_then_consume_with_keys_and_options(broker):
    assert (
        cli("topics", "create", "lines", "--partitions", "1", "--bootstrap", broker).returncode == 0
    )
    produced = cli(
        "produce",
        "lines",
        "--key-separator",
        ":",
        "--acks",
        "all",
        "--bootstrap",
        broker,
        stdin="k1:one\nk2:two\nthree\nk4:four\n",
    )
    assert produced.returncode == 0, produced.stderr

    everything = cli(
        "consume", "lines", "--from-beginning", "--timeout-ms", "1500", "--bootstrap", broker
    )
    assert everything.stdout.splitlines() == ["one", "two", "three", "four"]
    assert "Processed a total of 4 messages" in everything.stderr

    keyed = cli(
        "consume",
        "lines",
        "--from-beginning",
        "--print-key",
        "--max-messages",
        "2",
        "--bootstrap",
        broker,
    )
    assert keyed.stdout.splitlines() == ["k1\tone", "k2\ttwo"]

    offset = cli(
        "consume",
        "lines",
        "--partition",
        "0",
        "--offset",
        "2",
        "--timeout-ms",
        "1500",
        "--print-key",
        "--key-separator",
        "=",
        "--bootstrap",
        broker,
    )
    assert offset.stdout.splitlines() == ["null=three", "k4=four"]

    latest = cli("consume", "lines", "--timeout-ms", "500", "--bootstrap", broker)
    assert latest.returncode == 0 and latest.stdout == ""


def test_bootstrap_from_environment(broker):
    env_result = subprocess.run(
        [sys.executable, "-m", "minibroker.deploy.cli", "topics", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "MINIBROKER_BOOTSTRAP": broker},
    )
    assert env_result.returncode == 0, env_result.stderr


def test_unreachable_broker_is_one_line_with_a_hint():
    port = free_port()
    result = cli("topics", "list", "--bootstrap", f"127.0.0.1:{port}")
    assert result.returncode != 0
    line = one_error_line(result)
    assert f"no broker answered METADATA: 127.0.0.1:{port} (connection refused)" in line
    assert "minibroker cluster up" in line


async def test_failed_produce_names_the_error_and_the_undelivered_count(cluster_factory):
    from .test_client import paused_follower_topic

    _, leader = await paused_follower_topic(cluster_factory, "stallcli")
    result = await trio.to_thread.run_sync(
        lambda: cli(
            "produce",
            "stallcli",
            "--acks",
            "all",
            "--bootstrap",
            leader,
            "--property",
            "request.timeout.ms=500",
            "--property",
            "delivery.timeout.ms=1500",
            stdin="a\nb\nc\n",
        )
    )
    assert result.returncode != 0
    line = one_error_line(result)
    assert "3 of 3 record(s) were not delivered" in line
    assert "REQUEST_TIMED_OUT" in line


def test_unknown_topic_and_bad_property_are_one_line(broker):
    missing = cli("consume", "ghost", "--timeout-ms", "200", "--bootstrap", broker)
    assert missing.returncode != 0
    assert "minibroker topics create ghost" in one_error_line(missing)
    typo = cli("produce", "ghost", "--property", "linger.m=5", "--bootstrap", broker)
    assert typo.returncode != 0
    assert "did you mean 'linger.ms'" in one_error_line(typo)


def test_produce_to_a_missing_topic_fails_fast_and_counts_what_was_not_delivered(broker):
    started = time.monotonic()
    result = cli("produce", "ghost", "--bootstrap", broker, stdin="a\nb\n")
    elapsed = time.monotonic() - started
    assert result.returncode == 3
    line = one_error_line(result)
    assert "1 of 1 record(s) were not delivered: UNKNOWN_TOPIC_OR_PARTITION x1" in line
    assert "minibroker topics create ghost" in line and "stopped reading input" in line
    # The producer's own wait for metadata (max.block.ms) is 10 s; a topic the broker
    # says does not exist is reported well before that.
    assert elapsed < 8, elapsed


def test_a_port_that_is_not_a_broker_is_named_as_not_speaking_the_protocol():
    """An HTTP server that answers anything with 400, as most do to bytes they cannot parse:
    its b"HTTP" used to be read as a frame of 1213486160 bytes."""
    listener = socket.create_server(("127.0.0.1", free_port()))

    def answer_with_http() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer_with_http, daemon=True).start()
    port = listener.getsockname()[1]
    try:
        result = cli("topics", "list", "--bootstrap", f"127.0.0.1:{port}")
    finally:
        listener.close()
    assert result.returncode != 0
    line = one_error_line(result)
    assert f"127.0.0.1:{port}" in line
    assert "does not speak minibroker's protocol" in line and "b'HTTP'" in line
    assert "1213486160 bytes exceeds" not in line


def test_a_port_that_accepts_and_never_answers_is_named_fast():
    """A paused broker, or an HTTP server waiting for a line our binary request never
    sends: it used to cost request.timeout.ms (30 s) and end in REQUEST_TIMED_OUT."""
    listener = socket.create_server(("127.0.0.1", free_port()))
    held = []

    def accept_and_stay_silent() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept_and_stay_silent, daemon=True).start()
    port = listener.getsockname()[1]
    refused = free_port()
    try:
        start = time.monotonic()
        alone = cli("topics", "list", "--bootstrap", f"127.0.0.1:{port}")
        alone_s = time.monotonic() - start
        start = time.monotonic()
        listed = cli("topics", "list", "--bootstrap", f"127.0.0.1:{port},127.0.0.1:{refused}")
        listed_s = time.monotonic() - start
    finally:
        listener.close()
        for conn in held:
            conn.close()
    assert held, "the CLI never connected"
    line = one_error_line(alone)
    assert f"no broker answered METADATA: 127.0.0.1:{port} (no answer in 2000 ms)" in line
    # api.version.request.timeout.ms (2 s) plus starting Python; far from 30 s.
    assert alone_s < 10, alone_s
    line = one_error_line(listed)
    assert f"127.0.0.1:{port} (no answer in 2000 ms)" in line
    assert f"127.0.0.1:{refused} (connection refused)" in line
    assert listed_s < 10, listed_s
