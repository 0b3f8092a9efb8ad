"""The two builds `bench compare` runs: the working tree, and a git revision built once
into a venv of its own.

A revision's venv is keyed by its commit under the cache directory and reused, so
comparing against the same release point again costs no build. Its source is checked out
into a temporary git worktree only while pip installs it (a copy, not editable): the venv
owes nothing to any checkout afterwards. Only the project's own dependencies go in, no
test or spark extras: a bench needs neither, except ``bench kafka-clients``, which drives
the stock Kafka clients: for it, ``with_stock_clients`` adds them to a revision's venv
(once; the working tree's venv has them from the test extra).

Revisions before the one-root-package rename (c3d3ebe) have their CLI at ``deploy.cli``,
later ones at ``minibroker.deploy.cli``; each revision's pyproject.toml says which.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import minibroker.deploy
from minibroker.deploy.broker_cli import CommandError

# The working tree's own CLI: this module is part of it.
WORKING_TREE_CLI = "minibroker.deploy.cli"
# Written last into a build's directory: a build without it was interrupted.
READY_FILE = "cli-module"
# What `bench kafka-clients` imports, as the test extra pins them (pyproject.toml).
STOCK_CLIENTS = {"confluent_kafka": "confluent-kafka>=2.3", "kafka": "kafka-python>=2.2",
                 "aiokafka": "aiokafka>=0.11"}  # fmt: skip


@dataclass(frozen=True)
class Build:
    """How to start one build's CLI: its interpreter and the module its CLI lives in."""

    label: str
    commit: str
    python: str
    cli_module: str

    def command(self, *args: str) -> list[str]:
        return [self.python, "-m", self.cli_module, *args]


def cli_module(pyproject_text: str) -> str:
    """The module of a revision's ``minibroker`` command, from its pyproject.toml: the
    console-script entry is the revision's own statement of where its CLI lives
    (``deploy.cli:main`` before the rename, ``minibroker.deploy.cli:main`` after)."""
    scripts = tomllib.loads(pyproject_text).get("project", {}).get("scripts", {})
    entry = scripts.get("minibroker")
    if not entry:
        raise CommandError("that revision's pyproject.toml declares no 'minibroker' command")
    return entry.split(":", 1)[0].strip()


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "minibroker" / "bench-builds"


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        raise CommandError(f"git {args[0]} in {repo}: {detail}")
    return proc.stdout.strip()


def source_repo() -> Path:
    """The git checkout the running minibroker is imported from: revisions are read from
    its history, and it is the working tree being compared."""
    folder = Path(minibroker.deploy.__file__).resolve().parent.parent
    try:
        return Path(_git(folder, "rev-parse", "--show-toplevel"))
    except CommandError:
        raise CommandError(
            f"bench compare needs minibroker installed from a git checkout; {folder} is not one"
        ) from None


def working_tree(repo: Path) -> Build:
    """The working tree as installed in this interpreter (editable: uncommitted changes
    count), labelled with its HEAD and whether it differs from it."""
    head = _git(repo, "rev-parse", "HEAD")
    dirty = bool(_git(repo, "status", "--porcelain", "--untracked-files=no"))
    label = f"working tree ({head[:7]}{'+changes' if dirty else ''})"
    return Build(label, head, sys.executable, WORKING_TREE_CLI)


def revision(repo: Path, rev: str, cache_dir: Path) -> Build:
    """``rev`` built into ``cache_dir/<commit>/venv``, built now unless an earlier run
    finished it; a lock keeps two compares from building the same commit at once."""
    try:
        commit = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except CommandError:
        raise CommandError(f"--baseline {rev}: not a commit in {repo}") from None
    home = cache_dir / commit
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(cache_dir / f"{commit}.lock"):
        if not (home / READY_FILE).exists():
            _build(repo, commit, home)
    module = (home / READY_FILE).read_text().strip()
    return Build(rev, commit, str(home / "venv" / "bin" / "python"), module)


def with_stock_clients(build: Build, cache_dir: Path) -> None:
    """Install the stock Kafka clients into a revision's venv unless they import already
    (the lock as for building: two compares may ask at once)."""
    check = [build.python, "-c", f"import {', '.join(STOCK_CLIENTS)}"]
    with _locked(cache_dir / f"{build.commit}.lock"):
        if subprocess.run(check, capture_output=True).returncode != 0:
            print(f"bench compare: adding the stock Kafka clients to {build.commit[:7]}",
                  file=sys.stderr, flush=True)  # fmt: skip
            pip = [build.python, "-m", "pip", "install", "-q", *STOCK_CLIENTS.values()]
            _run(pip, cwd=str(cache_dir))


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(repo: Path, commit: str, home: Path) -> None:
    print(f"bench compare: building {commit[:7]} into {home} (once)", file=sys.stderr, flush=True)
    shutil.rmtree(home, ignore_errors=True)  # an interrupted build's leftovers
    home.mkdir(parents=True)
    venv = home / "venv"
    with tempfile.TemporaryDirectory(prefix="minibroker-build-") as tmp:
        src = Path(tmp) / "src"
        _git(repo, "worktree", "add", "--detach", str(src), commit)
        try:
            module = cli_module((src / "pyproject.toml").read_text())
            _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp)
            _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(src)], cwd=tmp)
            # From a neutral directory, so the import proves the installed copy works.
            _run([str(venv / "bin" / "python"), "-c", f"import {module}"], cwd=tmp)
        finally:
            _git(repo, "worktree", "remove", "--force", str(src))
    (home / READY_FILE).write_text(module + "\n")


def _run(cmd: list[str], cwd: str) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or ["no output"]
        raise CommandError(f"building the baseline: {' '.join(cmd[:4])} failed: {lines[-1]}")
