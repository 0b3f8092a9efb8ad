"""Real broker processes on free loopback ports, started by the same launcher users use."""

from __future__ import annotations

import pytest

from deploy.launcher import BrokerProcess, free_port


@pytest.fixture
def broker_factory(tmp_path):
    started: list[BrokerProcess] = []

    def start(config: dict | None = None, broker_id: int = 0, data_dir=None) -> BrokerProcess:
        proc = BrokerProcess(
            broker_id,
            free_port(),
            data_dir or tmp_path / f"broker-{broker_id}-{len(started)}",
            config,
        )
        proc.start()
        started.append(proc)
        proc.wait_ready()
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def broker_process(broker_factory) -> BrokerProcess:
    return broker_factory()


@pytest.fixture
def broker(broker_process) -> str:
    """Bootstrap address of a fresh single broker."""
    return broker_process.address
