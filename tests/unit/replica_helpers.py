"""A ReplicaManager on a manual clock, as the unit tests of the partition side build it:
no timer thread, no sockets; the test moves time with ``manager.clock`` and runs what
came due with ``manager.timer``."""

from __future__ import annotations

from pathlib import Path

import structlog

from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.purgatory import ManualClock, ManualTimer, Purgatory
from minibroker.broker.replication.replica_manager import ReplicaManager


def manual_replica_manager(data_dir: Path, config: BrokerConfig | None = None) -> ReplicaManager:
    """Broker 0's ReplicaManager in ``data_dir``, its purgatories on one manual timer."""
    clock = ManualClock()
    timer = ManualTimer(clock)
    manager = ReplicaManager(
        0,
        data_dir,
        config or BrokerConfig(),
        structlog.get_logger(),
        Purgatory("Fetch", timer),
        Purgatory("Produce", timer),
        clock.now_ms,
    )
    manager.clock, manager.timer = clock, timer
    return manager
