"""`minibroker cluster ...` as a user drives it from a shell: up --detach, status, pause,
resume, kill, restart, down; and the one-line errors when something is in the way."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

from minibroker.deploy.launcher import BrokerProcess, free_port, free_port_range, ping
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def env_with_root(env: dict | None = None) -> dict:
    """This checkout first on the path, whatever the working directory."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def mb(*args: str, timeout: float = 60, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minibroker.deploy.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env_with_root(env),
    )


def cluster_ports(brokers: int = 3) -> tuple[int, list[str]]:
    """The base port and ``cluster up``'s port arguments, the Kafka listeners' ports
    included and checked free in this worker's share: left alone, ``cluster up`` puts
    them at --base-port + 100, which nothing checked (CI: one was taken by another
    worker's broker between rounds)."""
    base = free_port_range(2 * brokers)
    return base, ["--base-port", str(base), "--kafka-base-port", str(base + brokers)]


def status(data_dir) -> dict:
    run = mb("cluster", "status", "--data-dir", str(data_dir), "--json")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_up_status_pause_resume_kill_restart_down(tmp_path):
    data_dir = tmp_path / "c"
    base, ports = cluster_ports(3)
    up = mb("cluster", "up", "--data-dir", str(data_dir), *ports, "--detach")
    try:
        assert up.returncode == 0, up.stderr
        assert f"bootstrap 127.0.0.1:{base}," in up.stdout
        cold_ms = float(up.stdout.split("acknowledged): ")[1].split(" ms")[0])
        assert 0 < cold_ms < 30_000
        # The cold start is read against the machine's load, printed next to it.
        assert re.search(r" ms \(load average \d+\.\d\d on \d+ CPUs\)", up.stdout), up.stdout
        assert f"MINIBROKER_BOOTSTRAP=127.0.0.1:{base},127.0.0.1:{base + 1}," in up.stdout
        # What a client sees of a topic nobody created is said up front (issue 36).
        assert "topics: auto.create.topics.enable=false (Kafka: true)" in up.stdout

        first = status(data_dir)
        assert [b["state"] for b in first["brokers"]] == ["alive"] * 3
        assert all(b["rss_mb"] > 0 and b["pid"] for b in first["brokers"])
        health = next(p for p in first["partitions"] if p["topic"] == "__minibroker_health")
        assert sorted(health["isr"]) == [0, 1, 2] and health["high_watermark"] >= 1

        assert mb("cluster", "pause", "2", "--data-dir", str(data_dir)).returncode == 0
        assert status(data_dir)["brokers"][2]["state"] == "paused"
        assert mb("cluster", "resume", "2", "--data-dir", str(data_dir)).returncode == 0
        assert status(data_dir)["brokers"][2]["state"] == "alive"

        killed = mb("cluster", "kill", "1", "--data-dir", str(data_dir))
        assert killed.returncode == 0 and "(dead)" in killed.stdout
        restarted = mb("cluster", "restart", "1", "--data-dir", str(data_dir))
        assert restarted.returncode == 0 and "(alive)" in restarted.stdout

        def full_isr_again():
            parts = status(data_dir)["partitions"]
            return all(sorted(p["isr"]) == [0, 1, 2] for p in parts)

        wait_until(full_isr_again, 30, "broker 1 to rejoin every ISR")

        # A second cluster on overlapping ports is refused before anything starts.
        clash = mb("cluster", "up", "--data-dir", str(tmp_path / "d"), *ports)
        assert clash.returncode != 0
        assert clash.stderr.count("\n") == 1 and f"port {base} " in clash.stderr
        assert "in use" in clash.stderr and "Traceback" not in clash.stderr
        # and the first cluster was not disturbed by the attempt
        assert [b["state"] for b in status(data_dir)["brokers"]] == ["alive"] * 3
    finally:
        down = mb("cluster", "down", "--data-dir", str(data_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    assert [f"broker {i}: stopped cleanly" for i in range(3)] == down.stdout.splitlines()[:3]
    assert [b["state"] for b in status(data_dir)["brokers"]] == ["stopped"] * 3


def test_down_after_a_clock_step_stops_the_brokers_and_fresh_never_deletes_running_data(
    tmp_path,
):
    """Issue 35: psutil's start times moved by ~8 s (the boot-time reference with the wall
    clock); `cluster down` skipped the brokers it no longer recognised, dropped their pids
    and said "stopped", and `cluster up --fresh` then deleted the running brokers' data.
    The step is written into cluster.json: every start time recorded 8 s off."""

    data_dir = tmp_path / "c"
    _, ports = cluster_ports(2)
    up = mb("cluster", "up", "--data-dir", str(data_dir), "--brokers", "2", *ports, "--detach")
    try:
        assert up.returncode == 0, up.stderr
        body = json.loads((data_dir / "cluster.json").read_text())
        pids = {int(k): v for k, v in body["pids"].items()}
        body["started"] = {k: v - 8.0 for k, v in body["started"].items()}
        (data_dir / "cluster.json").write_text(json.dumps(body))
        assert [b["state"] for b in status(data_dir)["brokers"]] == ["alive"] * 2

        fresh = mb("cluster", "up", "--fresh", "--data-dir", str(data_dir), *ports)
        assert fresh.returncode == 2 and fresh.stderr.count("\n") == 1, fresh.stderr
        assert "already running" in fresh.stderr
        # cluster.json lost its pids (what the old `down` left): still found by their locks.
        body["pids"], body["started"] = {}, {}
        (data_dir / "cluster.json").write_text(json.dumps(body))
        assert [b["pid"] for b in status(data_dir)["brokers"]] == [pids[0], pids[1]]
        fresh = mb("cluster", "up", "--fresh", "--data-dir", str(data_dir), *ports)
        assert fresh.returncode == 2 and fresh.stderr.count("\n") == 1, fresh.stderr
        assert (data_dir / "broker-0" / "broker.log").exists()  # data untouched
        assert all(running(pid) for pid in pids.values())
    finally:
        down = mb("cluster", "down", "--data-dir", str(data_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    assert down.stdout.splitlines()[:2] == [
        "broker 0: stopped cleanly",
        "broker 1: stopped cleanly",
    ]
    # `down` returns once the processes are gone, not when they let go of the lock.
    assert not any(running(pid) for pid in pids.values())
    assert [b["state"] for b in status(data_dir)["brokers"]] == ["stopped"] * 2
    assert json.loads((data_dir / "cluster.json").read_text())["pids"] == {}


def test_status_tells_stopped_from_killed_and_down_fails_while_a_lock_is_held(tmp_path):
    """A cleanly stopped broker leaves .kafka_cleanshutdown; a killed one cannot. And
    `cluster down` that leaves a process holding a lock in the data dir says so, exit 2."""
    data_dir = tmp_path / "c"
    _, ports = cluster_ports(2)
    up = mb("cluster", "up", "--data-dir", str(data_dir), "--brokers", "2", *ports, "--detach")
    stranger = None
    try:
        assert up.returncode == 0, up.stderr
        assert mb("cluster", "kill", "1", "--data-dir", str(data_dir)).returncode == 0
        text = mb("cluster", "status", "--data-dir", str(data_dir)).stdout
        assert "broker 1 is dead: 'minibroker cluster restart 1" in text
        # Another process holding a lock in the data dir (not a broker of this cluster).
        stranger = subprocess.Popen(
            [sys.executable, "-c", HOLD_LOCK, str(data_dir / "extra")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env_with_root(),
        )  # fmt: skip
        assert stranger.stdout.readline() == "locked\n"
        down = mb("cluster", "down", "--data-dir", str(data_dir))
        assert down.returncode == 2, down.stdout + down.stderr
        lines = down.stdout.splitlines()
        assert lines[:2] == ["broker 0: stopped cleanly", "broker 1: was not running (dead)"]
        assert down.stderr.count("\n") == 1 and f"pid {stranger.pid} holding " in down.stderr
        assert [b["state"] for b in status(data_dir)["brokers"]] == ["stopped", "dead"]
        fresh = mb("cluster", "up", "--fresh", "--data-dir", str(data_dir), *ports)
        assert fresh.returncode == 2 and f"pid {stranger.pid} (extra)" in fresh.stderr
        assert "--fresh would delete" in fresh.stderr and (data_dir / "broker-0").exists()
    finally:
        if stranger is not None:
            stranger.kill()
            stranger.wait(10)
        mb("cluster", "down", "--data-dir", str(data_dir))


def running(pid: int) -> bool:
    """The process exists and is not a zombie (an exited broker whose parent, the
    detached fork server, is gone stays one until init, if it ever does, reaps it)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


HOLD_LOCK = """
import sys
from pathlib import Path
from minibroker.broker.storage.dir_lock import lock_data_dir
lock_data_dir(Path(sys.argv[1]))
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_taken_kafka_listener_port_is_named_and_nothing_is_left_behind(tmp_path):
    """Issue 36: it blamed the free native port and a --listen flag `cluster up` has not,
    and left a cluster.json behind."""
    data_dir = tmp_path / "c"
    base, ports = cluster_ports(2)
    kafka_port = base + 2 + 1  # broker 1's Kafka listener
    with socket.create_server(("127.0.0.1", kafka_port)):
        up = mb("cluster", "up", "--data-dir", str(data_dir), "--brokers", "2", *ports)
    assert up.returncode == 2 and up.stderr.count("\n") == 1, up.stderr
    assert f"Kafka listener port {kafka_port} for broker 1 is in use" in up.stderr
    assert "--kafka-base-port" in up.stderr and "--listen" not in up.stderr
    assert f"port {base}" not in up.stderr and f"port {base + 1}" not in up.stderr
    assert not data_dir.exists()


def test_a_foreground_cluster_stopped_by_sigterm_reports_each_broker_and_exits_143(tmp_path):
    data_dir = tmp_path / "c"
    _, ports = cluster_ports(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "minibroker.deploy.cli", "cluster", "up", "--brokers", "1",
         "--data-dir", str(data_dir), *ports],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_with_root(),
    )  # fmt: skip
    try:
        lines = []
        while not lines or not lines[-1].startswith("supervising"):
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            lines.append(line)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.returncode != 143:  # it did not stop them: do it here
            mb("cluster", "down", "--data-dir", str(data_dir))
    assert proc.returncode == 143, out + err
    assert "broker 0: stopped cleanly" in out.splitlines() and "stopped (data kept)" in out


def test_a_sigterm_while_cluster_up_starts_the_brokers_leaves_none_running(tmp_path):
    """Sent once cluster.json names started brokers: before or after the first write,
    `cluster up` stops them and exits 143 (it used to end at once, leaving them)."""
    from minibroker.deploy.cluster import data_dir_holders

    data_dir = tmp_path / "c"
    _, ports = cluster_ports(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "minibroker.deploy.cli", "cluster", "up", "--brokers", "1",
         "--data-dir", str(data_dir), *ports],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_with_root(),
    )  # fmt: skip
    try:
        wait_until((data_dir / "cluster.json").exists, 60, "the brokers to start", poll=0.005)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.returncode != 143:
            mb("cluster", "down", "--data-dir", str(data_dir))
    assert proc.returncode == 143, out + err
    assert data_dir_holders(data_dir) == {} and "Traceback" not in err


def test_control_of_a_missing_cluster_or_broker_is_one_line(tmp_path):
    missing = mb("cluster", "pause", "0", "--data-dir", str(tmp_path / "none"))
    assert missing.returncode != 0 and missing.stderr.startswith("error: no cluster in ")
    assert "cluster up" in missing.stderr and missing.stderr.count("\n") == 1


def test_a_cluster_json_listing_another_clusters_broker_never_signals_it(tmp_path):
    """The foreign broker is "another cluster" this test started itself, laid out as every
    default cluster is (relative ./minibroker-data/broker-0), on another port. A
    cluster.json elsewhere that lists its pid, even with its true start time, must not
    make status call it ours, nor kill/down signal it."""
    import psutil

    other, mine = tmp_path / "other", tmp_path / "mine"
    other.mkdir()
    foreign = BrokerProcess(0, free_port(), Path("minibroker-data/broker-0"))
    proc = subprocess.Popen(
        foreign.command(),
        cwd=other,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env_with_root(),
        start_new_session=True,
    )
    try:
        wait_until(lambda: ping("127.0.0.1", foreign.port), 20, "the foreign broker to answer")
        (mine / "minibroker-data").mkdir(parents=True)
        (mine / "minibroker-data" / "cluster.json").write_text(
            json.dumps(
                {
                    "base_port": free_port(),
                    "brokers": 1,
                    "pids": {"0": proc.pid},
                    "started": {"0": psutil.Process(proc.pid).create_time()},
                }
            )
        )
        run = mb("cluster", "status", "--json", cwd=mine)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["brokers"][0]["state"] == "dead"
        killed = mb("cluster", "kill", "0", cwd=mine)
        assert killed.returncode != 0 and "broker 0 is not running" in killed.stderr
        assert mb("cluster", "pause", "0", cwd=mine).returncode != 0
        assert mb("cluster", "down", cwd=mine).returncode == 0
        foreign_proc = psutil.Process(proc.pid)
        assert proc.poll() is None and foreign_proc.status() != psutil.STATUS_STOPPED
        assert ping("127.0.0.1", foreign.port)
    finally:
        proc.terminate()
        proc.wait(20)


def test_with_broker_0_dead_clients_use_the_others_and_commands_name_the_dead_one(tmp_path):
    data_dir = tmp_path / "c"
    base, ports = cluster_ports(3)
    up = mb("cluster", "up", "--data-dir", str(data_dir), *ports, "--detach")
    try:
        assert up.returncode == 0, up.stderr
        assert mb("cluster", "kill", "0", "--data-dir", str(data_dir)).returncode == 0
        bootstrap = ",".join(f"127.0.0.1:{base + i}" for i in range(3))
        env = {**os.environ, "MINIBROKER_BOOTSTRAP": bootstrap}

        listed = mb("topics", "list", env=env)
        assert listed.returncode == 0, listed.stderr
        assert "__minibroker_health" not in listed.stdout  # internal: hidden by default
        internal = mb("topics", "list", "--include-internal", env=env)
        assert "__minibroker_health" in internal.stdout.split()
        stats = mb("stats", "--broker", "1", env=env)
        assert stats.returncode == 0, stats.stderr
        assert stats.stdout.startswith("broker 1 ")

        again = mb("cluster", "up", "--data-dir", str(data_dir), *ports)
        assert again.returncode != 0 and again.stderr.count("\n") == 1
        assert "broker 0 is dead" in again.stderr
        assert "minibroker cluster restart 0" in again.stderr
        status_text = mb("cluster", "status", "--data-dir", str(data_dir))
        assert "broker 0 is dead: 'minibroker cluster restart 0" in status_text.stdout

        # With every broker gone, the error names each address it tried.
        for i in (1, 2):
            assert mb("cluster", "kill", str(i), "--data-dir", str(data_dir)).returncode == 0
        none = mb("topics", "list", env=env)
        assert none.returncode != 0 and none.stderr.count("\n") == 1
        assert f"no broker answered METADATA: 127.0.0.1:{base} (connection refused)" in none.stderr
        assert f"127.0.0.1:{base + 2} (connection refused)" in none.stderr
    finally:
        mb("cluster", "down", "--data-dir", str(data_dir))


def test_a_port_held_by_an_outgoing_connection_is_named_as_such(tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", free_port()))
        listener.listen()
        # The kernel picks this connection's local port from its ephemeral range.
        with socket.create_connection(listener.getsockname()) as outgoing:
            port = outgoing.getsockname()[1]
            up = mb(
                "cluster",
                "up",
                "--data-dir",
                str(tmp_path / "c"),
                "--brokers",
                "1",
                "--base-port",
                str(port),
                "--detach",
            )
    assert up.returncode != 0 and up.stderr.count("\n") == 1
    assert f"port {port} " in up.stderr and "outgoing connection" in up.stderr
    assert "ephemeral range" in up.stderr and "Traceback" not in up.stderr


def test_down_stops_the_controller_last_so_no_controlled_shutdown_fails(tmp_path):
    """All brokers SIGTERMed at once (or the controller first) left the others telling a
    dead controller they were leaving: controlled_shutdown_failed in 8 of ~10 downs."""
    data_dir = tmp_path / "c"
    _, ports = cluster_ports(3)
    controllers = []
    for round_ in range(3):  # the controller is whoever wins the election: vary it
        up = mb("cluster", "up", "--data-dir", str(data_dir), *ports, "--detach")
        try:
            assert up.returncode == 0, up.stderr
            controllers.append(status(data_dir)["quorum"]["active_controller"])
        finally:
            down = mb("cluster", "down", "--data-dir", str(data_dir))
        assert down.returncode == 0, down.stderr
        assert [f"broker {i}: stopped cleanly" for i in range(3)] == down.stdout.splitlines()[:3]
        assert [b["state"] for b in status(data_dir)["brokers"]] == ["stopped"] * 3
        for i in range(3):
            log = (data_dir / f"broker-{i}" / "broker.log").read_text()
            assert "controlled_shutdown_failed" not in log, (round_, controllers, i)
    print("active controllers stopped last:", controllers)


def test_cluster_up_from_elsewhere_prints_a_data_dir_that_works_there(tmp_path):
    """quickstart.sh runs `cluster up` in the caller's directory with the repository's data
    dir as an absolute path; what `cluster up` prints must work from there."""
    repo_data, elsewhere = tmp_path / "repo" / "minibroker-data", tmp_path / "elsewhere"
    elsewhere.mkdir()
    _, ports = cluster_ports(1)
    up = mb(
        "cluster", "up", "--brokers", "1", *ports, "--detach",
        "--data-dir", str(repo_data), cwd=elsewhere,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        hint = re.search(r"--data-dir (\S+)", up.stdout).group(1)
        assert Path(hint) == repo_data  # absolute: not under the current directory
        assert mb("cluster", "status", "--data-dir", hint, cwd=elsewhere).returncode == 0
    finally:
        mb("cluster", "down", "--data-dir", str(repo_data))
    # Under the current directory the path stays short and relative.
    up = mb(
        "cluster", "up", "--brokers", "1", *ports, "--detach",
        "--data-dir", str(repo_data), cwd=tmp_path / "repo",
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        assert "--data-dir minibroker-data" in up.stdout
    finally:
        mb("cluster", "down", "--data-dir", str(repo_data))


def test_quickstart_runs_in_the_callers_directory_with_the_repositorys_data(tmp_path):
    """deploy/quickstart.sh itself, with env.sh and the minibroker command stood in for
    (the real ones set up a venv): which directory and which arguments `cluster up` gets."""
    repo, elsewhere = tmp_path / "repo", tmp_path / "elsewhere"
    (repo / "deploy").mkdir(parents=True)
    (repo / "bin").mkdir()
    elsewhere.mkdir()
    (repo / "deploy" / "quickstart.sh").write_text((ROOT / "deploy" / "quickstart.sh").read_text())
    # env.sh's contract: ROOT is the repository, PATH has its minibroker, cwd is ROOT.
    (repo / "deploy" / "env.sh").write_text(
        'ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"\n'
        'export PATH="$ROOT/bin:$PATH"\ncd "$ROOT"\n'
    )
    fake = repo / "bin" / "minibroker"
    fake.write_text('#!/bin/sh\npwd\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)

    def quickstart(*args):
        run = subprocess.run(
            ["bash", str(repo / "deploy" / "quickstart.sh"), *args],
            capture_output=True, text=True, timeout=30, cwd=elsewhere,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        return run.stdout.splitlines()

    lines = quickstart("--detach")
    assert lines[0] == str(elsewhere)
    assert lines[1:] == [
        "cluster",
        "up",
        "--demo",
        "--data-dir",
        f"{repo}/minibroker-data",
        "--detach",
    ]
    # A --data-dir of the caller's own is theirs, relative to where they are.
    assert quickstart("--data-dir", "mine")[1:] == ["cluster", "up", "--demo", "--data-dir", "mine"]


async def test_brokers_are_forks_of_one_warm_parent_proven_ours_by_their_data_dir(
    cluster_factory,
):
    """Each broker is its own process forked from the fork server, so its command line is
    the server's: what proves a pid is broker N is that it holds broker N's data dir."""
    state = await cluster_factory(3)
    procs = [state.process(b) for b in range(3)]
    assert all(procs) and len({p.pid for p in procs}) == 3
    assert all("minibroker.deploy.forkserver" in p.cmdline() for p in procs)
    assert len({p.ppid() for p in procs}) == 1  # one parent, not the launcher
    assert all(p.ppid() != os.getpid() for p in procs)
    # Broker 1's pid and true start time listed as broker 0's: alive, started when
    # recorded, but it holds broker-1's lock, not broker-0's: never taken for broker 0,
    # which is still the process holding broker-0's lock.
    state.pids[0], state.started[0] = state.pids[1], state.started[1]
    assert state.process(0).pid == procs[0].pid != procs[1].pid
    assert state.status_of(0) == "alive"
