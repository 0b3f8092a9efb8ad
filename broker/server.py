"""A broker process: builds storage, purgatories, the controller role and the network in
order, each given what it needs, and runs them.

Threads: the trio loop (network, handlers, replica fetchers, completions) and the
timer thread that owns the timing wheels. Expired operations cross back into the
loop in batches through the trio token, so completion and expiration callbacks all
run on one thread.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from minibroker.broker.apis import RequestHandler
from minibroker.broker.common.config import BrokerConfig, ConfigError
from minibroker.broker.common.descriptors import (
    connections_error,
    descriptor_budget,
    fd_limit,
    raise_fd_limit,
)
from minibroker.broker.common.dynamic_config import DynamicBrokerConfig
from minibroker.broker.common.gc_policy import collect_garbage_rarely
from minibroker.broker.common.logs import log_lines_dropped, write_fatal_line
from minibroker.broker.common.tasks import BackgroundTasks
from minibroker.broker.common.topic_config import offsets_topic_configs
from minibroker.broker.controller.active import ControllerRole
from minibroker.broker.controller.controller import METADATA_FILE
from minibroker.broker.controller.membership import ControllerLink, quorum_voters
from minibroker.broker.controller.producer_ids import ProducerIdManager
from minibroker.broker.controller.rebalance import LeaderRebalancer
from minibroker.broker.coordinator import CoordinatorService
from minibroker.broker.kafka import KafkaCodec, KafkaRequestHandler
from minibroker.broker.kafka.listener import kafka_listener
from minibroker.broker.metadata.cache import MetadataCache
from minibroker.broker.metadata.image import BrokerInfo, load_metadata
from minibroker.broker.metadata.records import MetadataImage
from minibroker.broker.network.cluster_auth import Authenticator, credentials_from_config
from minibroker.broker.network.deferral import RequestDeferral
from minibroker.broker.network.faults import FaultInjector
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.network.poller import choose_backend
from minibroker.broker.network.request_metrics import RequestMetrics
from minibroker.broker.network.socket_server import ConnectionHandler
from minibroker.broker.purgatory import MonotonicClock, Purgatory, SystemTimer, switch_interval_for
from minibroker.broker.quota import ClientQuotas
from minibroker.broker.quota.replication import replication_quotas
from minibroker.broker.raft.config import quorum_config
from minibroker.broker.raft.driver import QuorumDriver
from minibroker.broker.raft.effects import LeaderChanged
from minibroker.broker.replication.alter_partition import AlterPartitionManager
from minibroker.broker.replication.fetcher_manager import ReplicaFetcherManager
from minibroker.broker.replication.housekeeping import run_housekeeping
from minibroker.broker.replication.metadata_publisher import MetadataPublisher
from minibroker.broker.replication.partition import Partition
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.broker.storage.dir_lock import mark_clean_shutdown, open_data_dir
from minibroker.broker.transaction import TransactionService
from minibroker.broker.transaction.sender import PeerMarkerSender
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import KafkaError


class ListenerBindError(OSError):
    """A listener other than the broker's own port could not bind: which setting names it
    (the start error must not blame --listen for a port it does not give)."""

    def __init__(self, setting: str, host: str, port: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.setting, self.host, self.port = setting, host, port


def _to_loop(token: trio.lowlevel.TrioToken, purgatory: Purgatory) -> Callable[[list], None]:
    """The timer thread's hand-off of ``purgatory``'s expired operations to the trio loop."""

    def hand_off(batch: list) -> None:
        try:
            token.run_sync_soon(purgatory.expire_batch, batch)
        except trio.RunFinishedError:
            pass

    return hand_off


class Broker:
    """Builds every collaborator in order, each with what it needs; ``run`` starts them.

    Nothing is filled in later: what needs a nursery takes ``tasks``, which ``run`` opens
    before anything can start a task.
    """

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
        # Every subsystem reads this one object: the metadata's dynamic broker configs
        # (IncrementalAlterConfigs) are layered into it in place as they commit.
        config = DynamicBrokerConfig(config)
        # (host, port) of the Kafka listener; () when kafka.listener is off.
        self.kafka_address = kafka_listener(config) or ()
        kafka_host, kafka_port = self.kafka_address or ("", 0)
        self.me = BrokerInfo(broker_id, host, port, kafka_host, kafka_port)
        self.data_dir = data_dir
        self.config = config
        self.log = logger
        self.clock = MonotonicClock()
        self.started_ms = self.clock.now_ms()
        self.fd_limit_raised_from = fd_limit()  # run_broker says otherwise when it raised it
        self.voters = quorum_voters(broker_id, config)
        self.credentials = credentials_from_config(broker_id, config, self.voters)
        self.tasks = BackgroundTasks()
        self.cache = MetadataCache()
        # Checked here, so an unavailable poller is a one-line start error like any config.
        self.poller = choose_backend(config["socket.poller"])
        self.faults = FaultInjector()
        self.request_metrics = RequestMetrics()
        self.role = ControllerRole(self.me, config, self.clock, logger)
        self.image = MetadataImage()
        self.quorum = self._quorum_driver()
        self.timer = SystemTimer(
            tick_ms=config["timer.tick.ms"], wheel_size=config["timer.wheel.size"], clock=self.clock
        )
        self.replica_manager = self._replica_manager()
        self.link = self._controller_link()
        self.fetchers = self._replica_fetchers()
        # Replication quotas: bound by the dynamic broker config (no limit by default).
        leader_quota, follower_quota = replication_quotas(broker_id, config, self.clock.now_ms)
        self.replica_manager.leader_quota = leader_quota
        self.fetchers.follower_quota = follower_quota
        self.fetchers.topic_configs = self.replica_manager.topic_configs.get
        self.isr_proposals = AlterPartitionManager(
            broker_id,
            self.replica_manager,
            self._to_controller,
            self.role.alter_partition,
            self.tasks,
            logger,
        )
        self.replica_manager.on_isr_change = self.isr_proposals.propose
        self.replica_manager.on_storage_error = self._log_dir_failed
        self.producer_ids = ProducerIdManager(self._allocate_producer_ids, self.tasks, logger)
        self._creating_topics: set[str] = set()  # internal topics asked for, one at a time
        self.coordinator = self._coordinator()
        self.transactions = self._transactions()
        self.replica_manager.txn_marker_listeners.append(self.coordinator.complete_txn)
        # Client quotas: their throttles end on the shared timer (broker/quota/throttle.py).
        self.quotas = ClientQuotas(
            self.timer,
            self.clock,
            samples=config["quota.window.num"],
            window_ms=config["quota.window.size.seconds"] * 1000,
        )
        self.publisher = MetadataPublisher(
            broker_id,
            self.cache,
            self.replica_manager,
            self.fetchers,
            logger,
            cannot_host=self._cannot_host,
            on_published=self._published,
        )
        handler = self._request_handler()
        self.connections = self._socket_server(handler)
        self.kafka_handler = KafkaRequestHandler(handler, self.cache, config, self.clock)
        self.kafka_codec = KafkaCodec(self.kafka_handler)

    # --- building -------------------------------------------------------------------------

    def _quorum_driver(self) -> QuorumDriver:
        """Every listed voter runs the metadata quorum; a lone broker is a one-voter quorum."""
        voters = self.voters or {self.broker_id: (self.me.host, self.me.port)}
        quorum = QuorumDriver(
            self.broker_id,
            voters,
            self.data_dir,
            self.clock,
            self.log,
            config=quorum_config(self.config),
            credentials=self.credentials,
            state_machine=self.image,
        )
        quorum.on_commit = self._metadata_committed
        quorum.on_leader_change = self._leader_changed
        quorum.on_active_change = self._active_changed
        quorum.on_caught_up = self._caught_up
        return quorum

    def _replica_manager(self) -> ReplicaManager:
        """Partitions and their purgatories; the timer's expiries reach the loop in ``run``."""
        config = self.config
        fetch = Purgatory(
            "Fetch", self.timer, purge_interval=config["fetch.purgatory.purge.interval.requests"]
        )
        produce = Purgatory(
            "Produce",
            self.timer,
            purge_interval=config["producer.purgatory.purge.interval.requests"],
        )
        return ReplicaManager(
            self.broker_id,
            self.data_dir,
            config,
            self.log,
            fetch,
            produce,
            now_ms=self.clock.now_ms,
        )

    def _controller_link(self) -> ControllerLink:
        return ControllerLink(
            self.me,
            self.voters,
            self.credentials,
            self.role,
            self.cache,
            self.tasks,
            heartbeat_interval_ms=self.config["broker.heartbeat.interval.ms"],
            logger=self.log,
        )

    def _replica_fetchers(self) -> ReplicaFetcherManager:
        fetch_purgatory = self.replica_manager.fetch_purgatory

        def follower_hw_changed(partition: Partition) -> None:
            fetch_purgatory.check_and_complete(partition.key)

        return ReplicaFetcherManager(
            self.broker_id,
            self.config,
            self.log,
            self.faults,
            self.credentials,
            follower_hw_changed,
            self.tasks,
            self.replica_manager.storage_failed,
        )

    def _coordinator_basis(self) -> dict[str, Any]:
        """What both coordinators stand on: the broker's log, replication, timer and view."""
        return {
            "broker_id": self.broker_id,
            "config": self.config,
            "logger": self.log,
            "replica_manager": self.replica_manager,
            "timer": self.timer,
            "tasks": self.tasks,
            "metadata": lambda: self.cache.metadata,
        }

    def _coordinator(self) -> CoordinatorService:
        """Consumer groups: its purgatories share the timer; __consumer_offsets on first use."""
        return CoordinatorService(
            **self._coordinator_basis(), create_offsets_topic=self._create_offsets_topic
        )

    def _transactions(self) -> TransactionService:
        """Transaction coordinator: its timeouts share the timer; __transaction_state on first
        use; new producer ids from the controller's blocks; markers over peer links."""
        return TransactionService(
            **self._coordinator_basis(),
            create_topic=self._create_internal_topic,
            new_producer_id=lambda: self.producer_ids.init_producer_id({}),
            send_markers=PeerMarkerSender(self.broker_id, self.credentials, self.cache),
        )

    def _published(self, md: Any) -> None:
        self.coordinator.on_metadata(md)
        self.transactions.on_metadata(md)

    def _create_offsets_topic(self, partitions: int, replication_factor: int) -> None:
        self._create_internal_topic("__consumer_offsets", partitions, replication_factor, {})

    def _create_internal_topic(
        self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]
    ) -> None:
        """Ask the controller for a coordinator's compacted internal topic (once at a time;
        FindCoordinator answers COORDINATOR_NOT_AVAILABLE meanwhile and the client retries)."""
        if name in self._creating_topics:
            return
        self._creating_topics.add(name)
        segment_key = (
            "offsets.topic.segment.bytes"
            if name == "__consumer_offsets"
            else "transaction.state.log.segment.bytes"
        )
        topic = {
            "name": name,
            "num_partitions": partitions,
            "replication_factor": replication_factor,
            "configs": {**offsets_topic_configs(self.config[segment_key]), **configs},
        }
        answer = self.link.create_topics([topic], False)

        def done(body: dict) -> None:
            self._creating_topics.discard(name)
            self.log.info("internal_topic_requested", topic=name, result=body.get("topics"))

        if isinstance(answer, PendingResponse):
            answer.add_done_callback(done)
        else:
            done(answer)

    async def _to_controller(self, api_key: int, body: dict, local: Callable) -> dict:
        """ISR proposals and producer-id blocks: to the active controller, wherever it is."""
        return await self.link.controller_call(api_key, body, local, timeout=10)

    async def _allocate_producer_ids(self) -> dict:
        return await self._to_controller(
            ApiKey.ALLOCATE_PRODUCER_IDS,
            {"broker_id": self.broker_id},
            self.role.allocate_producer_ids,
        )

    def _request_handler(self) -> RequestHandler:
        return RequestHandler(
            self.broker_id,
            self.config,
            self.log,
            cache=self.cache,
            replica_manager=self.replica_manager,
            role=self.role,
            link=self.link,
            quorum=self.quorum,
            authenticator=Authenticator(self.credentials, self.broker_id, self.log),
            producer_ids=self.producer_ids,
            faults=self.faults,
            deferral=RequestDeferral(
                self.tasks, self.cache.ready, self.cache.updated, log=self.log
            ),
            stats=self.stats,
            coordinator=self.coordinator,
            transactions=self.transactions,
            quotas=self.quotas,
        )

    def _socket_server(self, handler: RequestHandler) -> ConnectionHandler:
        config = self.config
        brokers = max(1, len(self.voters))
        problem = connections_error(config["max.connections"], brokers)
        if problem:
            raise ConfigError(problem)
        budget = descriptor_budget(brokers, config["max.connections"])
        partitions = self.replica_manager.partitions
        return ConnectionHandler(
            handler,
            max_frame_bytes=config["socket.request.max.bytes"],
            idle_ms=config["connections.max.idle.ms"],
            logger=self.log,
            max_connections=budget.connections,
            # Connections and partitions share the descriptors: what is open decides.
            connection_room=lambda: budget.connection_room(len(partitions)),
            max_connections_per_ip=config["max.connections.per.ip"],
            queued_response_bytes=config["queued.max.response.bytes"],
            send_stall_ms=config["connections.max.send.stall.ms"],
            metrics=self.request_metrics,
            poller=self.poller,
        )

    def load_state(self) -> None:
        """Read what must be sound before serving; raises one-line errors (corrupt metadata).
        ``run_broker`` calls it before trio starts; ``run`` only if nobody did."""
        if not self.quorum.loaded:
            self.quorum.load()
            # A data dir from before the quorum: its controller's file (broker 0's, which
            # stands first in a new quorum) is imported by whichever voter holding one
            # becomes active while the log has no topics. Corrupt: one line, no start.
            self.role.legacy = load_metadata(self.data_dir / METADATA_FILE)

    # --- metadata -------------------------------------------------------------------------

    def _metadata_committed(self) -> None:
        """Every voter takes the roles each commit gives it (in slices: metadata_publisher)."""
        self.publisher.publish(self.image.metadata.copy())
        self.quotas.sync(self.image.metadata.client_quotas)

    def _caught_up(self) -> None:
        self.publisher.caught_up()

    def _leader_changed(self, effect: LeaderChanged) -> None:
        self.cache.controller_changed(effect.leader_id if effect.leader_id is not None else -1)

    def _active_changed(self, active: bool) -> None:
        """Quorum leader with its epoch committed: the controller role, built from the image."""
        if active:
            self.cache.controller_changed(self.broker_id)
            self.role.activate(self.image.metadata, self.quorum.append_and_answer)
        else:
            self.role.deactivate()
        self.cache.wake_controller_waiters()

    def _log_dir_failed(self, exc: OSError, during: str) -> None:
        """Take the data dir offline after a failed write, once, and say why everywhere.

        Kafka's answer to an IOException in a log dir: its replicas stop. Followers
        stop fetching (so their leaders shrink the ISR at replica.lag.time.max.ms rather
        than count a replica that stores nothing), appends here answer
        KAFKA_STORAGE_ERROR, and `minibroker stats` / `cluster status` name the dir and
        the error. Nothing is acknowledged from here any more, so nothing acknowledged
        is lost. The broker's own log is likely on the same disk: the line also goes to
        the process's stderr, the one place that may still take it.
        """
        rm = self.replica_manager
        if rm.offline_reason is not None:
            return
        code = errno.errorcode.get(exc.errno or 0, "")
        reason = (
            f"log dir {self.data_dir} is offline: {exc.strerror or exc} ({code}) while {during}"
        )
        rm.offline_reason = reason
        self.log.critical(
            "log_dir_offline",
            log_dir=str(self.data_dir),
            error=exc.strerror or str(exc),
            errno=code,
            during=during,
            hint="free space or fix the disk, then restart this broker",
        )
        write_fatal_line(
            f"broker {self.broker_id}: {reason}; free space or fix the disk, then restart it"
        )
        self.fetchers.stop_all()

    def _cannot_host(self, topic: str, index: int, exc: OSError) -> None:
        """A replica whose files cannot be opened is not hosted; the broker goes on.

        Out of descriptors (EMFILE) means the partition cap was passed by hand or the
        limit lowered under a running cluster: this replica stays offline, named in the
        log with the limit, and is opened by the next metadata change that finds room.
        """
        self.log.error(
            "partition_not_opened",
            topic=topic,
            partition=index,
            error=exc.strerror or str(exc),
            errno=errno.errorcode.get(exc.errno or 0, exc.errno),
            fd_limit=fd_limit(),
        )

    def stats(self) -> dict:
        rm = self.replica_manager
        return {
            "uptime_ms": self.clock.now_ms() - self.started_ms,
            "log_lines_dropped": log_lines_dropped(),
            "controller_id": self.cache.controller_id,
            "metadata_epoch": self.cache.metadata.epoch,
            "quorum": self.quorum.stats(),
            "connections": self.connections.open_connections,
            "descriptors": {
                "limit": fd_limit(),
                "raised_from": self.fd_limit_raised_from,
                "connection_room": self.connections.connection_room(),
                "partitions_open": len(rm.partitions),
            },
            # Kafka's log dirs (one here): which failed and why (see _log_dir_failed).
            "log_dirs": [
                {
                    "dir": str(self.data_dir),
                    "online": rm.offline_reason is None,
                    "error": rm.offline_reason,
                }
            ],
            "connections_muted": self.connections.muted_connections,
            "connections_throttled": self.connections.throttled_connections,
            "quotas": {
                **self.quotas.stats(),
                "replication": {
                    side: q.stats()
                    for side, q in (
                        ("leader", self.replica_manager.leader_quota),
                        ("follower", self.fetchers.follower_quota),
                    )
                    if q is not None
                },
            },
            "poller": self.poller,
            "timer": {"thread_cpu_s": round(self.timer.thread_cpu_s(), 4)},
            "purgatory": {
                "produce": rm.produce_purgatory.stats(),
                "fetch": rm.fetch_purgatory.stats(),
            },
            "requests": self.request_metrics.snapshot(),
            "groups": self.coordinator.stats(),
            "transactions": self.transactions.stats(),
            # The Kafka listener's incremental fetch sessions (KIP-227).
            "fetch_sessions": self.kafka_handler.fetch_sessions.stats(),
            # Followers' sessions on this leader (broker/replication/fetch_sessions.py).
            "replica_fetch_sessions": rm.fetch_sessions.stats(),
            "log_cleaner": rm.cleaner.stats() if rm.cleaner is not None else None,
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

    def _start_timer(self) -> None:
        """Expired ops cross into the trio thread in one batch per timer wake-up."""
        token = trio.lowlevel.current_trio_token()
        for purgatory in (
            self.replica_manager.fetch_purgatory,
            self.replica_manager.produce_purgatory,
            *self.coordinator.purgatories.values(),
            *self.transactions.purgatories.values(),
        ):
            purgatory.set_expiry_handoff(_to_loop(token, purgatory))
        throttler = self.quotas.throttler
        throttler.set_expiry_handoff(_to_loop(token, throttler))
        self.timer.start()

    def _serve_metrics(self) -> Any:
        """The Prometheus endpoint (metrics.port), or None when it is off."""
        port = self.config["metrics.port"]
        if not port:
            return None
        # Imported only when asked for: prometheus-client costs every broker ~4 MB.
        from minibroker.broker.prometheus_export import BrokerCollector, serve_metrics

        collector = BrokerCollector(
            self.broker_id,
            self.request_metrics,
            self.replica_manager,
            self.connections,
            self.quotas,
        )
        return serve_metrics(collector, port)

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        self._start_timer()
        metrics_server = None
        try:
            # Bind before any task starts, so "address in use" surfaces as a plain OSError.
            listeners = await trio.open_tcp_listeners(self.me.port, host=self.me.host)
            coded = []
            if self.kafka_address:
                host, port = self.kafka_address
                try:
                    opened = await trio.open_tcp_listeners(port, host=host)
                except OSError as exc:
                    raise ListenerBindError("kafka.listener", host, port, exc) from exc
                coded = [(k, self.kafka_codec) for k in opened]
            metrics_server = self._serve_metrics()
            async with trio.open_nursery() as nursery:
                await nursery.start(self.tasks.run)
                nursery.start_soon(self.connections.serve, listeners, coded)
                self.load_state()
                nursery.start_soon(self.publisher.run)
                await nursery.start(self.quorum.run)
                nursery.start_soon(self.link.run)
                nursery.start_soon(
                    run_housekeeping, self.replica_manager, self.config, self.clock, self.log
                )
                nursery.start_soon(self._prefetch_producer_ids)
                nursery.start_soon(self.coordinator.expiry.run)
                nursery.start_soon(self.transactions.run)
                nursery.start_soon(self.role.fence_silent_brokers)
                rebalancer = LeaderRebalancer(self.config, self.clock)
                nursery.start_soon(rebalancer.run, lambda: self.role.controller)
                self.log.info(
                    "broker_started",
                    host=self.me.host,
                    port=self.me.port,
                    kafka_listener=self.config["kafka.listener"] or None,
                    data_dir=str(self.data_dir),
                    pid=os.getpid(),
                    controller=self.cache.controller_id,
                    startup_ms=self.clock.now_ms() - self.started_ms,
                )
                task_status.started()
        finally:
            if metrics_server is not None:
                metrics_server.shutdown()
            self.timer.shutdown()
            self.replica_manager.close()
            self.log.info("broker_stopped")

    async def controlled_shutdown(self) -> None:
        """Tell the controller we are going, so leaders move at once (best effort)."""
        await self.quorum.resign(timeout=1)
        controller_id = self.cache.controller_id
        if controller_id < 0 or controller_id == self.broker_id:
            return
        with trio.move_on_after(2):
            try:
                await self.link.request(
                    controller_id,
                    ApiKey.BROKER_HEARTBEAT,
                    {
                        "broker_id": self.broker_id,
                        "metadata_epoch": self.cache.metadata.epoch,
                        "shutting_down": True,
                    },
                )
            except KafkaError as exc:
                self.log.warning("controlled_shutdown_failed", error=str(exc))

    async def _prefetch_producer_ids(self) -> None:
        await self.cache.ready.wait()
        self.producer_ids.prefetch()


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


def run_broker(
    broker_id: int, host: str, port: int, data_dir: Path, config: BrokerConfig, logger: Any
) -> None:
    raised_from, limit = raise_fd_limit()
    broker = Broker(broker_id, host, port, data_dir, config, logger)
    broker.fd_limit_raised_from = raised_from
    if raised_from != limit:
        logger.info("fd_limit_raised", soft_before=raised_from, soft=limit)
    # The timer thread must not wait 5 ms (CPython's default) for the GIL while the trio
    # thread is busy: that would be 5 ms of lateness on every timeout.
    sys.setswitchinterval(switch_interval_for(config["timer.tick.ms"]))
    fd, clean = open_data_dir(data_dir)
    try:
        broker.replica_manager.load_recovery_points(clean)
        broker.load_state()
        collect_garbage_rarely()
        trio.run(serve, broker)
        mark_clean_shutdown(data_dir)  # only a shutdown that got this far was clean
    finally:
        os.close(fd)
