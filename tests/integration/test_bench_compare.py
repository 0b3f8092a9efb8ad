"""`minibroker bench compare` end to end, small: it builds a revision and the working tree
into venvs of their own, runs both builds on fresh clusters, and prints one JSON line with
both sides' figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_compare_against_head_reports_both_builds_figures(tmp_path):
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    cache = tmp_path / "builds"
    command = [sys.executable, "-m", "minibroker.deploy.cli", "bench", "compare"]
    command += ["--baseline", "HEAD", "--rounds", "1", "--cache-dir", str(cache), "--"]
    command += ["produce", "--records", "2000", "--acks", "all", "--replication-factor", "3"]
    command += ["--config", "min.insync.replicas=2", "--then", "consume", "--records", "2000"]
    # A stock client's bench: pointed at the run's Kafka listeners, the revision's venv given
    # the stock clients first.
    command += ["--then", "kafka-clients", "--records", "2000"]
    # A venv is built and two 3-broker clusters run: generous for a loaded 2-core machine.
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]

    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["baseline"] == {"rev": "HEAD", "commit": head}
    assert result["working"]["commit"] == head
    assert result["rounds"] == 1
    assert (
        result["bench"].startswith("produce --records 2000") and "--then consume" in result["bench"]
    )

    figures = result["figures"]
    for name in (
        "produce.records_per_sec",
        "produce.latency_ms_p99",
        "consume.records_per_sec",
        "kafka-clients.produce_records_per_s",
        "kafka-clients.consume_records_per_s",
    ):
        figure = figures[name]
        assert len(figure["runs"]["baseline"]) == len(figure["runs"]["working"]) == 1
        assert figure["baseline"] > 0 and figure["working"] > 0
        assert figure["ratio"] == pytest.approx(figure["working"] / figure["baseline"], rel=0.01)
    # consume read what produce wrote, on the same cluster, in both builds.
    assert figures["consume.records"]["runs"] == {"baseline": [2000.0], "working": [2000.0]}
    assert figures["produce.failed"]["runs"] == {"baseline": [0.0], "working": [0.0]}
    assert figures["produce.client_cpu_s"]["baseline"] > 0
    assert figures["consume.client_cpu_s"]["working"] > 0
    assert "produce.broker_cpu_s" in figures and "consume.broker_cpu_s" in figures

    # One progress line per run on stderr; the build is kept for the next compare.
    progress = [json.loads(x) for x in proc.stderr.splitlines() if x.startswith("{")]
    assert sorted(p["build"] for p in progress) == ["baseline", "working"]
    # Both sides ran from a built (non-editable) install of their own: the baseline keyed
    # by its commit, the working tree by the git tree of its files; each got the stock
    # clients for kafka-clients.
    (tree,) = [d.name for d in cache.iterdir() if d.name.startswith("tree-") and d.is_dir()]
    for key in (head, tree):
        assert (cache / key / "cli-module").read_text().strip() == "minibroker.deploy.cli"
        python = cache / key / "venv" / "bin" / "python"
        imports = (
            "import confluent_kafka, kafka, aiokafka, minibroker.deploy as d; print(d.__file__)"
        )
        where = subprocess.run(
            [python, "-c", imports], cwd=tmp_path, capture_output=True, text=True
        )
        assert where.returncode == 0, where.stderr
        assert Path(where.stdout.strip()).is_relative_to(cache / key / "venv")
