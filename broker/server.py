"""A broker process: wires storage, purgatories, the controller role and the network together.

Threads: the trio loop (network, handlers, replica fetchers, completions) and the
timer thread that owns the timing wheels. Expired operations cross back into the
loop in batches through the trio token, so completion and expiration callbacks all
run on one thread.
"""

from __future__ import annotations

import fcntl
import gc
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from minibroker.broker.apis import RequestHandler
from minibroker.broker.common.config import BrokerConfig, ConfigError
from minibroker.broker.controller.active import ControllerRole
from minibroker.broker.controller.controller import METADATA_FILE, Controller
from minibroker.broker.controller.membership import ControllerLink, VotersError, parse_voters
from minibroker.broker.controller.producer_ids import ProducerIdManager
from minibroker.broker.metadata.image import BrokerInfo, ClusterMetadata, load_metadata
from minibroker.broker.metadata.records import MetadataImage
from minibroker.broker.network.cluster_auth import (
    Authenticator,
    ClusterCredentials,
    SecretFileError,
    load_credentials,
)
from minibroker.broker.network.faults import FaultInjector
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.network.request_metrics import RequestMetrics
from minibroker.broker.network.socket_server import ConnectionHandler, max_connections_for
from minibroker.broker.purgatory import MonotonicClock, Purgatory, SystemTimer, switch_interval_for
from minibroker.broker.raft import QuorumConfig
from minibroker.broker.raft.driver import QuorumDriver
from minibroker.broker.replication.alter_partition import AlterPartitionManager
from minibroker.broker.replication.fetcher_manager import ReplicaFetcherManager
from minibroker.broker.replication.partition import Partition
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import KafkaError

# A client request held for the metadata catch-up (after_catch_up) waits at most this long,
# then is answered from what the broker knows: below a client's default request timeout.
CATCH_UP_WAIT_S = 25
# Allocations between young collections; young collections per middle one; middle per full.
GC_THRESHOLDS = (10_000, 20, 100)


class DataDirInUse(RuntimeError):
    """Another broker process holds this data directory."""


def lock_data_dir(data_dir: Path) -> int:
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirInUse(f"data dir {data_dir} is in use by another broker process") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


