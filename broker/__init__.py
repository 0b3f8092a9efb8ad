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

from minibroker.broker.common.config import BrokerConfig, ConfigError, load_config
from minibroker.broker.server import Broker, run_broker

__all__ = ["Broker", "BrokerConfig", "ConfigError", "load_config", "run_broker"]
