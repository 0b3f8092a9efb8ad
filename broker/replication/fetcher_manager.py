"""Which partitions this broker follows, and one replica fetcher for each (Kafka's
ReplicaFetcherManager): started, restarted on a new leader or leader epoch, stopped.

The fetchers of one leader share its LeaderLink (one connection, one Fetch in flight):
a link opens with its first fetcher and closes when its last one stops, so a broker
holds one replication connection per leader it follows, whatever the partition count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.common.tasks import Spawner
from minibroker.broker.metadata.image import BrokerInfo
from minibroker.broker.network.cluster_auth import ClusterCredentials
from minibroker.broker.network.faults import FaultInjector
from minibroker.broker.network.peer import PeerConnection
from minibroker.broker.replication.leader_link import LeaderLink
from minibroker.broker.replication.partition import Partition
from minibroker.broker.replication.replica_fetcher import ReplicaFetcher
from minibroker.protocol import ApiKey


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
        on_storage_error: Callable[[OSError, str], None],
    ) -> None:
        self.broker_id = broker_id
        self.config = config
        self.log = logger
        self.faults = faults
        self.credentials = credentials
        self.on_follower_hw = on_follower_hw
        self.tasks = tasks
        self.on_storage_error = on_storage_error
        self.fetchers: dict[tuple[str, int], ReplicaFetcher] = {}
        # By (node id, host, port): a leader that re-registers elsewhere gets a new link.
        self.links: dict[tuple[int, str, int], LeaderLink] = {}
        # The follower's replication quota (bound by follower.replication.throttled.rate,
        # live) and each topic's configs (which name the throttled replicas): set by the
        # server (broker/quota/replication.py).
        self.follower_quota: Any = None
        self.topic_configs: Callable[[str], dict | None] = lambda topic: None

    def follow(self, wanted: Iterable[tuple[Partition, BrokerInfo]]) -> None:
        """Fetch exactly these (partition, leader) pairs; stop fetching everything else."""
        keep: set[tuple[str, int]] = set()
        for partition, leader in wanted:
            keep.add(partition.key)
            self._ensure(partition, leader)
        for key in [k for k in self.fetchers if k not in keep]:
            self.fetchers.pop(key).stop()
        used = {_address(fetcher.leader) for fetcher in self.fetchers.values()}
        for address in [a for a in self.links if a not in used]:
            self.links.pop(address).cancel_scope.cancel()

    def stop_all(self) -> None:
        """Stop every fetcher and close every link (the log dir went offline)."""
        self.follow(())

    def _ensure(self, partition: Partition, leader: BrokerInfo) -> None:
        current = self.fetchers.get(partition.key)
        if current is not None:
            if current.leader == leader and current.leader_epoch == partition.leader_epoch:
                return
            current.stop()
        fetcher = ReplicaFetcher(
            partition,
            leader,
            self.broker_id,
            self.config,
            self.log,
            self.on_follower_hw,
            self.faults,
            self._link(leader),
            self.on_storage_error,
        )
        if self.follower_quota is not None:
            fetcher.quota = self.follower_quota
            fetcher.topic_configs = self.topic_configs
        self.fetchers[partition.key] = fetcher
        self.tasks.start_soon(fetcher.run)

    def _link(self, leader: BrokerInfo) -> LeaderLink:
        link = self.links.get(_address(leader))
        if link is None:
            cfg = self.config
            conn = PeerConnection(
                leader.host,
                leader.port,
                f"replica-fetcher-{self.broker_id}",
                credentials=self.credentials,
                peer_id=leader.node_id,
            )
            link = self.links[_address(leader)] = LeaderLink(
                leader.node_id,
                conn,
                {
                    # Truncation before the first fetch of a partition (KIP-101).
                    ApiKey.OFFSET_FOR_LEADER_EPOCH: {"replica_id": self.broker_id},
                    ApiKey.FETCH: {
                        "replica_id": self.broker_id,
                        "max_wait_ms": cfg["replica.fetch.wait.max.ms"],
                        "min_bytes": cfg["replica.fetch.min.bytes"],
                        "max_bytes": cfg["replica.fetch.response.max.bytes"],
                    },
                },
                {
                    ApiKey.OFFSET_FOR_LEADER_EPOCH: 10,
                    ApiKey.FETCH: cfg["replica.fetch.wait.max.ms"] / 1000 + 30,
                },
            )
            self.tasks.start_soon(link.run)
        return link


def _address(leader: BrokerInfo) -> tuple[int, str, int]:
    return (leader.node_id, leader.host, leader.port)