class Broker:
    def __init__(
        self,
        broker_id: int,
        host: str,
        port: int,
        data_dir: Path,
        config: BrokerConfig,
        logger: Any,
    ) -> None:
        self.broker_id = broker_id
        self.host = host
        self.port = port
        self.data_dir = data_dir
        self.config = config
        self.log = logger
        self.clock = MonotonicClock()
        self.started_ms = self.clock.now_ms()
        self.metadata = ClusterMetadata()
        try:
            self.voters = parse_voters(config["controller.quorum.voters"])
        except VotersError as exc:
            raise ConfigError(str(exc)) from None
        if self.voters and broker_id not in self.voters:
            # It would be a KRaft observer (metadata by fetching the log, no vote): not built.
            raise ConfigError(
                f"broker {broker_id} is not in controller.quorum.voters "
                f"({', '.join(map(str, sorted(self.voters)))}): every broker of a cluster must "
                "be a voter (brokers outside the voter set are not supported yet)"
            )
        # The active controller is whichever voter leads the metadata quorum with its epoch
        # committed (KRaft): both follow the quorum (_leader_changed, _active_changed).
        self.controller_id = -1
        self.credentials = self._credentials(broker_id, config)
        self.authenticator = Authenticator(self.credentials, broker_id, logger)
        self.timer: SystemTimer | None = None
        self.replica_manager: ReplicaManager | None = None
        self.role = ControllerRole(BrokerInfo(broker_id, host, port), config, self.clock, logger)
        self.quorum: QuorumDriver | None = None
        self.link: ControllerLink | None = None
        self.connections: ConnectionHandler | None = None
        self.nursery: trio.Nursery | None = None
        self.fetchers: ReplicaFetcherManager | None = None
        self.isr_proposals: AlterPartitionManager | None = None
        self.producer_ids: ProducerIdManager | None = None
        self.request_metrics = RequestMetrics()
        self._metrics_server: Any = None
        self.image: MetadataImage | None = None
        self.leader_known = trio.Event()  # set (and replaced) whenever the controller changes
        # Set once this broker's metadata has caught up with the quorum after its start:
        # until then client requests wait (apis.WAIT_FOR_METADATA).
        self.metadata_ready = trio.Event()
        self.faults = FaultInjector()

    def _credentials(self, broker_id: int, config: BrokerConfig) -> ClusterCredentials | None:
        """The cluster secret; required as soon as there are other brokers to trust."""
        path = config["cluster.secret.file"]
        if path:
            try:
                return load_credentials(Path(path), broker_id)
            except SecretFileError as exc:
                raise ConfigError(f"config 'cluster.secret.file': {exc}") from None
        others = sorted(set(self.voters) - {broker_id})
        if others:
            raise ConfigError(
                "config 'cluster.secret.file' is required: controller.quorum.voters lists "
                f"other brokers ({', '.join(map(str, others))}), and brokers prove membership "
                "to each other with the cluster's secret ('minibroker cluster up' writes one)"
            )
        # A single broker has no peers: every internal API is refused (nobody can authenticate).
        return None

    def load_state(self) -> None:
        """Read what must be sound before serving; raises one-line errors (corrupt metadata)."""
        if self.quorum is None:
            self.image = MetadataImage()
            self.quorum = self._quorum_driver()
            self.quorum.on_commit = self._metadata_committed
            self.quorum.on_leader_change = self._leader_changed
            self.quorum.on_active_change = self._active_changed
            self.quorum.on_caught_up = self.metadata_ready.set
            self.quorum.load()
            # A data dir from before the quorum: its controller's file (broker 0's, which
            # stands first in a new quorum) is imported by whichever voter holding one
            # becomes active while the log has no topics. Corrupt: one line, no start.
            self.role.legacy = load_metadata(self.data_dir / METADATA_FILE)

    def _metadata_committed(self) -> None:
        """Every voter applies each commit through the one path pushes used to take."""
        md = self.image.metadata.copy()
        md.controller_id = self.controller_id
        if self.replica_manager is not None and self.nursery is not None:
            self.apply_metadata(md)
        else:
            self.metadata = md

    def _leader_changed(self, effect: Any) -> None:
        leader = effect.leader_id if effect.leader_id is not None else -1
        if leader != self.controller_id:
            self.controller_id = leader
            self.metadata.controller_id = leader
            self.leader_known.set()
            self.leader_known = trio.Event()

    @property
    def controller(self) -> Controller | None:
        return self.role.controller

    @property
    def is_controller(self) -> bool:
        return self.role.active

    def _active_changed(self, active: bool) -> None:
        """Quorum leader with its epoch committed: the controller role, built from the image."""
        if active:
            self.controller_id = self.broker_id
            self.role.activate(self.image.metadata, self.quorum.append_and_answer)
        else:
            self.role.deactivate()
        self.leader_known.set()
        self.leader_known = trio.Event()

    def _quorum_driver(self) -> QuorumDriver:
        """Every listed voter runs the metadata quorum; a lone broker is a one-voter quorum."""
        c = self.config
        config = QuorumConfig(
            election_timeout_ms=c["controller.quorum.election.timeout.ms"],
            fetch_timeout_ms=c["controller.quorum.fetch.timeout.ms"],
            election_backoff_max_ms=c["controller.quorum.election.backoff.max.ms"],
            request_timeout_ms=c["controller.quorum.request.timeout.ms"],
            retry_backoff_ms=c["controller.quorum.retry.backoff.ms"],
        )
        voters = self.voters or {self.broker_id: (self.host, self.port)}
        return QuorumDriver(
            self.broker_id,
            voters,
            self.data_dir,
            self.clock,
            self.log,
            config=config,
            credentials=self.credentials,
            state_machine=self.image,
        )

    # --- metadata -------------------------------------------------------------------------

    def apply_metadata(self, md: ClusterMetadata) -> None:
        """Take the roles a metadata snapshot gives this broker; start/stop replica fetchers."""
        self.metadata = md
        rm = self.replica_manager
        rm.drop_deleted(md.topics, caught_up=self.metadata_ready.is_set())
        follow: list[tuple[Partition, BrokerInfo]] = []
        for name, topic in md.topics.items():
            rm.topic_configs[name] = topic.configs
            for index, state in enumerate(topic.partitions):
                if self.broker_id not in state.replicas:
                    continue
                partition = rm.host_partition(name, index, state, topic.topic_id)
                if not partition.is_leader and state.leader in md.brokers:
                    follow.append((partition, md.brokers[state.leader]))
        self.fetchers.follow(follow)

    def _follower_hw_changed(self, partition: Partition) -> None:
        self.replica_manager.fetch_purgatory.check_and_complete(partition.key)

    def after_catch_up(self, handle: Callable[[], dict | PendingResponse]) -> PendingResponse:
        """Run ``handle`` once the metadata has caught up (or after CATCH_UP_WAIT_S, when it
        answers from whatever this broker knows, as a client's own timeout is near)."""
        pending = PendingResponse()

        async def later() -> None:
            with trio.move_on_after(CATCH_UP_WAIT_S):
                await self.metadata_ready.wait()
            result = handle()
            pending.set(await result.wait() if isinstance(result, PendingResponse) else result)

        self.nursery.start_soon(later)
        return pending

    def delayed(
        self, delay_ms: int, result: dict | PendingResponse | None
    ) -> PendingResponse | None:
        """Hold a response back for ``delay_ms`` (fault delay-api)."""
        if result is None:
            return None
        pending = PendingResponse()

        async def later() -> None:
            await trio.sleep(delay_ms / 1000)
            pending.set(await result.wait() if isinstance(result, PendingResponse) else result)

        self.nursery.start_soon(later)
        return pending

    def auto_create(self, names: list[str]) -> None:
        self.link.create_topics(
            [
                {"name": n, "num_partitions": -1, "replication_factor": -1, "configs": {}}
                for n in names
            ],
            False,
        )

    async def _isr_shrink_loop(self) -> None:
        lag = self.config["replica.lag.time.max.ms"]
        while True:
            await trio.sleep(max(lag / 2, 10) / 1000)
            self.replica_manager.maybe_shrink_isr(self.clock.now_ms(), lag)

    def stats(self) -> dict:
        rm = self.replica_manager
        return {
            "uptime_ms": self.clock.now_ms() - self.started_ms,
            "controller_id": self.controller_id,
            "metadata_epoch": self.metadata.epoch,
            "quorum": self.quorum.stats() if self.quorum else {},
            "connections": self.connections.open_connections if self.connections else 0,
            "connections_muted": self.connections.muted_connections if self.connections else 0,
            "purgatory": {
                "produce": rm.produce_purgatory.stats(),
                "fetch": rm.fetch_purgatory.stats(),
            },
            "requests": self.request_metrics.snapshot(),
            "partitions": [
                {
                    "topic": p.topic,
                    "partition": p.index,
                    "leader": p.leader_id,
                    "leader_epoch": p.leader_epoch,
                    "replicas": p.replicas,
                    "isr": p.isr,
                    "high_watermark": p.high_watermark,
                    "log_end_offset": p.log.log_end_offset,
                    "log_start_offset": p.log.log_start_offset,
                    # Idempotent producers whose sequences this replica tracks.
                    "producers": len(p.log.producers),
                }
                for p in rm.partitions.values()
            ],
        }

    # --- run ------------------------------------------------------------------------------

    def _start_purgatories(self) -> tuple[Purgatory, Purgatory]:
        token = trio.lowlevel.current_trio_token()
        config = self.config
        self.timer = SystemTimer(
            tick_ms=config["timer.tick.ms"], wheel_size=config["timer.wheel.size"], clock=self.clock
        )

        def to_loop(purgatory: Purgatory):
            # Expired ops cross into the trio thread in one batch per timer wake-up.
            def hand_off(batch: list) -> None:
                try:
                    token.run_sync_soon(purgatory.expire_batch, batch)
                except trio.RunFinishedError:
                    pass

            return hand_off

        fetch = Purgatory(
            "Fetch", self.timer, purge_interval=config["fetch.purgatory.purge.interval.requests"]
        )
        produce = Purgatory(
            "Produce",
            self.timer,
            purge_interval=config["producer.purgatory.purge.interval.requests"],
        )
        fetch.set_expiry_handoff(to_loop(fetch))
        produce.set_expiry_handoff(to_loop(produce))
        self.timer.start()
        return fetch, produce

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        fetch, produce = self._start_purgatories()
        self.replica_manager = ReplicaManager(
            self.broker_id,
            self.data_dir,
            config,
            self.log,
            fetch,
            produce,
            now_ms=self.clock.now_ms,
        )
        try:
            self.connections = ConnectionHandler(
                RequestHandler(self),
                max_frame_bytes=config["socket.request.max.bytes"],
                idle_ms=config["connections.max.idle.ms"],
                logger=self.log,
                max_connections=max_connections_for(config["max.connections"]),
                max_connections_per_ip=config["max.connections.per.ip"],
                queued_response_bytes=config["queued.max.response.bytes"],
                send_stall_ms=config["connections.max.send.stall.ms"],
                metrics=self.request_metrics,
            )
            # Bind before any task starts, so "address in use" surfaces as a plain OSError.
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
            if config["metrics.port"]:
                # Imported only when asked for: prometheus-client costs every broker ~4 MB.
                from minibroker.broker.prometheus_export import serve_metrics

                self._metrics_server = serve_metrics(self, config["metrics.port"])
            async with trio.open_nursery() as nursery:
                self._wire(nursery)
                nursery.start_soon(self.connections.serve, listeners)
                self.load_state()
                self.apply_metadata(self.metadata)
                if self.quorum is not None:
                    await nursery.start(self.quorum.run)
                nursery.start_soon(self.link.run)
                nursery.start_soon(self._retention_loop)
                nursery.start_soon(self._producer_expiration_loop)
                nursery.start_soon(self._prefetch_producer_ids)
                nursery.start_soon(self._isr_shrink_loop)
                nursery.start_soon(self.role.fence_silent_brokers)
                self.log.info(
                    "broker_started",
                    host=self.host,
                    port=self.port,
                    data_dir=str(self.data_dir),
                    pid=os.getpid(),
                    controller=self.controller_id,
                    startup_ms=self.clock.now_ms() - self.started_ms,
                )
                task_status.started()
        finally:
            if self._metrics_server is not None:
                self._metrics_server.shutdown()
            self.timer.shutdown()
            self.replica_manager.close()
            self.log.info("broker_stopped")

    def _wire(self, nursery: trio.Nursery) -> None:
        """The parts that run tasks: the controller link, fetchers, ISR proposals."""
        self.nursery = nursery
        self.link = ControllerLink(self)
        self.fetchers = ReplicaFetcherManager(
            self.broker_id,
            self.config,
            self.log,
            self.faults,
            self.credentials,
            self._follower_hw_changed,
        )
        self.fetchers.nursery = nursery

        async def to_controller(api_key: int, body: dict, local: Callable) -> dict:
            return await self.link.controller_call(api_key, body, local, timeout=10)

        self.isr_proposals = AlterPartitionManager(
            self.broker_id,
            self.replica_manager,
            to_controller,
            self.role.alter_partition,
            nursery,
            self.log,
        )
        self.replica_manager.on_isr_change = self.isr_proposals.propose

        async def allocate_producer_ids() -> dict:
            return await to_controller(
                ApiKey.ALLOCATE_PRODUCER_IDS,
                {"broker_id": self.broker_id},
                self.role.allocate_producer_ids,
            )

        self.producer_ids = ProducerIdManager(allocate_producer_ids, nursery, self.log)

    async def controlled_shutdown(self) -> None:
        """Tell the controller we are going, so leaders move at once (best effort)."""
        if self.quorum is not None:
            await self.quorum.resign(timeout=1)
        if self.link is None or self.controller_id < 0 or self.controller_id == self.broker_id:
            return
        with trio.move_on_after(2):
            try:
                await self.link.request(
                    self.controller_id,
                    ApiKey.BROKER_HEARTBEAT,
                    {
                        "broker_id": self.broker_id,
                        "metadata_epoch": self.metadata.epoch,
                        "shutting_down": True,
                    },
                )
            except KafkaError as exc:
                self.log.warning("controlled_shutdown_failed", error=str(exc))

    async def _retention_loop(self) -> None:
        interval = self.config["log.retention.check.interval.ms"] / 1000
        while True:
            await trio.sleep(interval)
            try:
                deleted = self.replica_manager.delete_old_segments()
            except OSError as exc:
                self.log.error("retention_failed", error=str(exc))
                continue
            if deleted:
                self.log.info("retention_deleted_segments", count=deleted)

    async def _prefetch_producer_ids(self) -> None:
        await self.metadata_ready.wait()
        self.producer_ids.prefetch()

    async def _producer_expiration_loop(self) -> None:
        interval = self.config["producer.id.expiration.check.interval.ms"] / 1000
        while True:
            await trio.sleep(interval)
            expired = self.replica_manager.remove_expired_producers(int(time.time() * 1000))
            if expired:
                self.log.info("producer_ids_expired", count=expired)


