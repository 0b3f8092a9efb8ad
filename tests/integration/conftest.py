"""Real broker processes on free loopback ports, started by the same launcher users use."""

from __future__ import annotations

import pytest

from minibroker.deploy.launcher import BrokerProcess, free_port, free_port_range


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


@pytest.fixture
def cluster_factory(tmp_path):
    """Start a local cluster the way `minibroker cluster up` does; stopped after the test."""
    from minibroker.deploy.cluster import ClusterState
    from minibroker.deploy.cluster_ops import acks_all_write

    states = []

    async def start(brokers: int = 3, config: dict | None = None) -> ClusterState:
        state = ClusterState(
            tmp_path / f"cluster-{len(states)}",
            free_port_range(brokers),
            brokers,
            {
                k: str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in (config or {}).items()
            },
        )
        states.append(state)
        state.start_all()
        await acks_all_write(state.bootstrap, min(brokers, 3))
        return state

    yield start
    for state in states:
        state.stop_all()
