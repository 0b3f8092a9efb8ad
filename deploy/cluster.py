"""A local multi-process cluster: start, find, pause, resume, kill, restart and stop brokers.

State (ports, pids, settings) lives in ``DATA_DIR/cluster.json`` so any shell can
drive a running cluster. Broker ``i`` listens on ``base_port + i`` and keeps its
data in ``DATA_DIR/broker-i``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from broker.metadata import write_atomic

from .cluster_secret import ensure_cluster_secret
from .launcher import BrokerProcess, ping, port_in_use

STATE_FILE = "cluster.json"
DEFAULT_DATA_DIR = Path("minibroker-data")
DEFAULT_BASE_PORT = 9092


class ClusterError(RuntimeError):
    """A cluster operation that cannot be done, with what to do instead."""


@dataclass
class ClusterState:
    data_dir: Path
    base_port: int
    brokers: int
    config: dict[str, str] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)
    host: str = "127.0.0.1"

    @property
    def path(self) -> Path:
        return self.data_dir / STATE_FILE

    def port(self, broker_id: int) -> int:
        return self.base_port + broker_id

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.host}:{self.port(i)}" for i in range(self.brokers))

    def voters(self) -> str:
        return ",".join(f"{i}@{self.host}:{self.port(i)}" for i in range(self.brokers))

    def save(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        body = {
            "base_port": self.base_port,
            "brokers": self.brokers,
            "config": self.config,
            "pids": {str(k): v for k, v in self.pids.items()},
            "host": self.host,
        }
        write_atomic(self.path, json.dumps(body, indent=1).encode())

    @classmethod
    def load(cls, data_dir: Path) -> ClusterState:
        path = Path(data_dir) / STATE_FILE
        try:
            body = json.loads(path.read_text())
        except FileNotFoundError:
            raise ClusterError(
                f"no cluster in {data_dir}: start one with 'minibroker cluster up --data-dir {data_dir}'"
            ) from None
        except ValueError:
            raise ClusterError(
                f"{path} is corrupt; stop the brokers by hand and remove it"
            ) from None
        return cls(
            Path(data_dir),
            body["base_port"],
            body["brokers"],
            body.get("config", {}),
            {int(k): v for k, v in body.get("pids", {}).items()},
            body.get("host", "127.0.0.1"),
        )

    # --- processes -------------------------------------------------------------------------

    def broker_process(self, broker_id: int) -> BrokerProcess:
        config = {
            "controller.quorum.voters": self.voters(),
            "cluster.secret.file": ensure_cluster_secret(self.data_dir),
            **self.config,
        }
        return BrokerProcess(
            broker_id,
            self.port(broker_id),
            self.data_dir / f"broker-{broker_id}",
            config,
            self.host,
        )

    def process(self, broker_id: int) -> psutil.Process | None:
        """The live OS process of a broker, checked to really be that broker (pids get reused)."""
        pid = self.pids.get(broker_id)
        if pid is None:
            return None
        try:
            proc = psutil.Process(pid)
            cmdline = proc.cmdline()
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        if "deploy.cli" not in cmdline or str(self.data_dir / f"broker-{broker_id}") not in cmdline:
            return None
        return proc

    def status_of(self, broker_id: int) -> str:
        proc = self.process(broker_id)
        if proc is None:
            return "dead"
        try:
            return "paused" if proc.status() == psutil.STATUS_STOPPED else "alive"
        except psutil.NoSuchProcess:
            return "dead"

    def check_id(self, broker_id: int) -> None:
        if not 0 <= broker_id < self.brokers:
            raise ClusterError(
                f"no broker {broker_id}: this cluster has brokers 0..{self.brokers - 1}"
            )

    def start(self, broker_id: int) -> BrokerProcess:
        if self.process(broker_id) is not None:
            raise ClusterError(
                f"broker {broker_id} is already running (pid {self.pids[broker_id]})"
            )
        if port_in_use(self.host, self.port(broker_id)):
            # Checked up front: the readiness ping would otherwise be answered by whoever
            # holds the port (another cluster), while our broker fails to bind and exits.
            raise ClusterError(
                f"port {self.port(broker_id)} for broker {broker_id} is in use (another "
                "cluster?): stop it or choose another --base-port"
            )
        bp = self.broker_process(broker_id)
        bp.start()
        self.pids[broker_id] = bp.pid
        return bp

    def start_all(self) -> None:
        """Start every broker, record their pids, and wait until each answers."""
        for i in range(self.brokers):
            self.start(i)
        self.save()
        self.wait_ready(list(range(self.brokers)))

    def restart(self, broker_id: int) -> None:
        """Stop the broker if it runs (cleanly), start it on the same data, wait for it."""
        self.check_id(broker_id)
        if self.process(broker_id) is not None:
            self.stop(broker_id)
        self.start(broker_id)
        self.save()
        self.wait_ready([broker_id])

    def stop_all(self) -> None:
        for i in range(self.brokers):
            self.stop(i)

    def signal(self, broker_id: int, sig: signal.Signals) -> None:
        self.check_id(broker_id)
        proc = self.process(broker_id)
        if proc is None:
            raise ClusterError(
                f"broker {broker_id} is not running; start it with 'minibroker cluster restart {broker_id}'"
            )
        proc.send_signal(sig)

    def kill(self, broker_id: int) -> None:
        self.signal(broker_id, signal.SIGKILL)
        self._wait_gone(broker_id, 10)

    def stop(self, broker_id: int, timeout: float = 15) -> None:
        proc = self.process(broker_id)
        if proc is None:
            return
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        if not self._wait_gone(broker_id, timeout):
            proc.send_signal(signal.SIGKILL)
            self._wait_gone(broker_id, 10)

    def _wait_gone(self, broker_id: int, timeout: float) -> bool:
        pid = self.pids.get(broker_id)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                # Reap it if it is our child; otherwise just watch it disappear.
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if self.process(broker_id) is None:
                return True
            time.sleep(0.01)
        return False

    def wait_ready(self, broker_ids: list[int], timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        pending = list(broker_ids)
        while pending:
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"brokers {pending} did not answer within {timeout}s; see their broker.log"
                )
            for bid in list(pending):
                if self.process(bid) is None:
                    log = self.broker_process(bid).tail_log()
                    raise ClusterError(f"broker {bid} exited during start: {log}")
                if ping(self.host, self.port(bid), timeout=0.2):
                    pending.remove(bid)
            if pending:
                time.sleep(0.005)
