"""Which process is a cluster's broker: the data dir lock decides, not the start time read
back from /proc (issue 35: the boot-time reference moved by ~8 s, `cluster down` took the
running brokers for someone else's, dropped their pids and said "stopped").

The "broker" here is a real process that takes a data dir's lock the way the broker does
(``lock_data_dir``) and waits: what ``cluster`` sees of a broker is its pid, its start
time and its lock, and this has all three."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from minibroker.broker.storage.dir_lock import (
    CLEAN_SHUTDOWN_FILE,
    DataDirInUse,
    lock_data_dir,
    lock_holder,
    mark_clean_shutdown,
    open_data_dir,
    shut_down_cleanly,
)
from minibroker.deploy.cluster import ClusterState, data_dir_holders
from minibroker.deploy.launcher import free_port, port_in_use

HOLD = """
import sys
from pathlib import Path
from minibroker.broker.storage.dir_lock import lock_data_dir
lock_data_dir(Path(sys.argv[1]))
print("locked", flush=True)
sys.stdin.read()
"""

# A broker's shape at SIGKILL: a listening socket and threads that keep running.
HOLD_PORT_WITH_THREADS = """
import socket, sys, threading
from pathlib import Path
from minibroker.broker.storage.dir_lock import lock_data_dir
lock_data_dir(Path(sys.argv[1]))
listener = socket.create_server(("127.0.0.1", int(sys.argv[2])))
def spin():
    while True:
        sum(range(1000))
for _ in range(6):
    threading.Thread(target=spin, daemon=True).start()
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def holder():
    """Start processes that hold a data dir's lock until their stdin closes (or a signal)."""
    procs: list[subprocess.Popen] = []

    def start(data_dir: Path, *args: str, code: str = HOLD) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(data_dir), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout.readline() == "locked\n"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(10)


def cluster(tmp_path: Path, brokers: int = 2) -> ClusterState:
    return ClusterState(tmp_path / "c", 29990, brokers)  # ports unused: nothing starts


def test_lock_holder_is_the_pid_the_kernel_says_holds_the_flock(tmp_path, holder):
    data = tmp_path / "broker-0"
    assert lock_holder(data) is None  # no dir, no lock file
    proc = holder(data)
    assert lock_holder(data) == proc.pid
    with pytest.raises(DataDirInUse):
        lock_data_dir(data)
    proc.stdin.close()
    proc.wait(10)
    assert (data / ".lock").read_text() == str(proc.pid)  # the file still names it...
    assert lock_holder(data) is None  # ...but nobody holds it


def test_a_recorded_start_time_off_by_8_s_still_finds_the_lock_holder(tmp_path, holder):
    state = cluster(tmp_path)
    proc = holder(state.broker_dir(0))
    true_start = psutil.Process(proc.pid).create_time()
    state.pids[0], state.started[0] = proc.pid, true_start - 8.0  # the clock stepped
    assert state.process(0).pid == proc.pid
    assert state.status_of(0) == "alive"
    # Listed as broker 1 (whose data dir it does not hold), the same process is not it.
    state.pids[1], state.started[1] = proc.pid, true_start - 8.0
    assert state.process(1) is None and state.status_of(1) == "dead"
    # Saving the state keeps the running broker's pid and records its start time as
    # read now; the pid listed for broker 1 is nobody's broker and goes.
    state.remember_running()
    assert state.pids == {0: proc.pid} and state.started == {0: true_start}


def test_a_cluster_json_that_lost_its_pids_still_finds_and_stops_its_brokers(tmp_path, holder):
    state = cluster(tmp_path)
    proc = holder(state.broker_dir(1))
    assert state.process(1).pid == proc.pid  # no pid recorded: the lock names it
    outcomes = state.stop_all()
    # SIGTERM ends it (no clean-shutdown marker: this one is not a broker that writes it).
    assert outcomes == {0: "not running", 1: "exited"}
    assert proc.wait(10) is not None and state.status_of(1) == "dead"


def test_stop_waits_for_the_process_to_exit_not_just_for_the_lock(tmp_path, holder):
    """A broker releases its lock a little before its process ends; "stopped" means gone."""
    state = cluster(tmp_path)
    proc = holder(state.broker_dir(0))
    state.pids[0], state.started[0] = proc.pid, 0.0  # a start time that matches nothing
    assert state.stop(0) == "exited"
    assert not psutil.pid_exists(proc.pid)  # exited, and reaped (it is our child)


def test_kill_returns_once_the_port_is_free_not_when_the_main_thread_is_a_zombie(tmp_path, holder):
    """After SIGKILL the main thread turns zombie while the others still exit, holding the
    descriptors they share: a restart that checked its port then found it taken (CI, stop
    45: test_recovery_point). Without the thread count, about half of these kills did."""
    state = cluster(tmp_path, brokers=1)
    for _ in range(6):
        port = free_port()
        proc = holder(state.broker_dir(0), str(port), code=HOLD_PORT_WITH_THREADS)
        state.pids[0], state.started[0] = proc.pid, psutil.Process(proc.pid).create_time()
        state.kill(0)
        assert not port_in_use("127.0.0.1", port)
        proc.wait(10)


def test_stopped_cleanly_or_dead_by_the_clean_shutdown_marker(tmp_path):
    state = cluster(tmp_path, brokers=1)
    data = state.broker_dir(0)
    assert state.status_of(0) == "dead"  # never started
    fd = lock_data_dir(data)
    mark_clean_shutdown(data)
    os.close(fd)
    assert shut_down_cleanly(data) and state.status_of(0) == "stopped"
    fd, clean = open_data_dir(data)  # a new life: until it ends cleanly, it is not clean
    os.close(fd)
    assert clean  # what the broker's logs are told: the last life ended cleanly
    assert not (data / CLEAN_SHUTDOWN_FILE).exists() and state.status_of(0) == "dead"
    fd, clean = open_data_dir(data)
    os.close(fd)
    assert not clean  # the life before was killed: logs recover from their recovery points


def test_data_dir_holders_names_every_held_lock_in_the_data_dir(tmp_path, holder):
    root = tmp_path / "c"
    assert data_dir_holders(root) == {}
    a, b = holder(root / "broker-0"), holder(root)
    (root / "broker-1").mkdir()  # a data dir nobody holds is not listed
    assert data_dir_holders(root) == {root: b.pid, root / "broker-0": a.pid}
