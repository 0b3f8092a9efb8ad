"""A local multi-process cluster: start, find, pause, resume, kill, restart and stop brokers.

State (ports, pids, settings) lives in ``DATA_DIR/cluster.json`` so any shell can
drive a running cluster. Broker ``i`` listens on ``base_port + i`` and keeps its
data in ``DATA_DIR/broker-i``.

A process is signalled only once it is proven to be *this* cluster's broker. The proof
is the data dir: the kernel's lock table says the process holds the flock on broker i's
``.lock`` under this cluster's absolute path (broker/storage/dir_lock.py), which a
copied cluster.json or another cluster's broker with the same layout never matches, and
a reused pid cannot hold. It does not depend on process start times, which psutil derives
from the wall clock's idea of the boot time: an NTP step moves them all (issue 35: 8 s,
and ``cluster down`` took running brokers for someone else's). A broker started as a
command of its own by an older minibroker is also recognised by its recorded pid and start
time together with its command line naming the data dir and port.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from minibroker.broker.common.atomic_file import write_atomic
from minibroker.broker.storage.dir_lock import lock_holder, shut_down_cleanly
from minibroker.deploy.cluster_secret import ensure_cluster_secret
from minibroker.deploy.launcher import BrokerProcess, ping, port_holder, port_in_use

STATE_FILE = "cluster.json"
_BROKER_MODULES = frozenset(
    {"minibroker.deploy.broker_cli", "minibroker.deploy.cli", "deploy.broker_cli", "deploy.cli"}
)
DEFAULT_DATA_DIR = Path("minibroker-data")
DEFAULT_BASE_PORT = 9092
# cluster up's Kafka listeners (stock Kafka clients) sit this far above the native ports.
KAFKA_PORT_OFFSET = 100
# What `cluster up` gives every broker unless a --set says otherwise. A local broker
# restarts in about a second, so its leaderships should come back in seconds, not after
# Kafka's 300 s imbalance check (sized for fleets, where moving leaders costs more).
LOCAL_CLUSTER_CONFIG: dict[str, str] = {"leader.imbalance.check.interval.seconds": "5"}


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
    # psutil create_time of each pid, recorded at launch: a pid reused by another process
    # (or listed in a copied cluster.json) has another start time.
    started: dict[int, float] = field(default_factory=dict)
    # Broker i's Kafka listener (kafka.listener) is on kafka_base_port + i; 0: none.
    kafka_base_port: int = 0
    # The brokers this object launched (not saved): one launched a moment ago holds no
    # lock yet, so nothing proves it ours but having launched it (see ``stop_together``).
    launched: dict[int, BrokerProcess] = field(default_factory=dict, repr=False, compare=False)

    @property
    def root(self) -> Path:
        """The data dir as an absolute path: what brokers are launched with and checked by."""
        return self.data_dir.resolve()

    @property
    def path(self) -> Path:
        return self.data_dir / STATE_FILE

    def port(self, broker_id: int) -> int:
        return self.base_port + broker_id

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.host}:{self.port(i)}" for i in range(self.brokers))

    @property
    def kafka_bootstrap(self) -> str:
        """Stock Kafka clients' bootstrap.servers ("" when the Kafka listeners are off)."""
        if not self.kafka_base_port:
            return ""
        return ",".join(f"{self.host}:{self.kafka_base_port + i}" for i in range(self.brokers))

    def voters(self) -> str:
        return ",".join(f"{i}@{self.host}:{self.port(i)}" for i in range(self.brokers))

    def save(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        body = {
            "base_port": self.base_port,
            "brokers": self.brokers,
            "config": self.config,
            "pids": {str(k): v for k, v in self.pids.items()},
            "started": {str(k): v for k, v in self.started.items() if k in self.pids},
            "host": self.host,
            "kafka_base_port": self.kafka_base_port,
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
            {int(k): float(v) for k, v in body.get("started", {}).items()},
            body.get("kafka_base_port", 0),
        )

    # --- processes -------------------------------------------------------------------------

    def broker_process(self, broker_id: int) -> BrokerProcess:
        config = {
            "controller.quorum.voters": self.voters(),
            "cluster.secret.file": ensure_cluster_secret(self.data_dir),
            **self.config,
        }
        if self.kafka_base_port:
            config["kafka.listener"] = f"{self.host}:{self.kafka_base_port + broker_id}"
        return BrokerProcess(
            broker_id,
            self.port(broker_id),
            self.broker_dir(broker_id),
            config,
            self.host,
        )

    def broker_dir(self, broker_id: int) -> Path:
        return self.root / f"broker-{broker_id}"

    def _alive(self, pid: int | None) -> psutil.Process | None:
        if not pid:
            return None
        try:
            proc = psutil.Process(pid)
            return None if proc.status() == psutil.STATUS_ZOMBIE else proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    def _launched(self, broker_id: int) -> psutil.Process | None:
        """The live process with the pid and start time recorded at launch (not yet
        proven to be the broker: see ``process``)."""
        started = self.started.get(broker_id)
        proc = self._alive(self.pids.get(broker_id))
        if proc is None or started is None:
            return None  # no start time recorded (an older cluster.json): never signal it
        try:
            create_time = proc.create_time()
        except psutil.Error:
            return None
        return proc if abs(create_time - started) <= 0.05 else None

    def process(self, broker_id: int) -> psutil.Process | None:
        """The live OS process of a broker, proven to be this cluster's broker (see above).

        The holder of its data dir's lock, whichever pid cluster.json lists for it: a
        recorded pid is a hint, the lock is the proof (a cluster.json that lost its pids,
        as issue 35's did, still finds its running brokers)."""
        proc = self._alive(lock_holder(self.broker_dir(broker_id)))
        if proc is not None:
            return proc
        proc = self._launched(broker_id)
        if proc is None:
            return None
        try:
            cmdline = proc.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        return proc if self._is_our_command(broker_id, cmdline) else None

    def _is_our_command(self, broker_id: int, cmdline: list[str]) -> bool:
        def option(name: str) -> str | None:
            try:
                return cmdline[cmdline.index(name) + 1]
            except (ValueError, IndexError):
                return None

        return (
            # deploy.cli, and the names before the one root package: brokers started by an
            # older minibroker, still ours to stop.
            not _BROKER_MODULES.isdisjoint(cmdline)
            and option("--data-dir") == str(self.broker_dir(broker_id))
            and option("--listen") == f"{self.host}:{self.port(broker_id)}"
        )

    def status_of(self, broker_id: int) -> str:
        """``alive``, ``paused``; or not running: ``stopped`` (its last shutdown was clean)
        or ``dead`` (killed, crashed, or never started)."""
        proc = self.process(broker_id)
        try:
            if proc is not None:
                return "paused" if proc.status() == psutil.STATUS_STOPPED else "alive"
        except psutil.NoSuchProcess:
            pass
        return "stopped" if shut_down_cleanly(self.broker_dir(broker_id)) else "dead"

    def running(self, broker_id: int) -> bool:
        return self.status_of(broker_id) in ("alive", "paused")

    def remember_running(self) -> None:
        """Record the pid (and start time, as read now) of every running broker and forget
        the others': what cluster.json must say after brokers were stopped. A running
        broker's pid is never dropped, whatever happened to the clock."""
        for i in range(self.brokers):
            proc = self.process(i)
            if proc is None:
                self.pids.pop(i, None)
                self.started.pop(i, None)
                continue
            self.pids[i] = proc.pid
            with contextlib.suppress(psutil.Error):
                self.started[i] = proc.create_time()

    def check_id(self, broker_id: int) -> None:
        if not 0 <= broker_id < self.brokers:
            raise ClusterError(
                f"no broker {broker_id}: this cluster has brokers 0..{self.brokers - 1}"
            )

    def check_ports(self, broker_ids: list[int]) -> None:
        """Raise if a port these brokers listen on is taken, naming the port and the
        option that chose it. Checked up front, before anything is written: a broker that
        cannot bind exits with a log nobody reads, and the readiness ping would be
        answered by whoever holds its port (another cluster)."""
        for i in broker_ids:
            if port_in_use(self.host, self.port(i)):
                raise ClusterError(
                    f"port {self.port(i)} for broker {i} is in use: "
                    f"{port_holder(self.port(i))}; stop it or choose another --base-port"
                )
            kafka_port = self.kafka_base_port + i
            if self.kafka_base_port and port_in_use(self.host, kafka_port):
                raise ClusterError(
                    f"Kafka listener port {kafka_port} for broker {i} is in use: "
                    f"{port_holder(kafka_port)}; stop it or choose another --kafka-base-port "
                    "(0: no Kafka listeners)"
                )

    def start(self, broker_id: int) -> BrokerProcess:
        proc = self.process(broker_id)
        if proc is not None:
            raise ClusterError(f"broker {broker_id} is already running (pid {proc.pid})")
        self.check_ports([broker_id])
        bp = self.broker_process(broker_id)
        bp.start()
        self.launched[broker_id] = bp
        self.pids[broker_id] = bp.pid
        try:
            self.started[broker_id] = bp.process.create_time()
        except (AttributeError, psutil.NoSuchProcess):
            self.started.pop(broker_id, None)  # exited at once: wait_ready reports its log
        return bp

    def start_all(self) -> None:
        """Start every broker, record their pids, and wait until each answers."""
        self.check_ports(list(range(self.brokers)))
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

    def stop_all(self, controller: int | None = None) -> dict[int, str]:
        """Stop every broker cleanly; with the active ``controller`` known, it goes last.
        Each broker's outcome (see ``stop_together``).

        A broker's controlled shutdown tells the controller it is leaving (so its
        partitions move at once); were the controller stopped first, the others would
        send that to a dead address (``controlled_shutdown_failed ... NETWORK_EXCEPTION``
        in their logs). So every paused broker is resumed, the others are stopped
        together (each one's fencing commits while they are all still up to vote), and
        the controller, with nobody left to tell, last. Without it, one by one.
        """
        for i in range(self.brokers):
            if self.status_of(i) == "paused":
                self.signal(i, signal.SIGCONT)
        outcomes: dict[int, str] = {}
        if controller is None:
            for i in range(self.brokers):
                outcomes.update(self.stop_together([i]))
        else:
            outcomes.update(self.stop_together([i for i in range(self.brokers) if i != controller]))
            outcomes.update(self.stop_together([controller]))
        return dict(sorted(outcomes.items()))

    def signal(self, broker_id: int, sig: signal.Signals) -> None:
        self.check_id(broker_id)
        proc = self.process(broker_id)
        if proc is None:
            raise ClusterError(
                f"broker {broker_id} is not running; start it with 'minibroker cluster restart {broker_id}'"
            )
        proc.send_signal(sig)

    def kill(self, broker_id: int) -> None:
        self.check_id(broker_id)
        proc = self.process(broker_id)
        self.signal(broker_id, signal.SIGKILL)
        if not _wait_exit(proc, 10):
            raise ClusterError(f"broker {broker_id} (pid {proc.pid}) survived SIGKILL for 10 s")

    def stop(self, broker_id: int, timeout: float = 15) -> str:
        return self.stop_together([broker_id], timeout)[broker_id]

    def stop_together(self, broker_ids: list[int], timeout: float = 15) -> dict[int, str]:
        """SIGTERM these brokers at once and wait until each process has exited; SIGKILL
        the ones that have not after ``timeout``. Each one's outcome: ``stopped`` (a clean
        shutdown), ``exited`` (after SIGTERM, but not cleanly: see its broker.log),
        ``killed`` (SIGKILLed after the timeout), ``running`` (still there, even after
        SIGKILL), or ``not running`` (it was not, so nothing was sent)."""
        for i in broker_ids:
            # Launched here a moment ago (cluster up interrupted, say): wait until it holds
            # its data dir, or has exited, so that it is stopped rather than missed.
            if i in self.launched and self.process(i) is None:
                self.launched[i].wait_locked(timeout)
        procs = {i: proc for i in broker_ids if (proc := self.process(i)) is not None}
        outcomes = {i: "not running" for i in broker_ids if i not in procs}
        for proc in procs.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for i, proc in procs.items():
            if _wait_exit(proc, deadline - time.monotonic()):
                clean = shut_down_cleanly(self.broker_dir(i))
                outcomes[i] = "stopped" if clean else "exited"
                continue
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGKILL)
            outcomes[i] = "killed" if _wait_exit(proc, 10) else "running"
        return outcomes

    def wait_ready(self, broker_ids: list[int], timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        pending = list(broker_ids)
        while pending:
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"brokers {pending} did not answer within {timeout}s; see their broker.log"
                )
            for bid in list(pending):
                # The pid just launched, by pid alone: its start time read back now may
                # differ from the one recorded if the clock moved meanwhile.
                if bid not in self.started or self._alive(self.pids.get(bid)) is None:
                    log = self.broker_process(bid).tail_log()
                    raise ClusterError(f"broker {bid} exited during start: {log}")
                if ping(self.host, self.port(bid), timeout=0.2):
                    pending.remove(bid)
            if pending:
                time.sleep(0.005)


