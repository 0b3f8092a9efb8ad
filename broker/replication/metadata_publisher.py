"""Take the roles committed metadata gives this broker, in slices (Kafka's BrokerMetadataPublisher).

Every commit of the metadata log hands this broker a new ClusterMetadata; its partitions
are opened (or created) and made leader or follower, and the replica fetchers are set to
the partitions it follows. Creating a partition makes its directory, log and checkpoint
files, with fsyncs: ~10 ms each, so one change of thousands of partitions held the loop
for seconds and starved the quorum's own fetches and votes, until the followers deposed
the controller (issue 26). So the work runs in its own task, in slices of at most
``SLICE_S`` between which the loop serves everything else.

The cache (what this broker answers Metadata with) takes the new metadata only once
every partition it names here has taken its role, so a leader named in an answer knows
it leads. A newer commit arriving mid-pass restarts the pass on the newer metadata:
partitions already opened are cheap to visit again, so no work is lost and a leadership
move is never queued behind a large create.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from typing import Any

import trio

from minibroker.broker.common.dynamic_config import CLUSTER_DEFAULT, DynamicBrokerConfig
from minibroker.broker.metadata.cache import MetadataCache
from minibroker.broker.metadata.image import BrokerInfo, ClusterMetadata, PartitionState
from minibroker.broker.replication.fetcher_manager import ReplicaFetcherManager
from minibroker.broker.replication.partition import Partition
from minibroker.broker.replication.replica_manager import ReplicaManager

ALL_TOPICS = ""  # (no topic is named ""): every log must take its config again
SLICE_S = 0.02  # the longest the loop is held between two yields
# New partitions are created in worker threads, this many at once (their fsyncs overlap),
# and taken up in chunks, between which a newer commit can cut in.
OPEN_AT_ONCE = 2
SLOW_PASS_MS = 1000  # a pass this long is logged (a big create: the partitions' files)
OPEN_CHUNK = 64


class MetadataPublisher:
    def __init__(
        self,
        broker_id: int,
        cache: MetadataCache,
        replica_manager: ReplicaManager,
        fetchers: ReplicaFetcherManager,
        logger: Any,
        *,
        cannot_host: Callable[[str, int, OSError], None],
        on_published: Callable[[ClusterMetadata], None],
    ) -> None:
        self.broker_id = broker_id
        # Out of descriptors: that replica stays closed, the broker goes on (the next
        # change that finds room opens it). Any other OSError is the log dir failing.
        self._cannot_host = cannot_host
        self._on_published = on_published
        self.cache = cache
        self.replica_manager = replica_manager
        self.fetchers = fetchers
        self.log = logger
        self._latest: ClusterMetadata | None = None
        self._wake = trio.Event()
        self._caught_up = False
        self._openers = trio.CapacityLimiter(OPEN_AT_ONCE)

    def publish(self, md: ClusterMetadata) -> None:
        """Newly committed metadata (a private copy: it is read across yields)."""
        self._latest = md
        self._wake.set()

    def caught_up(self) -> None:
        """The quorum says this broker has applied what was committed at its start: clients
        are served (``cache.ready``) once that metadata has been taken up here."""
        self._caught_up = True
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            md, self._latest = self._latest, None
            started = time.perf_counter()
            if md is not None and not await self._take_roles(md):
                continue  # a newer commit came: start over on it
            took_ms = int((time.perf_counter() - started) * 1000)
            if md is not None and took_ms >= SLOW_PASS_MS:
                self.log.info("metadata_published", epoch=md.epoch, took_ms=took_ms)
            if self._caught_up and self._latest is None:
                self.cache.ready.set()

    async def _take_roles(self, md: ClusterMetadata) -> bool:
        """Host every partition ``md`` gives this broker; False if a newer one arrived."""
        rm = self.replica_manager
        # Deleted topics (or deleted and created again: another topic id) go first, files
        # and all; a directory of a topic deleted while this broker was down goes once the
        # metadata has caught up (before that, its topic may just not be read back yet).
        rm.drop_deleted(md.topics, caught_up=self.cache.ready.is_set())
        mine: list[tuple[str, int, PartitionState]] = []
        new: list[tuple[str, int, PartitionState]] = []
        reconfigured = self._reconfigure(md)
        for name, topic in md.topics.items():
            if name in rm.topic_configs and rm.topic_configs[name] != topic.configs:
                reconfigured.add(name)  # a topic's configs were altered
            rm.topic_configs[name] = topic.configs
            for index, state in enumerate(topic.partitions):
                if self.broker_id in state.replicas:
                    mine.append((name, index, state))
                    if (name, index) not in rm.partitions:
                        new.append((name, index, state))
        follow: list[tuple[Partition, BrokerInfo]] = []
        if len(new) > OPEN_CHUNK:
            # A big create: its brand-new replicas' files are made off the loop. A small one
            # is made inline, as fast as before (a thread hop per partition would let
            # followers start fetching before their leader has taken up the partition,
            # which costs them replica.fetch.backoff.ms).
            new = [item for item in new if not rm.partition_dir(item[0], item[1]).exists()]
            for at in range(0, len(new), OPEN_CHUNK):
                await self._create(new[at : at + OPEN_CHUNK], md)
                if self._latest is not None:
                    return False
        deadline = time.perf_counter() + SLICE_S
        for name, index, state in mine:
            partition = self._host(name, index, state, md.topics[name].topic_id)
            if partition is None:
                continue
            if not partition.is_leader and state.leader in md.brokers:
                follow.append((partition, md.brokers[state.leader]))
            if time.perf_counter() >= deadline:
                await trio.sleep(0)
                if self._latest is not None:
                    return False
                deadline = time.perf_counter() + SLICE_S
        if reconfigured:
            rm.reconfigure_logs(None if ALL_TOPICS in reconfigured else reconfigured)
        self.cache.update(md)
        # An offline log dir replicates nothing (Kafka stops its replicas' fetchers).
        self.fetchers.follow(follow if rm.offline_reason is None else ())
        self._on_published(md)
        return True

    def _reconfigure(self, md: ClusterMetadata) -> set[str]:
        """Take the dynamic broker configs (cluster default, then this broker's): a set
        holding ALL_TOPICS when a setting every log may inherit changed."""
        config = self.replica_manager.config
        if not isinstance(config, DynamicBrokerConfig):
            return set()
        changed = config.reconfigure(
            md.broker_configs.get(CLUSTER_DEFAULT, {}),
            md.broker_configs.get(str(self.broker_id), {}),
        )
        if changed:
            self.log.info("broker_configs_updated", keys=sorted(changed))
        return {ALL_TOPICS} if changed else set()

    def _host(
        self, name: str, index: int, state: PartitionState, topic_id: str
    ) -> Partition | None:
        """The replica in its role, or None when its files cannot be opened or written."""
        try:
            return self.replica_manager.host_partition(name, index, state, topic_id)
        except OSError as exc:
            self._opening_failed(name, index, exc)
            return None

    def _opening_failed(self, name: str, index: int, exc: OSError) -> None:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            self._cannot_host(name, index, exc)
        else:  # disk full (the leader-epoch checkpoint), I/O error, read-only
            self.replica_manager.storage_failed(exc, f"taking the role of {name}-{index}")

    async def _create(
        self, new: list[tuple[str, int, PartitionState]], md: ClusterMetadata
    ) -> None:
        """Create brand-new replicas' files in worker threads (nothing shared: a new
        directory has no sealed segments), then adopt them on the loop, roleless until
        the pass gives each its role."""
        opened: list[tuple[Partition, str]] = []

        async def create(name: str, index: int, state: PartitionState, topic_id: str) -> None:
            try:
                partition = await trio.to_thread.run_sync(
                    self.replica_manager.open_replica,
                    name,
                    index,
                    state,
                    topic_id,
                    limiter=self._openers,
                )
            except OSError as exc:
                self._opening_failed(name, index, exc)
                return
            opened.append((partition, topic_id))

        topics = md.topics
        async with trio.open_nursery() as nursery:
            for name, index, state in new:
                nursery.start_soon(create, name, index, state, topics[name].topic_id)
        for partition, topic_id in opened:
            self.replica_manager.adopt(partition, topic_id)
