"""The two builds `bench compare` runs, a git revision and the working tree, each built
the same way into a venv of its own.

Both sides run from a built (non-editable) install: an editable install imports through
a path hook from the checkout, and that cost each process of the working tree 0.03-0.07 s
more than the baseline's (client CPU 1.08-1.19x with identical code on both sides). A
revision's venv is keyed by its commit under the cache directory, the working tree's by
the git tree of its files as they are now (tracked and untracked but not ignored,
uncommitted changes included: ``tree-<hash>``), and reused, so comparing the same code
again costs no build. The source is exported with ``git archive`` into a temporary
directory only while pip installs it (a copy, not editable): the venv owes nothing to any
checkout afterwards. Only the project's own dependencies go in, no test or spark extras:
a bench needs neither, except ``bench kafka-clients``, which drives the stock Kafka
clients: for it, ``with_stock_clients`` adds them to a build's venv (once).

Revisions before the one-root-package rename (c3d3ebe) have their CLI at ``deploy.cli``,
later ones at ``minibroker.deploy.cli``; each revision's pyproject.toml says which.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import minibroker.deploy
from minibroker.deploy.broker_cli import CommandError

# Written last into a build's directory: a build without it was interrupted.
READY_FILE = "cli-module"
# Working-tree builds kept, the last used first: one is made for every edit benched. Older
# ones go once unused for a day: a compare holds no lock while it runs a build, so the age
# is what keeps a long compare's venv from being removed under it by another's pruning.
TREE_BUILDS_KEPT = 3
TREE_BUILD_IDLE_S = 24 * 3600
# What `bench kafka-clients` imports, as the test extra pins them (pyproject.toml).
STOCK_CLIENTS = {"confluent_kafka": "confluent-kafka>=2.3", "kafka": "kafka-python>=2.2",
                 "aiokafka": "aiokafka>=0.11"}  # fmt: skip


@dataclass(frozen=True)
class Build:
    """How to start one build's CLI: its interpreter and the module its CLI lives in.
    ``key`` names its directory in the cache (and the lock that guards it)."""

    label: str
    commit: str
    key: str
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


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env)
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


def working_tree(repo: Path, cache_dir: Path) -> Build:
    """The working tree's files as they are now (uncommitted changes count) built into
    ``cache_dir/tree-<hash>/venv`` as a revision is, labelled with its HEAD and whether
    it differs from it."""
    head = _git(repo, "rev-parse", "HEAD")
    tree = _snapshot(repo)
    dirty = tree != _git(repo, "rev-parse", "HEAD^{tree}")
    label = f"working tree ({head[:7]}{'+changes' if dirty else ''})"
    build = _built(repo, tree, f"tree-{tree}", label, head, cache_dir)
    prune_tree_builds(cache_dir, TREE_BUILDS_KEPT, TREE_BUILD_IDLE_S)
    return build


def revision(repo: Path, rev: str, cache_dir: Path) -> Build:
    """``rev`` built into ``cache_dir/<commit>/venv``."""
    try:
        commit = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except CommandError:
        raise CommandError(f"--baseline {rev}: not a commit in {repo}") from None
    return _built(repo, commit, commit, rev, commit, cache_dir)


def _snapshot(repo: Path) -> str:
    """The git tree of the working tree's files, through a scratch copy of the index (the
    repository's own index and HEAD are left as they were; the blobs land in its object
    store, as ``git stash create`` leaves them)."""
    index = Path(repo, _git(repo, "rev-parse", "--git-path", "index"))
    with tempfile.TemporaryDirectory(prefix="minibroker-index-") as tmp:
        scratch = Path(tmp) / "index"
        if index.exists():
            shutil.copyfile(index, scratch)  # its stat data spares re-hashing unchanged files
        env = {**os.environ, "GIT_INDEX_FILE": str(scratch)}
        _git(repo, "add", "--all", env=env)
        return _git(repo, "write-tree", env=env)


def _built(repo: Path, source: str, key: str, label: str, commit: str, cache_dir: Path) -> Build:
    """``source`` (a commit or tree) built into ``cache_dir/key/venv`` unless an earlier
    run finished it; a lock keeps two compares from building the same one at once."""
    home = cache_dir / key
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(cache_dir / f"{key}.lock"):
        if not (home / READY_FILE).exists():
            _build(repo, source, home)
        os.utime(home)  # last used: what prune_tree_builds keeps
    module = (home / READY_FILE).read_text().strip()
    return Build(label, commit, key, str(home / "venv" / "bin" / "python"), module)


def prune_tree_builds(cache_dir: Path, keep: int, idle_s: float) -> list[str]:
    """Remove the working-tree builds past the ``keep`` used last that have been unused for
    ``idle_s`` (revision builds stay: a baseline is compared against again and again); one
    being built (its lock held) is left alone. Returns the names removed."""
    trees = [p for p in cache_dir.glob("tree-*") if p.is_dir()]
    trees.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    cutoff = time.time() - idle_s
    removed = []
    for old in trees[keep:]:
        if old.stat().st_mtime > cutoff:
            continue
        lock = cache_dir / f"{old.name}.lock"
        with open(lock, "w") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(old, ignore_errors=True)
            lock.unlink(missing_ok=True)
        removed.append(old.name)
    return removed


def with_stock_clients(build: Build, cache_dir: Path) -> None:
    """Install the stock Kafka clients into a build's venv unless they import already
    (the lock as for building: two compares may ask at once)."""
    check = [build.python, "-c", f"import {', '.join(STOCK_CLIENTS)}"]
    with _locked(cache_dir / f"{build.key}.lock"):
        if subprocess.run(check, capture_output=True).returncode != 0:
            print(f"bench compare: adding the stock Kafka clients to {build.key[:12]}",
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


def _build(repo: Path, source: str, home: Path) -> None:
    print(f"bench compare: building {source[:7]} into {home} (once)", file=sys.stderr, flush=True)
    shutil.rmtree(home, ignore_errors=True)  # an interrupted build's leftovers
    home.mkdir(parents=True)
    venv = home / "venv"
    with tempfile.TemporaryDirectory(prefix="minibroker-build-") as tmp:
        src = Path(tmp) / "src"
        archive = Path(tmp) / "src.tar"
        _git(repo, "archive", "--format=tar", f"--output={archive}", source)
        with tarfile.open(archive) as tar:
            tar.extractall(src, filter="data")
        module = cli_module((src / "pyproject.toml").read_text())
        _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp)
        _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(src)], cwd=tmp)
        # From a neutral directory, so the import proves the installed copy works.
        _run([str(venv / "bin" / "python"), "-c", f"import {module}"], cwd=tmp)
    (home / READY_FILE).write_text(module + "\n")


def _run(cmd: list[str], cwd: str) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or ["no output"]
        raise CommandError(f"building a bench build: {' '.join(cmd[:4])} failed: {lines[-1]}")
