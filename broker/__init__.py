"""The broker: one folder per subsystem, as Kafka's tree has them.

    common/       config, topic configs, logging, histogram, clocks, atomic file writes,
                  background tasks, GC policy
    purgatory/    the timing wheel on its timer thread, watcher lists (knows no sockets)
    storage/      partition logs: segments, indexes, recovery, producer state, epoch cache
    raft/         the controller quorum: the sans-IO Raft core, its driver and its disk
    metadata/     the metadata image, the records that build it, its checks
    network/      the socket server, outboxes, sessions, peer links, cluster auth
    replication/  partitions, the replica manager, delayed produce/fetch, fetchers
    controller/   the active controller's decisions, and brokers' registration with it
    apis.py       request dispatch (Kafka's KafkaApis), built with its collaborators
    server.py     ``Broker``: builds the subsystems in order, each given what it needs

Each folder may import only the folders below it in this list's layering
(tests/unit/test_layering.py holds the rule).
"""

from __future__ import annotations

import importlib
from typing import Any

# Re-exported lazily (PEP 562): ``import minibroker.broker.common.atomic_file`` from the
# CLI or a client-side tool must not import the whole server (trio, the quorum, the
# replica manager: ~0.3 s of CPU for every `minibroker` command).
_PUBLIC = {
    "Broker": "minibroker.broker.server",
    "run_broker": "minibroker.broker.server",
    "BrokerConfig": "minibroker.broker.common.config",
    "ConfigError": "minibroker.broker.common.config",
    "load_config": "minibroker.broker.common.config",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
