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


def _free_base_port(count: int) -> int:
    """A run of ``count`` consecutive free loopback ports."""
    import random
    import socket

    for _ in range(100):
        base = random.randint(20000, 60000 - count)
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


@pytest.fixture
def cluster_factory(tmp_path):
    """Start a local cluster the way `minibroker cluster up` does; stopped after the test."""
    from deploy.cluster import ClusterState
    from deploy.cluster_ops import acks_all_write

    states = []

    async def start(brokers: int = 3, config: dict | None = None) -> ClusterState:
        state = ClusterState(
            tmp_path / f"cluster-{len(states)}",
            _free_base_port(brokers),
            brokers,
            {
                k: str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in (config or {}).items()
            },
        )
        states.append(state)
        for i in range(brokers):
            state.start(i)
        state.save()
        state.wait_ready(list(range(brokers)))
        await acks_all_write(state.bootstrap, min(brokers, 3))
        return state

    yield start
    for state in states:
        for i in range(state.brokers):
            state.stop(i)
