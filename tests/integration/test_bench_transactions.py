"""`minibroker bench transactions` end to end, tiny: its figures come from real
transactions through confluent-kafka, against a running cluster and on its own one."""

from __future__ import annotations

import pytest

from minibroker.deploy.bench import transactions
from minibroker.deploy.cli import bench_parser
from minibroker.deploy.testing import start_cluster

pytestmark = pytest.mark.integration


def bench(*argv: str) -> dict:
    args = bench_parser(["transactions", *argv]).parse_args(["transactions", *argv])
    return transactions.measure(args)


def test_transactions_bench_against_a_running_cluster(tmp_path):
    cluster = start_cluster(tmp_path, 3)
    try:
        figures = bench(
            "--bootstrap", cluster.kafka_bootstrap,
            "--rounds", "2", "--records", "600", "--txn-size", "200", "--commits", "9",
        )  # fmt: skip
    finally:
        cluster.close()
    assert figures["params"]["records"] == 600 and len(figures["rounds"]) == 2
    for rate in ("idempotent", "transactional", "read_uncommitted", "read_committed"):
        assert figures[f"{rate}_records_per_s"] > 0
    assert figures["produce_ratio"] > 0 and figures["consume_ratio"] > 0
    commit = figures["commit_ms"]
    assert commit["count"] == 9  # 5 in the first round, 4 in the second
    assert 0 < commit["p50"] <= commit["p99"] <= commit["max"]
    assert "failover" not in figures


def test_transactions_bench_on_its_own_cluster_times_a_coordinator_failover():
    figures = bench("--rounds", "1", "--records", "200", "--txn-size", "100", "--commits", "3",
                    "--failover", "1")  # fmt: skip
    assert figures["params"]["bootstrap"] == "own cluster"
    assert figures["commit_ms"]["count"] == 3
    failover = figures["failover"]
    [round_] = failover["rounds"]
    # The commit was completed by another broker than the one killed (the coordinator the
    # Admin's describe_transactions named before the kill).
    assert round_["new_coordinator"] != round_["killed"]
    assert 0 < round_["complete_commit_s"] == failover["complete_commit_s"]["max"]
    assert failover["broker.session.timeout.ms"] == 9000
