"""`bench compare`'s pure parts: the bench chain it is given, the order builds run in,
figures out of a bench's JSON line, medians and ratios, where a revision's CLI lives, and
which working-tree builds are pruned."""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

import pytest

from minibroker.deploy.bench.builds import Build, cli_module, prune_tree_builds
from minibroker.deploy.bench.compare import (
    Step,
    check_arguments,
    flatten_figures,
    has_kafka_listener,
    last_json_line,
    parse_steps,
    run_order,
    summarize,
)
from minibroker.deploy.broker_cli import CommandError
from minibroker.deploy.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DAY = 24 * 3600


def test_options_after_the_double_dash_belong_to_the_bench_not_to_compare():
    own = ["bench", "compare", "--baseline", "e90d03f", "--rounds", "5", "--"]
    chain = ["produce", "--records", "10", "--then", "consume", "--records", "10"]
    args = build_parser([*own, *chain]).parse_args([*own, *chain])
    assert (args.baseline, args.rounds, args.brokers) == ("e90d03f", 5, 3)
    assert parse_steps(args.chain) == [
        Step("produce", ("produce", "--records", "10")),
        Step("consume", ("consume", "--records", "10")),
    ]


def test_a_bench_named_twice_gets_a_numbered_prefix():
    steps = parse_steps(["produce", "--then", "produce", "--acks", "1", "--then", "produce"])
    assert [s.name for s in steps] == ["produce", "produce2", "produce3"]
    assert steps[1].argv == ("produce", "--acks", "1")


@pytest.mark.parametrize(
    "words",
    [
        [],
        ["--"],
        ["--records", "10"],
        ["produce", "--then"],
        ["produce", "--then", "--then", "consume"],
        ["compare", "--baseline", "HEAD"],
        ["produce", "--bootstrap", "127.0.0.1:9092"],
        ["produce", "--then", "consume", "--bootstrap=127.0.0.1:9092"],
    ],
)
def test_a_chain_compare_cannot_run_is_refused(words):
    with pytest.raises(CommandError):
        parse_steps(words)


def test_bench_arguments_are_checked_by_the_working_trees_parser_before_anything_runs():
    argv = ["bench", "compare", "--baseline", "HEAD", "--", "consume"]
    args = build_parser(argv).parse_args(argv)
    checked = check_arguments(
        parse_steps(["produce", "--acks", "all", "--then", "consume"]), args.bench_parser
    )
    assert [step.cluster for step in checked] == [True, True]
    with pytest.raises(CommandError, match="unrecognized arguments: --no-such-option"):
        check_arguments(parse_steps(["produce", "--no-such-option"]), args.bench_parser)
    with pytest.raises(CommandError, match="unrecognized arguments: --no-such-option"):
        check_arguments(parse_steps(["purgatory", "--no-such-option"]), args.bench_parser)


def test_an_in_process_bench_is_compared_without_a_cluster():
    # bench purgatory measures an in-process purgatory: no cluster is started for it, and
    # it is given no --bootstrap.
    argv = ["bench", "compare", "--baseline", "HEAD", "--", "purgatory"]
    args = build_parser(argv).parse_args(argv)
    steps = check_arguments(
        parse_steps(["purgatory", "--rate", "1000", "--then", "produce"]), args.bench_parser
    )
    assert [(step.name, step.cluster) for step in steps] == [
        ("purgatory", False),
        ("produce", True),
    ]


def test_a_producing_step_knows_the_megabytes_it_produces_from_its_arguments():
    # broker_cpu_s_per_mb divides by this: read from the arguments, not the bench's JSON,
    # so a baseline build from before the figure is measured alike.
    argv = ["bench", "compare", "--baseline", "HEAD", "--", "consume"]
    args = build_parser(argv).parse_args(argv)
    words = ["produce", "--records", "1000", "--record-size", "500", "--then"]
    words += ["kafka-clients", "--records", "2000", "--size", "100", "--rate-of-max", "0.8"]
    words += ["--then", "consume", "--records", "1000"]
    steps = check_arguments(parse_steps(words), args.bench_parser)
    assert [step.produced_mb for step in steps] == [0.5, 0.4, None]


def test_each_round_runs_both_builds_and_swaps_which_goes_first():
    assert run_order(1) == ["baseline", "working"]
    assert run_order(4) == ["baseline", "working", "working", "baseline"] * 2


def test_figures_are_every_number_nested_names_dotted_parameters_left_out():
    line = {
        "benchmark": "longpoll",
        "records_per_sec": 1000.5,
        "errors": 0,
        "spread": False,
        "first_error": None,
        "expiry_lateness_ms": {"p50": 3.1, "p99": 9.0},
        "broker_fetch_purgatory": {"expired": 7, "wheel": {"buckets": 2}},
        "client_cpu_percent": [5.0, 6.0],
        "params": {"records": 10},
    }
    assert flatten_figures(line, "longpoll") == {
        "longpoll.records_per_sec": 1000.5,
        "longpoll.errors": 0.0,
        "longpoll.expiry_lateness_ms.p50": 3.1,
        "longpoll.expiry_lateness_ms.p99": 9.0,
        "longpoll.broker_fetch_purgatory.expired": 7.0,
        "longpoll.broker_fetch_purgatory.wheel.buckets": 2.0,
    }


