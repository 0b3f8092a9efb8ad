"""One-line start-up errors name the real problem; test ports stay out of the ephemeral
range; text where a frame length should be is named as another protocol."""

from __future__ import annotations

import errno
import os
import resource
import socket
from pathlib import Path

import pytest

from minibroker.deploy.broker_cli import describe_start_error
from minibroker.deploy.launcher import (
    DEFAULT_TEST_PORTS,
    configured_ports,
    ephemeral_range,
    free_port,
    free_port_range,
    parse_port_range,
    port_holder,
)
from minibroker.protocol import FrameDecoder
from minibroker.protocol.errors import FrameTooLarge


def test_start_errors_name_port_data_dir_or_descriptor_limit():
    data = Path("/srv/mb")
    busy = describe_start_error(
        OSError(errno.EADDRINUSE, "Address in use"), "127.0.0.1", 9092, data
    )
    assert busy.startswith("port 9092 on 127.0.0.1 is in use")
    readonly = OSError(errno.EROFS, "Read-only file system", "/srv/mb/broker.lock")
    text = describe_start_error(readonly, "127.0.0.1", 9092, data)
    assert text == "cannot use data dir /srv/mb: read-only file system (/srv/mb/broker.lock)"
    emfile = OSError(errno.EMFILE, "Too many open files", "/srv/mb/t-0/0.log")
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert describe_start_error(emfile, "127.0.0.1", 9092, data).startswith(
        f"too many open files (limit {soft})"
    )
    # A full disk while writing a checkpoint (no file name on the error) is a storage
    # error, never "cannot listen" (issue 26).
    full = describe_start_error(
        OSError(errno.ENOSPC, "No space left on device"), "127.0.0.1", 24302, data
    )
    assert full.startswith("storage error in data dir /srv/mb: no space left on device")
    assert "cannot listen" not in full and "/srv/mb/broker.log" in full
    odd = describe_start_error(OSError(errno.EPIPE, "Broken pipe"), "127.0.0.1", 9092, data)
    assert odd == "failed while starting on /srv/mb: broken pipe"


def test_test_ports_come_from_below_the_ephemeral_range():
    low, _ = ephemeral_range()
    first, last = configured_ports()
    assert last < min(low, 32768)
    for _ in range(20):
        assert first <= free_port() <= last
        base = free_port_range(3)
        assert first <= base and base + 2 <= last


def test_port_range_comes_from_the_environment_or_says_what_is_wrong():
    assert parse_port_range("") == DEFAULT_TEST_PORTS
    assert parse_port_range(" 21000-22999 ") == (21000, 22999)
    for bad in ("21000", "a-b", "22999-21000", "80-2000", "21000-21010", "21000-70000"):
        with pytest.raises(ValueError, match="MINIBROKER_PORT_RANGE"):
            parse_port_range(bad)


def test_port_holder_tells_a_listener_from_an_outgoing_connection():
    with socket.create_server(("127.0.0.1", free_port())) as listener:
        assert "listens there" in port_holder(listener.getsockname()[1])
        with socket.create_connection(listener.getsockname()) as outgoing:
            assert "outgoing connection" in port_holder(outgoing.getsockname()[1])


@pytest.mark.parametrize("reply", [b"HTTP/1.1 400 Bad Request\r\n\r\n", b"SSH-2.0-OpenSSH_9.6\r\n"])
def test_text_instead_of_a_frame_length_says_the_peer_speaks_another_protocol(reply):
    with pytest.raises(FrameTooLarge) as caught:
        FrameDecoder().feed(reply)
    assert "does not speak minibroker's protocol" in str(caught.value)
    assert repr(reply[:4]) in str(caught.value)


def test_a_binary_oversized_length_is_still_reported_as_a_size():
    with pytest.raises(FrameTooLarge, match="frame of 4294967295 bytes exceeds the maximum"):
        FrameDecoder().feed(b"\xff\xff\xff\xff")


def test_a_bad_port_range_stops_pytest_with_one_line(tmp_path):
    """The plugin reads MINIBROKER_PORT_RANGE in pytest_configure: a usage error, not the
    "Error while loading plugin" traceback an import-time ValueError gave."""
    import subprocess
    import sys

    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "MINIBROKER_PORT_RANGE": "abc"},
    )
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, output
    assert "Traceback" not in output and "Error while loading plugin" not in output
    assert output.splitlines() == [
        "ERROR: MINIBROKER_PORT_RANGE='abc' is not a port range: write it as lo-hi, e.g. 21000-22999"
    ], output
