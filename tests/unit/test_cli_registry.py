"""The `minibroker` command loads only the module of the command it runs (issue 30: every
command imported every command module, ~0.37 s of CPU and a bigger heap each)."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from minibroker.deploy.cli import BENCHMARKS, COMMANDS, build_parser


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers a command line can end in (those without subcommands of their own)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    return [leaf for sub in subs for p in sub.choices.values() for leaf in _leaves(p)]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_registered_command_module_imports_and_defines_a_runnable_command(command):
    """--help lists the table without importing anything, so a module that no longer
    imports, or lost its adder, would vanish only from a run; this test imports each."""
    module, adder, _ = COMMANDS[command]
    assert callable(getattr(importlib.import_module(module), adder))
    chosen = build_parser([command])._subparsers._group_actions[0].choices[command]
    for leaf in _leaves(chosen):
        assert callable(leaf.get_default("func")), f"{leaf.prog} runs nothing"


@pytest.mark.parametrize("bench", sorted(BENCHMARKS))
def test_every_registered_bench_module_imports_and_runs_something(bench):
    module = importlib.import_module(BENCHMARKS[bench][0])
    assert callable(module.add_arguments) and callable(module.run)
    argv = ["bench", bench]
    if bench == "compare":
        argv += ["--baseline", "HEAD", "--", "consume"]
    args = build_parser(argv).parse_args(argv)
    assert args.func is module.run


def test_help_lists_every_command_and_bench():
    text = build_parser([]).format_help()
    for command in [*COMMANDS, "bench"]:
        assert command in text
    bench_help = build_parser(["bench"])._subparsers._group_actions[0].choices["bench"]
    assert set(BENCHMARKS) <= set(bench_help._subparsers._group_actions[0].choices)


def _modules_loaded_by(argv: list[str]) -> set[str]:
    code = (
        "import sys\n"
        "from minibroker.deploy.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(' '.join(sys.modules), file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return set(proc.stderr.split())


@pytest.mark.parametrize(
    "argv", [["--help"], ["topics", "list", "--help"], ["consume", "--help"], ["bench", "--help"]]
)
def test_a_commands_help_imports_neither_trio_nor_other_commands(argv):
    loaded = _modules_loaded_by(argv)
    assert "trio" not in loaded
    assert "minibroker.client.consumer" not in loaded
    assert not {"minibroker.deploy.chaos_cli", "minibroker.deploy.bench.groups"} & loaded
