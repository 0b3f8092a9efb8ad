"""`minibroker cluster ...` as a user drives it from a shell: up --detach, status, pause,
resume, kill, restart, down; and the one-line errors when something is in the way."""

from __future__ import annotations

import json
import subprocess
import sys

from deploy.launcher import free_port_range
from tests.waiting import wait_until


def mb(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "deploy.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def status(data_dir) -> dict:
    run = mb("cluster", "status", "--data-dir", str(data_dir), "--json")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_up_status_pause_resume_kill_restart_down(tmp_path):
    data_dir = tmp_path / "c"
    base = free_port_range(3)
    up = mb("cluster", "up", "--data-dir", str(data_dir), "--base-port", str(base), "--detach")
    try:
        assert up.returncode == 0, up.stderr
        assert f"bootstrap 127.0.0.1:{base}," in up.stdout
        cold_ms = float(up.stdout.split("acknowledged): ")[1].split(" ms")[0])
        assert 0 < cold_ms < 30_000

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
        clash = mb("cluster", "up", "--data-dir", str(tmp_path / "d"), "--base-port", str(base))
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
