"""`minibroker cluster ...` as a user drives it from a shell: up --detach, status, pause,
resume, kill, restart, down; and the one-line errors when something is in the way."""

from __future__ import annotations

import json
import os
import re
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
    assert down.returncode == 0 and "stopped" in down.stdout
    assert [b["state"] for b in status(data_dir)["brokers"]] == ["dead"] * 3


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
        assert [b["state"] for b in status(data_dir)["brokers"]] == ["dead"] * 3
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
    # recorded, but it holds broker-1's lock, not broker-0's: never ours to signal.
    mine = state.pids[0], state.started[0]
    state.pids[0], state.started[0] = state.pids[1], state.started[1]
    try:
        assert state.process(0) is None and state.status_of(0) == "dead"
    finally:
        state.pids[0], state.started[0] = mine  # so the fixture stops the real broker 0
    assert state.process(0).pid == procs[0].pid
