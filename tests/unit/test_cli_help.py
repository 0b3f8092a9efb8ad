"""`minibroker --help`: the exit-status table (one table: deploy/exit_codes.py, also in
docs/cli.md), `--version`, and help text on every option of every command."""

from __future__ import annotations

from pathlib import Path

import pytest

from minibroker.deploy import exit_codes
from minibroker.deploy.cli import build_parser
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
