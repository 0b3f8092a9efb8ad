"""The README keeps its quickstart; docs/configuration.md documents every broker setting."""

from __future__ import annotations

import re
from pathlib import Path

from minibroker.broker.common.config import DEFS

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_every_broker_config_key_is_documented_with_its_default():
    reference = (ROOT / "docs" / "configuration.md").read_text().split("## Client settings")[0]
    rows = {
        line.split("|")[1].strip().strip("`"): line.split("|")[2].strip()
        for line in reference.splitlines()
        if line.startswith("| `")
    }
    missing = [key for key in DEFS if key not in rows]
    assert missing == []
    wrong = {
        key: rows[key] for key, d in DEFS.items() if not rows[key].startswith(_shown(d.default))
    }
    assert wrong == {}


def test_every_client_setting_is_documented():
    from minibroker.client.config import SETTINGS

    reference = (ROOT / "docs" / "configuration.md").read_text()
    client = reference.split("## Client settings", 1)[1]
    assert [key for key in SETTINGS if f"| `{key}` |" not in client] == []


def _shown(value: object) -> str:
    """A default as the reference's table writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if value == "":
        return "(empty)"
    return "2^63-1" if value == 2**63 - 1 else str(value)


def test_quickstart_has_exactly_the_two_commands():
    quickstart = README.split("## Quickstart", 1)[1].split("##", 1)[0]
    block = quickstart.split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["bash deploy/quickstart.sh", "bash deploy/test.sh"]
    assert "bash deploy/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_the_kafka_api_table_lists_exactly_the_versions_served():
    from minibroker.protocol.kafka.codec import SPEC_NAMES, SUPPORTED

    page = (ROOT / "docs" / "kafka-clients.md").read_text()
    table = page.split("| API | versions | notes |", 1)[1].split("\n\n", 1)[0]
    documented = {}
    for row in table.strip().splitlines()[1:]:
        names, versions = (cell.strip() for cell in row.split("|")[1:3])
        ranges = [tuple(int(v) for v in r.split("-")) for r in versions.split(", ")]
        names = names.split(", ")
        if len(ranges) == 1:
            ranges *= len(names)  # one range for every API of the row
        documented.update(zip(names, ranges, strict=True))
    assert documented == {SPEC_NAMES[key]: versions for key, versions in SUPPORTED.items()}


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    headings = re.findall(r"^#+ (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_link_between_the_pages_reaches_its_page_and_heading():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if "://" in target:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists() or (anchor and anchor not in _anchors(linked)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
