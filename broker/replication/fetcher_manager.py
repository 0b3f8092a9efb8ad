"""Which partitions this broker follows, and one replica fetcher for each (Kafka's
ReplicaFetcherManager): started, restarted on a new leader or leader epoch, stopped."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.common.tasks import Spawner
from minibroker.broker.metadata.image import BrokerInfo
from minibroker.broker.network.cluster_auth import ClusterCredentials
from minibroker.broker.network.faults import FaultInjector
from minibroker.broker.replication.partition import Partition
from minibroker.broker.replication.replica_fetcher import ReplicaFetcher


class ReplicaFetcherManager:
    def __init__(
        self,
        broker_id: int,
        config: BrokerConfig,
        logger: Any,
        faults: FaultInjector,
        credentials: ClusterCredentials | None,
        on_follower_hw: Callable[[Partition], None],
        tasks: Spawner,
    ) -> None:
        self.broker_id = broker_id
        self.config = config
        self.log = logger
        self.faults = faults
        self.credentials = credentials
        self.on_follower_hw = on_follower_hw
        self.tasks = tasks
        self.fetchers: dict[tuple[str, int], ReplicaFetcher] = {}

    def follow(self, wanted: Iterable[tuple[Partition, BrokerInfo]]) -> None:
        """Fetch exactly these (partition, leader) pairs; stop fetching everything else."""
        keep: set[tuple[str, int]] = set()
        for partition, leader in wanted:
            keep.add(partition.key)
            self._ensure(partition, leader)
        for key in [k for k in self.fetchers if k not in keep]:
            self.fetchers.pop(key).cancel_scope.cancel()

    def _ensure(self, partition: Partition, leader: BrokerInfo) -> None:
        current = self.fetchers.get(partition.key)
        if current is not None:
            if current.leader == leader and current.leader_epoch == partition.leader_epoch:
                return
            current.cancel_scope.cancel()
        fetcher = ReplicaFetcher(
            partition,
            leader,
            self.broker_id,
            self.config,
            self.log,
            self.on_follower_hw,
            self.faults,
            self.credentials,
        )
        self.fetchers[partition.key] = fetcher
        self.tasks.start_soon(fetcher.run)
