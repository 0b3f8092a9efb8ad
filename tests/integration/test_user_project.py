"""minibroker as a separate project gets it: a wheel installed into a fresh venv beside a
project that has its own ``client``, ``protocol`` and ``deploy`` packages (issue 24).

The wheel must install the ``minibroker`` name only: the pytest plugin is loaded by every
pytest run in that venv, and before the rename it imported the user's ``client`` package
instead of ours, so the user's run stopped before any test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ("protocol", "broker", "client", "deploy")  # minibroker.<name> each

USER_FILES = {
    "client/__init__.py": 'class ApiClient:\n    """The project\'s own HTTP API client."""\n\n'
    "    def base_url(self) -> str:\n        return 'https://api.example.test'\n",
    "protocol/__init__.py": 'WIRE_VERSION = "user-protocol-2"\n',
    "deploy/__init__.py": 'TARGET = "user-deploy"\n',
    "tests/test_orders.py": """
import sys

from client import ApiClient
from deploy import TARGET
from protocol import WIRE_VERSION

import minibroker.deploy.testing
from minibroker.client import SyncConsumer, SyncProducer


def test_own_packages_are_the_projects():
    assert ApiClient().base_url() == "https://api.example.test"
    assert (WIRE_VERSION, TARGET) == ("user-protocol-2", "user-deploy")


def test_the_fixture_comes_from_the_installed_wheel(minibroker_cluster):
    assert minibroker.deploy.testing.__file__.startswith(sys.prefix)
    cluster = minibroker_cluster
    cluster.create_topic("orders")
    with SyncProducer(cluster.bootstrap, acks="all") as producer:
        sent = producer.send("orders", b"order-1", key=b"customer-7")
    settings = {"auto.offset.reset": "earliest"}
    with SyncConsumer(cluster.bootstrap, **settings) as consumer:
        consumer.assign([("orders", sent.partition)])
        [record] = consumer.poll(timeout_ms=10_000, max_records=1)
    assert (record.offset, record.key, record.value) == (sent.offset, b"customer-7", b"order-1")
""",
}


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 120):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def build_wheel(out: Path, env: dict[str, str]) -> Path:
    """A wheel of a copy of the sources: setuptools' build/ in the checkout can hold modules
    that were since moved or deleted, and a wheel built there would carry them."""
    src = out / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
        ),
    )
    pip = [sys.executable, "-m", "pip", "-q"]
    built = run([*pip, "wheel", "--no-deps", "-w", str(out / "dist"), str(src)], out, env)
    assert built.returncode == 0, built.stderr
    [wheel] = (out / "dist").glob("minibroker-*.whl")
    return wheel


def test_a_project_with_its_own_client_package_uses_the_plugin(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    wheel = build_wheel(tmp_path, env)

    # Every module of the four folders is in the wheel, under minibroker/ and nowhere else.
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {
        f"minibroker/{path.relative_to(ROOT).as_posix()}"
        for folder in PACKAGE_DIRS
        for path in (ROOT / folder).rglob("*.py")
    }
    assert "minibroker/broker/network/socket_server.py" in sources
    assert sources - names == set()
    top_level = {name.split("/")[0] for name in names}
    assert {n for n in top_level if not n.endswith(".dist-info")} == {"minibroker"}

    # A fresh venv with the wheel, its dependencies and pytest; the test venv's pip installs
    # into it (--python), which spares the venv a pip of its own.
    venv = tmp_path / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    assert made.returncode == 0, made.stderr
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "-q", "--python", python]
    installed = run([*pip, "install", str(wheel), "pytest"], tmp_path, env, timeout=300)
    assert installed.returncode == 0, installed.stderr

    # From a neutral directory only the minibroker name is importable.
    neutral = tmp_path / "neutral"
    neutral.mkdir()
    for name in PACKAGE_DIRS:
        found = run([python, "-c", f"import {name}"], neutral, env)
        assert found.returncode != 0 and "ModuleNotFoundError" in found.stderr, (name, found)
    ours = run([python, "-c", "import minibroker.client as c; print(c.__file__)"], neutral, env)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout.strip().startswith(str(venv)), ours.stdout

    # The user's project: its own packages and the fixture, in one pytest run from its root.
    project = tmp_path / "project"
    for relative, text in USER_FILES.items():
        (project / relative).parent.mkdir(parents=True, exist_ok=True)
        (project / relative).write_text(text)
    tests = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider"], project, env, 180)
    assert tests.returncode == 0 and "2 passed" in tests.stdout, tests.stdout + tests.stderr
