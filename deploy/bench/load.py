"""What the connection benchmarks share (``bench longpoll``, ``bench requests``): a broker
to measure, started here or given, and client processes that connect, start together at
a time the parent sends, run, and send their figures back.

Clients run in processes of their own (spawned: no state inherited), so the broker, not
one Python client, is what gets saturated; each reports its own CPU so that can be checked.
Times cross processes as CLOCK_MONOTONIC, which is one clock for the whole machine.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from minibroker.deploy.cluster import ClusterState
from minibroker.deploy.launcher import free_port_range


def raise_fd_limit() -> None:
    """Connections are descriptors, here and in a broker started from here."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def add_broker_under_test_argument(p: argparse.ArgumentParser) -> None:
    """``--bootstrap``: the broker :func:`broker_under_test` measures, else one it starts."""
    p.add_argument(
        "--bootstrap",
        default=None,
        metavar="HOST:PORT",
        help="a running broker to measure (default: start one in a temporary directory)",
    )


@contextmanager
def broker_under_test(
    bootstrap: str | None, prefix: str, config: dict[str, str] | None = None
) -> Iterator[tuple[str, psutil.Process | None]]:
    """``(bootstrap, broker process)``: the given broker (process unknown, None), or one
    broker started in a temporary directory (with ``config`` set) and stopped afterwards."""
    raise_fd_limit()
    if bootstrap:
        yield bootstrap, None
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        state = ClusterState(Path(tmp), free_port_range(1), 1, dict(config or {}))
        state.start_all()
        try:
            yield state.bootstrap, state.process(0)
        finally:
            state.stop_all()


def shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal whole shares."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def cpu_seconds(process: psutil.Process | None) -> float | None:
    if process is None:
        return None
    times = process.cpu_times()
    return times.user + times.system


class ClientProcesses:
    """Spawned processes each running ``target(conf, pipe)``: the child sends anything once
    connected, then receives the parent's start message, runs, and sends its figures."""

    def __init__(self, target: Callable[[tuple, Any], None], confs: list[tuple]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.children = []
        for conf in confs:
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=target, args=(conf, child_end), daemon=True)
            proc.start()
            self.children.append((proc, parent_end))

    def __enter__(self) -> ClientProcesses:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for proc, _ in self.children:
            if proc.is_alive():
                proc.kill()

    def wait_connected(self, timeout_s: float) -> None:
        for _, pipe in self.children:
            if not pipe.poll(timeout_s):
                raise ValueError(f"a client process did not connect within {timeout_s:.0f} s")
            pipe.recv()

    def start(self, message: Any) -> None:
        for _, pipe in self.children:
            pipe.send(message)

    def results(self, timeout_s: float) -> list[Any]:
        out = []
        for proc, pipe in self.children:
            if not pipe.poll(timeout_s):
                raise ValueError("a client process did not report")
            out.append(pipe.recv())
            proc.join(10)
        return out


def count_error(stats: dict[str, Any], text: str) -> None:
    """A client process's error: counted, and the first one kept to be reported."""
    stats["errors"] += 1
    if stats["first_error"] is None:
        stats["first_error"] = text