async def serve(broker: Broker) -> None:
    """Run until SIGTERM/SIGINT, then shut down cleanly (logs flushed and closed)."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(broker.run)
            async for signum in signals:
                broker.log.info("shutdown_requested", signal=signal.Signals(signum).name)
                await broker.controlled_shutdown()
                nursery.cancel_scope.cancel()
                break


def collect_garbage_rarely() -> None:
    """Start-up's objects are never scanned again, and young objects are collected in
    larger, rarer passes.

    With CPython's default thresholds (700, 10, 10) a broker holding 5,000 long polls
    spent ~2 s of every 15 s in the cyclic collector, in pauses of up to 214 ms (full
    collections walking every connection and parked request): that was the expiry
    lateness p99 (bench longpoll, gc.callbacks). Requests free their objects by
    reference count; the collector only has to find the rare cycle (an exception's
    traceback, say), so collecting it less often costs memory only briefly. A frozen
    object in a cycle would never be reclaimed, but what start-up loads (config, the
    metadata image, the partitions, which are never removed) lives as long as the broker.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run_broker(
    broker_id: int, host: str, port: int, data_dir: Path, config: BrokerConfig, logger: Any
) -> None:
    broker = Broker(broker_id, host, port, data_dir, config, logger)
    # The timer thread must not wait 5 ms (CPython's default) for the GIL while the trio
    # thread is busy: that would be 5 ms of lateness on every timeout.
    sys.setswitchinterval(switch_interval_for(config["timer.tick.ms"]))
    fd = lock_data_dir(data_dir)
    try:
        broker.load_state()
        collect_garbage_rarely()
        trio.run(serve, broker)
    finally:
        os.close(fd)
