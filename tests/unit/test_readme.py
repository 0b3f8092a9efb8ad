"""The README documents every broker setting, with its real default."""

from __future__ import annotations

from pathlib import Path

from minibroker.broker.common.config import DEFS

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_broker_config_key_is_documented():
    missing = [key for key in DEFS if f"`{key}`" not in README]
    assert missing == []


def test_quickstart_has_exactly_the_two_commands():
    quickstart = README.split("## Quickstart", 1)[1].split("##", 1)[0]
    block = quickstart.split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["bash deploy/quickstart.sh", "bash deploy/test.sh"]
    assert (
        "bash deploy/test.sh" in (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    )
