"""`minibroker chaos` end to end on a real cluster: a bounded, seeded run finds no
violation; the same command with a planted violation exits 1 and names it."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import time

import psutil
import pytest


def chaos(*args: str) -> tuple[subprocess.CompletedProcess, dict]:
    run = subprocess.run(
        [sys.executable, "-m", "minibroker.deploy.cli", "chaos", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return run, json.loads(run.stdout.strip().splitlines()[-1])


def test_seeded_chaos_run_keeps_every_promise(tmp_path):
    run, counts = chaos("--duration", "15", "--seed", "2", "--data-dir", str(tmp_path / "c"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert counts["violations"] == 0 and counts["seed"] == 2
    assert counts["acknowledged"] > 100 and counts["final_records"] >= counts["acknowledged"]
    assert counts["consumed"] > 0 and counts["hw_samples"] > 0
    assert sum(counts["nemesis"].values()) >= 2  # faults were really injected
    assert "verdict: no violation" in run.stdout
    # Seed 2's schedule has every kind: a pause, a kill, and two isolates (one partial).
    nemesis = counts["nemesis"]
    assert nemesis["pause"] == nemesis["kill"] == 1 and nemesis["isolate"] == 2
    assert nemesis["heal"] == 2, run.stdout
    assert "isolate broker 2 from [0]" in run.stdout
    # The history stays on disk and is judged the same when read back.
    again, recount = chaos("--check-history", counts["history"])
    assert again.returncode == 0, again.stdout + again.stderr
    assert recount["acknowledged"] == counts["acknowledged"] and recount["violations"] == 0


def test_a_planted_lost_write_fails_the_run(tmp_path):
    run, counts = chaos("--duration", "4", "--seed", "1", "--plant", "lose-ack")
    assert run.returncode == 1, run.stdout + run.stderr
    assert counts["lost"] == 1 and counts["violations"] >= 1
    assert (
        "lost               1 VIOLATION(S)" in run.stdout and "acknowledged at chaos-" in run.stdout
    )
    assert "    [lost] " in run.stdout  # each violation names the rule that fired


def test_chaos_with_the_controller_targeted_keeps_every_promise(tmp_path):
    # The default targets whoever is the active controller too; seed 3's schedule kills
    # it and isolates a broker, so the quorum must elect a new controller under load.
    run, counts = chaos("--duration", "12", "--seed", "3", "--data-dir", str(tmp_path / "c"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert counts["violations"] == 0 and counts["target_controller"]
    nemesis = counts["nemesis"]
    assert nemesis["controller"] >= 1 and nemesis["kill"] >= 1 and nemesis["isolate"] >= 1, nemesis
    assert "kill the active controller" in run.stdout, run.stdout


def test_a_consumer_group_under_chaos_keeps_every_promise(tmp_path):
    # Seed 7's 12 s: broker 0 paused; then the group coordinator slow (Heartbeat and
    # SyncGroup requests held 2 s) while members are bounced (leave, a new process
    # joins); then the coordinator answering heartbeats NOT_COORDINATOR; member m2 (the
    # confluent-kafka one) killed and restarted and/or m1 paused.
    run, counts = chaos(
        "--workload", "groups", "--duration", "12", "--seed", "7",
        "--data-dir", str(tmp_path / "c"),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert counts["violations"] == 0 and counts["workload"] == "groups"
    nemesis = counts["nemesis"]
    assert nemesis["coordinator"] == 2 and nemesis["pause"] == 1, nemesis
    assert nemesis["slow-heartbeats"] == 1 and nemesis["fail-heartbeats"] == 1, nemesis
    members = counts["group_nemesis"]
    # The seed's member faults (a kill, a pause): at least one lands inside the 12 s.
    assert members.get("kill_member", 0) + members.get("pause_member", 0) >= 1, members
    assert members["bounce_member"] >= 1, members
    assert "slow-heartbeats the group coordinator (broker" in run.stdout
    # Every acknowledged record reached a member, through several generations, and both
    # kinds of member (bundled, confluent-kafka) consumed.
    assert counts["group_consumed"] >= counts["acknowledged"] > 100
    assert counts["group_generations"] >= 3 and counts["group_commits"] > 0
    by = counts["group_consumed_by"]
    assert by["bundled"] > 0 and by["confluent-kafka"] > 0, by
    assert counts["group_settle_s"] is not None
    assert "group: " in run.stdout and "verdict: no violation" in run.stdout

    # The history (members' logs included) is judged the same when read back.
    again, recount = chaos("--check-history", counts["history"])
    assert again.returncode == 0, again.stdout + again.stderr
    assert recount["group_consumed"] == counts["group_consumed"] and recount["violations"] == 0


def test_transactions_under_chaos_are_seen_whole_or_not_at_all(tmp_path):
    # Seed 3's 15 s, every fault aimed at a role: a transaction coordinator isolated; a
    # leader of chaos-txn paused; a transaction coordinator killed (and restarted); a
    # transaction coordinator holding EndTxn 2.5 s (slow-commits). Three transactional
    # producers (one of them confluent-kafka's) commit and abort (a quarter, on purpose,
    # after their records were written) while a read_committed consumer reads along.
    run, counts = chaos(
        "--workload", "transactions", "--duration", "15", "--seed", "3",
        "--data-dir", str(tmp_path / "c"),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert counts["violations"] == 0 and counts["workload"] == "transactions"
    nemesis = counts["nemesis"]
    assert nemesis["txn_coordinator"] == 3 and nemesis["txn_leader"] == 1, nemesis
    assert nemesis["kill"] == nemesis["isolate"] == nemesis["slow-commits"] == 1, nemesis
    assert "kill a transaction coordinator (broker" in run.stdout
    # Both outcomes happened, the aborts wrote records that read_committed never showed,
    # and the live read_committed reader kept up.
    assert counts["txn_committed"] > 20 and counts["txn_aborted"] > 5, counts
    assert counts["txn_aborted_records_written"] > 0 and counts["txn_live_read"] > 0
    assert counts["txn_records_visible"] >= 2 * counts["txn_committed"]
    assert counts["txn_partitions_per_txn"] >= 2
    by = counts["txn_by_client"]  # two bundled producers, one confluent-kafka: both commit
    assert by["bundled"] > 0 and by["confluent-kafka"] > 0, by
    assert "transactions: " in run.stdout and "verdict: no violation" in run.stdout

    # The kept history is judged the same when read back.
    again, recount = chaos("--check-history", counts["history"])
    assert again.returncode == 0, again.stdout + again.stderr
    assert recount["txns"] == counts["txns"] and recount["violations"] == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_chaos_run_stops_every_process_it_started(tmp_path, sig):
    # A group run: brokers, member processes (one confluent-kafka), all started by chaos.
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "minibroker.deploy.cli", "chaos", "--workload", "groups",
            "--duration", "120", "--seed", "5", "--data-dir", str(tmp_path / "c"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        # The nemesis has begun once its schedule is printed (brokers up, group Stable).
        assert read_until(proc.stdout, "planned:", timeout_s=90), "the run never started"
        started = psutil.Process(proc.pid).children(recursive=True)
        assert len(started) >= 3 + 3, started  # three brokers, three members at least
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()  # only the chaos process this test started
            proc.wait()
    assert proc.returncode == 128 + sig, out + err
    assert "Traceback" not in err and len(err.splitlines()) <= 1, err
    assert "interrupted" in err
    # Every process it started, by pid (psutil checks the start time too, against pid
    # reuse), is gone: the brokers and members before it exited, the brokers' warm
    # parent (deploy/forkserver.py) when its pipe to the run closed.
    _, alive = psutil.wait_procs(started, timeout=30)
    alive = [(p.pid, p.cmdline()) for p in alive if still_running(p)]
    assert not alive, alive


def read_until(stream, needle: str, timeout_s: float) -> bool:
    """Read lines until one holds ``needle`` (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], deadline - time.monotonic())
        if not ready:
            break
        line = stream.readline()
        if not line:
            return False  # the run ended
        if needle in line:
            return True
    return False


def still_running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
