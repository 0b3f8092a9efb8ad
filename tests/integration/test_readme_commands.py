"""Every example in README.md and docs/*.md runs as written, against a real cluster.

The conventions, which the pages follow (docs/testing.md points here):

- A fenced block is an example when its language is ``bash``, ``sh`` or ``python``;
  ``text`` (output, synopses) and ``toml`` are shown, not run. A fence without a
  language, or with any other, is refused, so nothing runnable escapes by accident.
- A page's examples run in the order they appear, each in a fresh process, all in one
  working directory and against one cluster, as a reader running them one after another
  in one shell would: ``MINIBROKER_BOOTSTRAP`` is exported to that cluster (as the
  README's tour does).
- Addresses are moved to the test's cluster: ``127.0.0.1:9092``, ``:9093``, ``:9094``
  become its brokers 0, 1, 2, and ``127.0.0.1:9192``-``9194`` their Kafka listeners.
  Nothing else in a block is changed.
- A page whose examples start a cluster (``minibroker cluster up``) runs on that one:
  the test adds ``--base-port`` and ``--kafka-base-port`` with free ports (and the
  setting below) to the command, and stops the cluster (``cluster down``) after the page. Every other page
  runs against one shared 3-broker cluster (``faults.enable=true``), reset between pages
  (``LocalCluster.reset``: topics deleted, faults cleared). Both kinds of cluster have
  ``group.initial.rebalance.delay.ms=0``, as Kafka's own tests set it, so a group
  example does not wait 3 s for more members that will never come.
- A ``python`` block that defines ``def test_`` is a test module: it runs under pytest
  (the minibroker plugin's fixtures come from its entry point); any other runs as a
  script.
- A block that cannot run here is marked on the line just before its fence with
  ``<!-- docs-test: skip (REASON) -->``; the reason is required (say what it needs, and
  which test runs it instead, if one does).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from minibroker.deploy.launcher import free_port_range
from minibroker.deploy.testing import LocalCluster, start_cluster

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"bash", "sh", "python"}
SHOWN = {"text", "toml"}
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
MARK = re.compile(r"<!-- docs-test: (\S+)(?: \((.+)\))? -->\s*$")
CLUSTER_UP = re.compile(r"(minibroker cluster up\b[^\n#|&;]*)")
QUICK_GROUPS = {"group.initial.rebalance.delay.ms": 0}


@dataclass
class Block:
    page: str
    line: int
    lang: str
    code: str
    skip: str | None  # the reason, when marked

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.lang})"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, with their markers."""
    text = page.read_text()
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        where = f"{page.relative_to(ROOT)}:{line}"
        lang = m.group(1).strip()
        assert lang, f"{where}: a fence needs a language (bash, python, text, ...)"
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARK.search(before)
        skip = None
        if marker:
            assert marker.group(1) == "skip", f"{where}: unknown marker {marker.group(1)!r}"
            skip = marker.group(2)
            assert skip, f"{where}: a skip marker needs its reason: <!-- docs-test: skip (...) -->"
        out.append(Block(str(page.relative_to(ROOT)), line, lang, m.group(2), skip))
    return out


def readme_block(heading: str, lang: str = "bash", page: str = "README.md") -> str:
    """The first ``lang`` block after ``heading`` (tests/spark reads its recipes so)."""
    section = (ROOT / page).read_text().split(heading, 1)[1]
    return section.split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def on_ports(text: str, native: int, kafka: int) -> str:
    """The pages' 127.0.0.1:9092-9094 (and Kafka 9192-9194) moved to the test's ports."""
    for i in range(3):
        text = text.replace(f"127.0.0.1:{9092 + i}", f"127.0.0.1:{native + i}")
        text = text.replace(f"127.0.0.1:{9192 + i}", f"127.0.0.1:{kafka + i}")
    return text


@dataclass
class Ran:
    block: Block
    stdout: str
    stderr: str


def run_block(block: Block, cwd: Path, native: int, kafka: int, env: dict) -> Ran:
    code = on_ports(block.code, native, kafka)
    if block.lang == "python" and re.search(r"^def test_", code, re.M):
        path = cwd / f"test_docs_{block.line}.py"
        path.write_text(code)
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path.name]
    elif block.lang == "python":
        path = cwd / f"docs_{block.line}.py"
        path.write_text(code)
        argv = [sys.executable, path.name]
    else:
        code = CLUSTER_UP.sub(
            lambda m: (
                f"{m.group(1).rstrip()} --base-port {native} --kafka-base-port {kafka} "
                + "".join(f"--set {k}={v} " for k, v in QUICK_GROUPS.items())
            ),
            code,
        )
        argv = ["bash", "-e", "-o", "pipefail", "-c", code]
    run = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, f"{block} failed:\n{code}\n{run.stdout}\n{run.stderr}"
    assert "Traceback" not in run.stderr, f"{block}:\n{run.stderr}"
    return Ran(block, run.stdout, run.stderr)


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    config = {"faults.enable": True, **QUICK_GROUPS}
    cluster = start_cluster(tmp_path_factory.mktemp("docs-cluster"), 3, config)
    yield cluster
    cluster.close()


