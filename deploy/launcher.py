"""Start, stop, pause and kill broker *processes*: used by `minibroker cluster` and by the tests.

A broker is `python -m deploy.cli broker ...` in its own process with its own data
directory; readiness means it answered an ApiVersions request on its port.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from protocol import ApiKey, FrameDecoder, decode_response_envelope, encode_request


class BrokerStartError(RuntimeError):
    """A broker process exited or did not answer in time."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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


def free_port_range(count: int, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive free ports (a cluster listens on base..base+count-1)."""
    import random

    for _ in range(100):
        base = random.randint(20000, 60000 - count)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise OSError(f"no run of {count} free ports on {host}")


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
            "deploy.cli",
            "broker",
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
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        with open(self.log_path, "ab") as log:
            # Own session: a Ctrl-C at the launcher's terminal does not reach the brokers.
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
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