def _wait_exit(proc: psutil.Process, timeout: float) -> bool:
    """Wait until the process has exited (gone, or a zombie); False if not by ``timeout``.

    Watched by pid, not by the proof of ownership: a broker releases its data dir a
    little before its process ends, and "stopped" must mean the process is gone. A zombie
    is not yet gone while it has other threads: after SIGKILL the main thread turns zombie
    first, and the descriptors it shares with the others (its listening sockets) close
    only when the last thread has exited, so a restart that checked its ports at once
    found them taken."""
    deadline = time.monotonic() + max(timeout, 0)
    while True:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(proc.pid, os.WNOHANG)  # reap it if it is our child
        try:
            if proc.status() == psutil.STATUS_ZOMBIE and proc.num_threads() <= 1:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def data_dir_holders(data_dir: Path) -> dict[Path, int]:
    """Every directory in ``data_dir`` (itself, or one level down: broker-N) whose lock a
    process holds now, with its pid (0: one we cannot name). What must stop before
    anything there is deleted or started again."""
    root = Path(data_dir)
    if not root.is_dir():
        return {}
    found = {}
    for d in [root, *sorted(p for p in root.iterdir() if p.is_dir())]:
        pid = lock_holder(d)
        if pid is not None:
            found[d] = pid
    return found
