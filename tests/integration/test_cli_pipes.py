"""`minibroker ... | head -1`: a reader that leaves early ends every command quietly.

Like coreutils (killed by SIGPIPE): nothing on stderr, exit status 141 (128 + SIGPIPE).
The reader here closes its end before reading, so the command's first write finds the
pipe closed every time; the `head -1` pipeline of the issue is run as well.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio

from minibroker.client import Admin, NewTopic, Producer

pytestmark = pytest.mark.integration

MINIBROKER = [sys.executable, "-m", "minibroker.deploy.cli"]


def with_reader_gone(*args: str) -> tuple[int, str]:
    proc = subprocess.Popen(
        [*MINIBROKER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    proc.stdout.close()  # the reader leaves before the first line
    try:
        stderr = proc.stderr.read()
        return proc.wait(timeout=60), stderr
    finally:
        proc.kill()


def with_head(*args: str) -> subprocess.CompletedProcess:
    command = " ".join(f"'{a}'" for a in [*MINIBROKER, *args])
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command} | head -1 >/dev/null"],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_every_command_exits_quietly_on_a_closed_pipe(cluster_factory):
    state = await cluster_factory(3)
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic("piped", 1, 3)])
    async with Producer(state.bootstrap) as producer:
        for i in range(3):
            await producer.send("piped", f"line {i}")
    data_dir, bootstrap = str(state.data_dir), state.bootstrap
    commands = [
        ("--help",),
        ("cluster", "status", "--data-dir", data_dir),
        ("topics", "list", "--bootstrap", bootstrap),
        ("topics", "describe", "piped", "--bootstrap", bootstrap),
        ("consume", "piped", "--from-beginning", "--max-messages", "3", "--bootstrap", bootstrap),
    ]
    for command in commands:
        code, stderr = await trio.to_thread.run_sync(with_reader_gone, *command)
        # argparse swallows a failed write of --help itself, and exits 0.
        assert (code, stderr) == (0 if command == ("--help",) else 141, ""), command
        for _ in range(3):  # the pipeline: 3 tracebacks in 5 runs
            piped = await trio.to_thread.run_sync(with_head, *command)
            # (consume's closing count may be there, when head had read before it left)
            assert "error" not in piped.stderr.lower(), (command, piped.stderr)
            assert "Traceback" not in piped.stderr, (command, piped.stderr)
            assert piped.returncode in (0, 141), (command, piped.returncode)
