"""`minibroker --help`: the exit-status table (one table: deploy/exit_codes.py, also in
docs/cli.md), `--version`, and help text on every option of every command."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from minibroker.deploy import exit_codes
from minibroker.deploy.cli import BENCHMARKS, COMMANDS, build_parser
from minibroker.protocol.errors import (
    BrokerNotAvailable,
    GroupIdNotFound,
    NotEnoughReplicas,
    RequestTimedOut,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_exit_status_table_is_in_help_and_in_the_docs():
    help_text = build_parser([]).format_help()
    assert "exit status:" in help_text
    for status, _ in exit_codes.TABLE:
        assert f"\n  {status} " in help_text, status
    assert exit_codes.markdown() in (ROOT / "docs" / "cli.md").read_text()


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (UnknownTopicOrPartition("topic 't' does not exist"), 1),
        (GroupIdNotFound("group 'g' does not exist"), 1),
        (TopicAlreadyExists("t"), 1),
        (ValueError("unknown property"), 1),
        (BrokerNotAvailable("no broker answered METADATA"), 2),
        (RequestTimedOut("no answer"), 2),
        (NotEnoughReplicas("isr 1 < 2"), 2),
        (ConnectionRefusedError(111, "refused"), 2),
    ],
)
def test_an_error_ends_as_a_user_or_a_cluster_error(error, status):
    assert exit_codes.of(error) == status


def test_version_is_the_installed_distributions(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        build_parser(["--version"]).parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"minibroker {version('minibroker')}"


# --- help on every option ---------------------------------------------------------------------

_NOT_OPTIONS = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


def _walk(parser: argparse.ArgumentParser, path: str):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{path} {name}")


def every_parser():
    """Each command's parser as `minibroker COMMAND` builds it (only the named command's
    module adds its arguments), every bench's likewise, and their subcommands."""
    yield "minibroker", build_parser([])
    for name in COMMANDS:
        yield from _walk(_subparser(build_parser([name]), name), f"minibroker {name}")
    for name in BENCHMARKS:
        bench = _subparser(build_parser(["bench", name]), "bench")
        yield from _walk(_subparser(bench, name), f"minibroker bench {name}")


def every_option():
    for path, parser in every_parser():
        for action in parser._actions:
            if not isinstance(action, _NOT_OPTIONS):
                yield path, parser, action


def test_the_walk_sees_every_command_and_its_options():
    paths = {path for path, _ in every_parser()}
    assert {"minibroker topics create", "minibroker cluster up", "minibroker bench groups"} <= paths
    assert sum(1 for _ in every_option()) > 150


def test_every_option_of_every_command_has_help():
    missing = [
        f"{path} {'/'.join(a.option_strings) or a.dest}"
        for path, _, a in every_option()
        if not (a.help or "").strip()
    ]
    assert not missing, missing


def test_every_default_is_shown():
    unshown = []
    for path, parser, action in every_option():
        if action.default in (None, False, [], argparse.SUPPRESS):
            continue
        formatter = parser._get_formatter()
        text = formatter._expand_help(action) if action.help else ""
        if "default" not in text:
            unshown.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert not unshown, unshown