def run_page(page: Path, cwd: Path, shared: LocalCluster | None) -> list[Ran]:
    """Run a page's examples in order, on the cluster they start, else on ``shared``."""
    runnable = [b for b in blocks(page) if b.lang in RUN and b.skip is None]
    starts_own = any(CLUSTER_UP.search(b.code) for b in runnable if b.lang != "python")
    if starts_own:
        native = free_port_range(6)  # the brokers and their Kafka listeners, checked free
        kafka = native + 3
    else:
        assert shared is not None
        native = int(shared.address(0).rsplit(":", 1)[1])
        kafka = int(shared.kafka_bootstrap.split(",")[0].rsplit(":", 1)[1])
    bootstrap = ",".join(f"127.0.0.1:{native + i}" for i in range(3))
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "MINIBROKER_BOOTSTRAP": bootstrap,
    }
    try:
        return [run_block(b, cwd, native, kafka, env) for b in runnable]
    finally:
        if starts_own:
            subprocess.run(
                [sys.executable, "-m", "minibroker.deploy.cli", "cluster", "down"],
                cwd=cwd,
                capture_output=True,
                timeout=60,
            )
        else:
            shared.reset()


def test_skipped_examples_are_few_and_name_the_test_that_runs_them():
    every = [b for page in PAGES for b in blocks(page) if b.lang in RUN]
    skipped = [b for b in every if b.skip is not None]
    for block in skipped:
        for path in re.findall(r"tests/[\w/]+\.py", block.skip or ""):
            assert (ROOT / path).is_file(), f"{block}: its skip reason names a missing {path}"
    # Beyond those run by another test, only the quickstart and the suite itself.
    untested = [str(b) for b in skipped if "tests/" not in (b.skip or "")]
    assert len(untested) <= 2, untested
    assert len(every) - len(skipped) >= 15


def runnable(page: Path) -> bool:
    return any(b.lang in RUN and b.skip is None for b in blocks(page))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_fence_names_a_language_the_test_knows(page):
    # blocks() refuses a bare fence and an unknown marker; a "shell" or "console" block
    # would escape the run unnoticed, so only these are allowed.
    assert {b.lang for b in blocks(page)} <= RUN | SHOWN


@pytest.mark.parametrize("page", [p for p in PAGES[1:] if runnable(p)], ids=lambda p: p.name)
def test_the_page_examples_run_as_written(page, shared_cluster, tmp_path):
    run_page(page, tmp_path, shared_cluster)


def test_the_readme_tour_runs_as_written_and_shows_what_it_says(tmp_path):
    runs = {r.block.line: r for r in run_page(ROOT / "README.md", tmp_path, None)}
    out = "\n".join(r.stdout for r in runs.values())
    assert "k1\thello" in out and "k2\tworld" in out  # the tour's consume --print-key
    client = next(r for r in runs.values() if "keyed record:" in r.stdout)
    lines = client.stdout.splitlines()
    assert len(lines) == 3, client.stdout  # the keyed record, the spread, the read-back
    assert lines[0].startswith("keyed record: RecordMetadata(topic='events'")
    spread = ast.literal_eval(lines[1].removeprefix("unkeyed records per partition: "))
    assert sum(spread.values()) == 1000 and set(spread) <= {0, 1, 2}
    assert lines[2].startswith("read back: ") and lines[2].endswith("b'user-1' b'value'")
    stock = next(r for r in runs.values() if "from librdkafka" in r.stdout)
    assert "b'hello'" in stock.stdout and "b'world'" in stock.stdout
    assert any("1 passed" in r.stdout for r in runs.values())  # the pytest plugin example


def test_the_client_example_runs_twice(shared_cluster, tmp_path):
    """A second run must not die on the topic the first one created."""
    [example] = [b for b in blocks(ROOT / "README.md") if "keyed record:" in b.code]
    native = int(shared_cluster.address(0).rsplit(":", 1)[1])
    kafka = int(shared_cluster.kafka_bootstrap.split(",")[0].rsplit(":", 1)[1])
    try:
        first, second = (
            run_block(example, tmp_path, native, kafka, {**os.environ}) for _ in range(2)
        )
    finally:
        shared_cluster.reset()
    # The second run read back its own keyed record, one offset further on.
    offsets = [int(r.stdout.split("offset=")[1].split(")")[0]) for r in (first, second)]
    assert offsets[1] > offsets[0]
