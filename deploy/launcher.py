"""Start, stop, pause and kill broker *processes*: used by `minibroker cluster` and by the tests.

A broker is `broker_cli.main(args)` in its own process with its own data directory,
forked from a warm parent that imported the broker once (deploy/forkserver.py), as if
started as `python -m minibroker.deploy.broker_cli args`; readiness means it answered an
ApiVersions request on its port. It is not our child: it is watched by pid and start
time (psutil), so a reused pid is never taken for it.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

from minibroker.broker.storage.dir_lock import lock_holder
from minibroker.deploy.forkserver import spawn
from minibroker.protocol import ApiKey, FrameDecoder, decode_response_envelope, encode_request


class BrokerStartError(RuntimeError):
    """A broker process exited or did not answer in time."""


# Test and default ports stay below the kernel's ephemeral range (Linux: 32768-60999), which
# it hands out to outgoing connections: a port picked there can be taken by any client
# socket between our check and the broker's bind, and "in use" would then be misleading.
DEFAULT_TEST_PORTS = (20000, 32767)
PORT_RANGE_ENV = "MINIBROKER_PORT_RANGE"


def parse_port_range(value: str | None = None) -> tuple[int, int]:
    """The ports tests and the pytest plugin pick from: MINIBROKER_PORT_RANGE=lo-hi, so two
    suites (or a suite and a CI job) on one machine can be kept apart, or the default."""
    if value is None:
        value = os.environ.get(PORT_RANGE_ENV, "")
    if not value.strip():
        return DEFAULT_TEST_PORTS
    low_text, sep, high_text = value.strip().partition("-")
    try:
        if not sep:
            raise ValueError
        low, high = int(low_text), int(high_text)
    except ValueError:
        raise ValueError(
            f"{PORT_RANGE_ENV}={value!r} is not a port range: write it as lo-hi, e.g. 21000-22999"
        ) from None
    if not 1024 <= low < high <= 65535 or high - low < 63:
        raise ValueError(
            f"{PORT_RANGE_ENV}={value!r}: need 1024 <= lo < hi <= 65535 and at least 64 ports"
        )
    return low, high


@functools.cache
def configured_ports() -> tuple[int, int]:
    """The environment's range, read when a port is first picked rather than at import:
    the pytest plugin imports this module while pytest loads it, where a ValueError is a
    traceback; its pytest_configure reports a bad value as one usage-error line."""
    return parse_port_range()


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


def worker_ports() -> tuple[int, int]:
    """configured_ports() (MINIBROKER_PORT_RANGE), or this pytest-xdist worker's own share of
    them: a port one worker checked free is never the one another worker's broker binds a
    moment later."""
    low, high = configured_ports()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if count <= 1 or not worker[2:].isdigit():
        return low, high
    size = (high - low + 1) // count
    start = low + (int(worker[2:]) % count) * size
    return start, start + size - 1


def free_port_range(count: int, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive free ports below the ephemeral range, at random
    (a cluster listens on base..base+count-1; random, so parallel tests rarely meet)."""
    low, high = worker_ports()
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


BROKER_MODULE = "minibroker.deploy.broker_cli"


def holds_lock(proc: psutil.Process, lock_path: Path) -> bool:
    """True if ``proc`` is the broker holding this data dir: the kernel says its pid holds
    the flock on ``lock_path`` (``dir_lock.lock_holder``), whatever the clock did."""
    return lock_holder(lock_path.parent) == proc.pid


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
        # The forked broker (psutil checks its start time before every signal); None when
        # not started, or it exited before we could look at it.
        self.process: psutil.Process | None = None
        self._pid: int | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def lock_path(self) -> Path:
        return self.data_dir.resolve() / ".lock"

    @property
    def pid(self) -> int | None:
        return self._pid

    def arguments(self) -> list[str]:
        """The broker's command-line arguments (``broker_cli``'s)."""
        args = ["--id", str(self.broker_id), "--listen", self.address]
        args += ["--data-dir", str(self.data_dir)]
        for key, value in self.config.items():
            if isinstance(value, bool):
                value = "true" if value else "false"
            args += ["--set", f"{key}={value}"]
        return args

    def command(self) -> list[str]:
        """The same broker as a command line of its own (what the fork stands for)."""
        return [sys.executable, "-m", BROKER_MODULE, *self.arguments()]

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._pid = spawn(self.arguments(), self.log_path.resolve())
        try:
            self.process = psutil.Process(self._pid)
        except psutil.NoSuchProcess:
            self.process = None  # exited at once: wait_ready reports its log

    def wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise BrokerStartError(f"broker {self.broker_id} exited: {self.tail_log()}")
            if ping(self.host, self.port, timeout=0.5):
                return
            time.sleep(0.01)
        raise BrokerStartError(
            f"broker {self.broker_id} did not answer on {self.address} within {timeout}s"
        )

    def wait_locked(self, timeout: float = 15.0) -> bool:
        """Wait until the broker holds its data dir (what proves a pid is this broker);
        False if it exited first or did not in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.alive():
            if holds_lock(self.process, self.lock_path):
                return True
            time.sleep(0.002)
        return False

    def tail_log(self, lines: int = 5) -> str:
        try:
            return " | ".join(
                self.log_path.read_text(errors="replace").strip().splitlines()[-lines:]
            )
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        try:
            return (
                self.process is not None
                and self.process.is_running()
                and self.process.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.NoSuchProcess:
            return False

    def _signal(self, sig: signal.Signals) -> None:
        if self.alive():
            try:
                self.process.send_signal(sig)  # psutil: only if the start time still matches
            except psutil.NoSuchProcess:
                pass

    def _wait(self, timeout: float) -> bool:
        try:
            self.process.wait(timeout)
        except psutil.TimeoutExpired:
            return False
        return True

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye — what a crash looks like."""
        if self.alive():
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGKILL)
            self._wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM and wait for a clean shutdown; SIGKILL if it does not come."""
        if not self.alive():
            return
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        if not self._wait(timeout):
            self._signal(signal.SIGKILL)
            self._wait(10)
