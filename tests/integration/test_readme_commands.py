"""The README's command-line tour runs as written: only its ports are moved to free ones,
so the test cannot collide with a cluster a developer has running on 9092."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from deploy.launcher import free_port_range

ROOT = Path(__file__).resolve().parents[2]


def readme_block(heading: str) -> str:
    section = (ROOT / "README.md").read_text().split(heading, 1)[1]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def test_the_command_line_tour(tmp_path):
    base = free_port_range(3)
    script = readme_block("## The command line").replace("9092", str(base))
    script = script.replace("cluster up --detach", f"cluster up --detach --base-port {base}")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    try:
        run = subprocess.run(
            ["bash", "-e", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        subprocess.run(
            [sys.executable, "-m", "deploy.cli", "cluster", "down"],
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
        )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "k1" in run.stdout and "hello" in run.stdout and "world" in run.stdout
    assert "orders" in run.stdout and "Traceback" not in run.stderr