def test_summary_quotes_medians_and_working_over_baseline():
    baseline = [
        {"p.rate": 100.0, "p.p99": 30.0},
        {"p.rate": 300.0, "p.p99": 10.0},
        {"p.rate": 200.0, "p.p99": 20.0},
    ]
    working = [
        {"p.rate": 150.0, "p.p99": 10.0},
        {"p.rate": 250.0, "p.p99": 5.0},
        {"p.rate": 50.0, "p.p99": 1.0},
    ]
    summary = summarize(baseline, working)
    assert summary["p.rate"] == {
        "baseline": 200.0,
        "working": 150.0,
        "ratio": 0.75,
        "runs": {"baseline": [100.0, 300.0, 200.0], "working": [150.0, 250.0, 50.0]},
    }
    assert (summary["p.p99"]["baseline"], summary["p.p99"]["working"]) == (20.0, 5.0)
    assert summary["p.p99"]["ratio"] == 0.25
    # The summary is what gets printed: one JSON line.
    assert "\n" not in json.dumps(summary)


def test_small_figures_and_ratios_keep_four_significant_digits():
    summary = summarize([{"cpu_per_mb": 0.8}], [{"cpu_per_mb": 0.020360134}])
    assert summary["cpu_per_mb"]["working"] == 0.02036
    # Rounded to three decimals this was 0.025, 2 % off the medians' own ratio.
    assert summary["cpu_per_mb"]["ratio"] == 0.02545
    assert summarize([{"r": 3.0}], [{"r": 3.14159}])["r"]["working"] == 3.142


def test_a_figure_one_build_lacks_or_a_zero_baseline_has_no_ratio():
    summary = summarize([{"a": 0.0}], [{"a": 0.0, "new": 4.0}, {"a": 2.0, "new": 6.0}])
    assert summary["a"] == {
        "baseline": 0.0,
        "working": 1.0,
        "ratio": None,
        "runs": {"baseline": [0.0], "working": [0.0, 2.0]},
    }
    assert (summary["new"]["baseline"], summary["new"]["working"], summary["new"]["ratio"]) == (
        None,
        5.0,
        None,
    )


def test_the_figures_are_the_last_json_line_of_a_bench():
    out = 'creating topic\n{"records": 1}\n{"records": 2}\nbye\n'
    assert last_json_line(out) == {"records": 2}
    assert last_json_line("no figures\n") is None


PRE_RENAME = """
[project]
name = "minibroker"
[project.scripts]
minibroker = "deploy.cli:main"
[tool.setuptools.packages.find]
include = ["protocol*", "broker*", "client*", "deploy*"]
"""


def test_a_revision_before_the_rename_runs_deploy_cli():
    assert cli_module(PRE_RENAME) == "deploy.cli"


def test_this_revision_runs_minibroker_deploy_cli():
    assert cli_module((REPO / "pyproject.toml").read_text()) == "minibroker.deploy.cli"


def test_a_revision_without_the_command_is_refused():
    with pytest.raises(CommandError, match="no 'minibroker' command"):
        cli_module('[project]\nname = "minibroker"\n')


def test_this_revision_s_cluster_up_is_given_its_kafka_listener_ports():
    """Its `cluster up --help` names --kafka-base-port, so compare passes checked-free ports
    rather than leaving the listeners at base + 100."""
    build = Build("here", "HEAD", "here", sys.executable, "minibroker.deploy.cli")
    assert has_kafka_listener(build, timeout=60)


def test_working_tree_builds_past_the_last_used_go_once_idle(tmp_path: Path):
    now = time.time()
    ages = {"tree-a": 0, "tree-b": 10, "tree-c": 2 * DAY, "tree-d": 3 * DAY, "tree-e": 50}
    for name, age in {**ages, "0123abcd": 9 * DAY}.items():
        (tmp_path / name / "venv").mkdir(parents=True)
        os.utime(tmp_path / name, (now - age, now - age))
    removed = prune_tree_builds(tmp_path, keep=2, idle_s=DAY)
    # kept: the two used last (a, b), one past them but used within the day (e), and the
    # revision build however old; removed: the idle ones past the two
    assert sorted(removed) == ["tree-c", "tree-d"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [
        "0123abcd", "tree-a", "tree-b", "tree-e"
    ]  # fmt: skip


def test_a_working_tree_build_being_built_is_not_removed(tmp_path: Path):
    old = time.time() - 3 * DAY
    for name in ("tree-new", "tree-busy"):
        (tmp_path / name).mkdir()
    os.utime(tmp_path / "tree-busy", (old, old))
    with open(tmp_path / "tree-busy.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as _built holds it while building
        assert prune_tree_builds(tmp_path, keep=1, idle_s=DAY) == []
    assert (tmp_path / "tree-busy").is_dir()
