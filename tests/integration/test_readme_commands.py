"""The README's command-line tour runs as written: only its ports are moved to free ones,
so the test cannot collide with a cluster a developer has running on 9092."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import trio

from minibroker.deploy.launcher import free_port_range

ROOT = Path(__file__).resolve().parents[2]


def readme_block(heading: str, lang: str = "bash") -> str:
    section = (ROOT / "README.md").read_text().split(heading, 1)[1]
    return section.split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def on_ports(text: str, base: int) -> str:
    """The README's 9092-9094 moved to base..base+2."""
    for i in range(3):
        text = text.replace(str(9092 + i), str(base + i))
    return text


def test_the_command_line_tour(tmp_path):
    base = free_port_range(6)  # 3 brokers and their Kafka listeners, all checked free
    script = on_ports(readme_block("## The command line"), base)
    assert f"MINIBROKER_BOOTSTRAP=127.0.0.1:{base},127.0.0.1:{base + 1},127.0.0.1:{base + 2}" in (
        script
    )
    script = script.replace(
        "cluster up --detach",
        f"cluster up --detach --base-port {base} --kafka-base-port {base + 3}",
    )
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
            [sys.executable, "-m", "minibroker.deploy.cli", "cluster", "down"],
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
        )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "k1" in run.stdout and "hello" in run.stdout and "world" in run.stdout
    assert "orders" in run.stdout and "Traceback" not in run.stderr


async def test_the_async_client_example_shows_what_it_says_and_runs_twice(cluster_factory):
    state = await cluster_factory(3)
    readme_bootstrap = "127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094"
    script = readme_block("## The client library", "python")
    assert f'BOOTSTRAP = "{readme_bootstrap}"' in script  # the example names every broker
    script = script.replace(readme_bootstrap, state.bootstrap)
    runs = []
    for _ in range(2):  # a second run must not die on the topic the first one created
        runs.append(
            await trio.to_thread.run_sync(
                lambda: subprocess.run(
                    [sys.executable, "-c", script],
                    capture_output=True,
                    text=True,
                    timeout=120,
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                )
            )
        )
    for run in runs:
        assert run.returncode == 0, run.stderr
        lines = run.stdout.splitlines()
        assert len(lines) == 3, run.stdout  # the keyed record, the spread, the read-back
        assert lines[0].startswith("keyed record: RecordMetadata(topic='events'")
        spread = ast.literal_eval(lines[1].removeprefix("unkeyed records per partition: "))
        assert sum(spread.values()) == 1000 and set(spread) <= {0, 1, 2}
        assert lines[2].startswith("read back: ") and lines[2].endswith("b'user-1' b'value'")
    # The second run read back its own keyed record, one offset further on.
    first, second = (int(run.stdout.split("offset=")[1].split(")")[0]) for run in runs)
    assert second > first
