"""Start, stop, pause and kill broker *processes*: used by `minibroker cluster` and by the tests.

A broker is `python -m deploy.broker_cli ...` in its own process with its own data
directory; readiness means it answered an ApiVersions request on its port.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

from minibroker.protocol import ApiKey, FrameDecoder, decode_response_envelope, encode_request


class BrokerStartError(RuntimeError):
    """A broker process exited or did not answer in time."""


# Test and default ports stay below the kernel's ephemeral range (Linux: 32768-60999), which
# it hands out to outgoing connections: a port picked there can be taken by any client
# socket between our check and the broker's bind, and "in use" would then be misleading.
TEST_PORTS = (20000, 32767)


def ephemeral_range() -> tuple[int, int]:
    """The range the OS picks outgoing connections' local ports from."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default; IANA's is 49152-65535


def _bind_all(host: str, ports: range) -> bool:
    socks: list[socket.socket] = []
    try:
        for port in ports:
            s = socket.socket()
            socks.append(s)
            s.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def free_port_range(count: int, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive free ports below the ephemeral range, at random
    (a cluster listens on base..base+count-1; random, so parallel tests rarely meet)."""
    low, high = TEST_PORTS
    for _ in range(200):
        base = random.randint(low, high - count + 1)
        if _bind_all(host, range(base, base + count)):
            return base
    raise OSError(f"no run of {count} free ports in {low}-{high} on {host}")


def free_port(host: str = "127.0.0.1") -> int:
    """One free port below the ephemeral range (port 0 would land inside it)."""
    return free_port_range(1, host)


def port_in_use(host: str, port: int) -> bool:
    """True if something already listens on (or holds) host:port."""
    with socket.socket() as s:
        # As the broker's listener does: a port held only by TIME_WAIT connections is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def port_holder(port: int) -> str:
    """Who holds a port we could not bind, in words: a listener, or an outgoing connection
    whose local port the OS took from the ephemeral range."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        conns = []
    mine = [c for c in conns if c.laddr and c.laddr.port == port]
    if any(c.status == psutil.CONN_LISTEN for c in mine):
        return "another program listens there (another cluster?)"
    low, high = ephemeral_range()
    if mine or low <= port <= high:
        where = f"; it is in the ephemeral range {low}-{high}" if low <= port <= high else ""
        return (
            f"an outgoing connection holds it{where}, which the OS hands out to client "
            f"sockets: choose a port below {low}"
        )
    return "something holds it (another cluster?)"


def ping(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if a broker answers ApiVersions on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(encode_request(ApiKey.API_VERSIONS, 0, 1, "launcher", {}))
            decoder = FrameDecoder()
            while True:
                data = sock.recv(65536)
                if not data:
                    return False
                frames = decoder.feed(data)
                if frames:
                    corr, body = decode_response_envelope(frames[0])
                    return corr == 1 and isinstance(body, dict) and body.get("error_code") == 0
    except (OSError, ValueError):
        return False


class BrokerProcess:
    def __init__(
        self,
        broker_id: int,
        port: int,
        data_dir: Path,
        config: Mapping[str, object] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.broker_id = broker_id
        self.host = host
        self.port = port
        self.data_dir = Path(data_dir)
        self.config = dict(config or {})
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "minibroker.deploy.broker_cli",
            "--id",
            str(self.broker_id),
            "--listen",
            self.address,
            "--data-dir",
            str(self.data_dir),
        ]
        for key, value in self.config.items():
            if isinstance(value, bool):
                value = "true" if value else "false"
            cmd += ["--set", f"{key}={value}"]
        return cmd

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # Own session: a Ctrl-C at the launcher's terminal does not reach the brokers.
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise BrokerStartError(
                    f"broker {self.broker_id} exited with code {self.proc.returncode}: {self.tail_log()}"
                )
            if ping(self.host, self.port, timeout=0.5):
                return
            time.sleep(0.01)
        raise BrokerStartError(
            f"broker {self.broker_id} did not answer on {self.address} within {timeout}s"
        )

    def tail_log(self, lines: int = 5) -> str:
        try:
            return " | ".join(
                self.log_path.read_text(errors="replace").strip().splitlines()[-lines:]
            )
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal(self, sig: signal.Signals) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye — what a crash looks like."""
        if self.alive():
            self._signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait for a clean shutdown; SIGKILL if it does not come."""
        if not self.alive():
            return self.proc.returncode if self.proc else None
        self._signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)
