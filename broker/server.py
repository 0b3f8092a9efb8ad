"""A broker process: wires storage, purgatories, the controller role and the network together.

Threads: the trio loop (network, handlers, replica fetchers, completions) and the
timer thread that owns the timing wheels. Expired operations cross back into the
loop in batches through the trio token, so completion and expiration callbacks all
run on one thread.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from protocol import ApiKey
from protocol.errors import ErrorCode, KafkaError

from .apis import RequestHandler
from .cluster_auth import Authenticator, ClusterCredentials, SecretFileError, load_credentials
from .config import BrokerConfig, ConfigError
from .controller import Controller, MetadataPersistError
from .faults import FaultInjector
from .membership import ControllerLink, MetadataPusher, VotersError, parse_voters
from .metadata import BrokerInfo, ClusterMetadata, epoch_regression
from .metadata_check import MetadataError
from .network import ConnectionHandler, max_connections_for
from .partition import Partition
from .pending import PendingResponse
from .purgatory import MonotonicClock, Purgatory, SystemTimer, switch_interval_for
from .quorum import QuorumConfig
from .quorum_driver import QuorumDriver
from .replica_fetcher import ReplicaFetcher
from .replica_manager import ReplicaManager


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
        configured = config["controller.id"]
        self.controller_id = configured if configured >= 0 else min(self.voters, default=broker_id)
        self.is_controller = self.controller_id == broker_id
        if not self.is_controller and self.controller_id not in self.voters:
            raise ConfigError(
                f"controller.id {self.controller_id} is not in controller.quorum.voters"
            )
        self.credentials = self._credentials(broker_id, config)
        self.authenticator = Authenticator(self.credentials, broker_id, logger)
        self.timer: SystemTimer | None = None
        self.replica_manager: ReplicaManager | None = None
        self.controller: Controller | None = None
        self.quorum: QuorumDriver | None = None
        self.link: ControllerLink | None = None
        self.connections: ConnectionHandler | None = None
        self.nursery: trio.Nursery | None = None
        self.fetchers: dict[tuple[str, int], ReplicaFetcher] = {}
        self.pushers: dict[int, MetadataPusher] = {}
        self.heartbeats: dict[int, int] = {}
        self._isr_in_flight: set[tuple[str, int]] = set()
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
        if self.quorum is None and (not self.voters or self.broker_id in self.voters):
            # A broker outside the voter set would be a KRaft observer: not modelled yet.
            self.quorum = self._quorum_driver()
            self.quorum.load()
        if self.is_controller and self.controller is None:
            self.controller = Controller(
                self.broker_id, self.data_dir, self.config, self.log, self.publish
            )
            self.controller.register_self(BrokerInfo(self.broker_id, self.host, self.port))

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
        )

    # --- metadata -------------------------------------------------------------------------

    def apply_metadata(self, md: ClusterMetadata) -> None:
        """Take the roles a metadata snapshot gives this broker; start/stop replica fetchers."""
        self.metadata = md
        rm = self.replica_manager
        wanted: set[tuple[str, int]] = set()
        for name, topic in md.topics.items():
            rm.topic_configs[name] = topic.configs
            for index, state in enumerate(topic.partitions):
                if self.broker_id not in state.replicas:
                    continue
                partition = rm.host_partition(name, index, state)
                if not partition.is_leader and state.leader in md.brokers:
                    wanted.add(partition.key)
                    self._ensure_fetcher(partition, md.brokers[state.leader])
        for key in list(self.fetchers):
            if key not in wanted:
                self.fetchers.pop(key).cancel_scope.cancel()

    def _ensure_fetcher(self, partition: Partition, leader: BrokerInfo) -> None:
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
            self._follower_hw_changed,
            self.faults,
            self.credentials,
        )
        self.fetchers[partition.key] = fetcher
        self.nursery.start_soon(fetcher.run)

    def _follower_hw_changed(self, partition: Partition) -> None:
        self.replica_manager.fetch_purgatory.check_and_complete(partition.key)

    def receive_metadata(self, snapshot: dict) -> None:
        """A snapshot pushed by (or pulled from) the controller; older epochs are ignored.

        Checked before anything acts on it, even though the sender authenticated: topic
        names (they become directories), replica ids, and epochs that must not go back.
        Raises MetadataError naming the problem; the current metadata stays.
        """
        if snapshot["epoch"] <= self.metadata.epoch:
            return
        md = ClusterMetadata.parse(snapshot)
        if md.controller_id != self.controller_id:
            raise MetadataError(
                f"snapshot from controller {md.controller_id}, but the controller is "
                f"{self.controller_id}"
            )
        if (problem := epoch_regression(self.metadata, md)) is not None:
            raise MetadataError(problem)
        self.apply_metadata(md)

    def publish(self, md: ClusterMetadata) -> None:
        """Controller: apply locally, then push to every other registered broker."""
        self.apply_metadata(md)
        snapshot = md.to_json()
        for node_id, info in md.brokers.items():
            if node_id == self.broker_id:
                continue
            pusher = self.pushers.get(node_id)
            if pusher is None or pusher.target != info:
                pusher = self.pushers[node_id] = MetadataPusher(
                    info, self.broker_id, self.log, self.credentials
                )
                self.nursery.start_soon(pusher.run)
            pusher.offer(snapshot)

    # --- controller-bound requests ----------------------------------------------------------

    def create_topics(
        self, topics: list[dict], validate_only: bool
    ) -> list[dict] | PendingResponse:
        if self.is_controller:
            return self.controller.create_topics(topics, validate_only)
        return self._forward(
            ApiKey.CREATE_TOPICS, {"topics": topics, "validate_only": validate_only}
        )

    def _forward(self, api_key: int, body: dict) -> PendingResponse:
        pending = PendingResponse()

        async def forward() -> None:
            try:
                pending.set(await self.link.forward(api_key, body))
            except KafkaError as exc:
                pending.set(
                    {"error_code": int(exc.code), "error_message": f"controller unreachable: {exc}"}
                )

        self.nursery.start_soon(forward)
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
        if self.is_controller:
            self.controller.create_topics(
                [
                    {"name": n, "num_partitions": -1, "replication_factor": -1, "configs": {}}
                    for n in names
                ]
            )

    def propose_isr(self, partition: Partition, new_isr: list[int]) -> None:
        """Leader: ask the controller to change the ISR; one proposal in flight per partition."""
        key = partition.key
        if key in self._isr_in_flight:
            return
        request = {
            "broker_id": self.broker_id,
            "topic": partition.topic,
            "partition": partition.index,
            "leader_epoch": partition.leader_epoch,
            "partition_epoch": partition.partition_epoch,
            "new_isr": new_isr,
        }
        if self.is_controller:
            if self.controller.alter_partition(request).get("error_code"):
                self.replica_manager.isr_proposal_ended(partition)
            return
        self._isr_in_flight.add(key)

        async def send() -> None:
            try:
                answer = await self.link.alter_partition(request)
                if answer.get("error_code") == 0:
                    self.replica_manager.isr_update_accepted(
                        partition, request["leader_epoch"], answer["isr"], answer["partition_epoch"]
                    )
                else:
                    # Rejected (stale partition epoch, fenced leader): the metadata push
                    # brings the current state, and the next follower fetch proposes again.
                    self.replica_manager.isr_proposal_ended(partition)
                    self.log.info(
                        "alter_partition_rejected",
                        topic=key[0],
                        partition=key[1],
                        error=answer.get("error_message"),
                    )
            except KafkaError as exc:
                self.replica_manager.isr_proposal_ended(partition)
                self.log.warning(
                    "alter_partition_failed", topic=key[0], partition=key[1], error=str(exc)
                )
            finally:
                self._isr_in_flight.discard(key)

        self.nursery.start_soon(send)

    async def _isr_shrink_loop(self) -> None:
        lag = self.config["replica.lag.time.max.ms"]
        while True:
            await trio.sleep(max(lag / 2, 10) / 1000)
            self.replica_manager.maybe_shrink_isr(self.clock.now_ms(), lag)

    def register_broker(self, body: dict) -> dict:
        if not body["host"] or body["port"] < 1:
            # Never let a registration make the metadata one that brokers (or this
            # controller, at its next start) would refuse to load.
            return {
                "error_code": int(ErrorCode.INVALID_REQUEST),
                "error_message": f"cannot register {body['host']!r}:{body['port']}",
            }
        try:
            self.controller.register_broker(
                BrokerInfo(body["broker_id"], body["host"], body["port"])
            )
        except MetadataPersistError as exc:
            return {"error_code": int(exc.code), "error_message": exc.message}
        self.heartbeats[body["broker_id"]] = self.clock.now_ms()
        return {"error_code": 0, "metadata": self.controller.metadata.to_json()}

    def heartbeat(self, body: dict) -> dict:
        broker_id = body["broker_id"]
        try:
            if body["shutting_down"]:
                # Controlled shutdown: move leadership now instead of after the session timeout.
                self.controller.fence(broker_id, reason="controlled_shutdown")
                self.heartbeats.pop(broker_id, None)
                return {"error_code": 0, "metadata": None}
            self.heartbeats[broker_id] = self.clock.now_ms()
            self.controller.broker_alive(broker_id)
        except MetadataPersistError as exc:
            return {"error_code": int(exc.code), "error_message": exc.message}
        md = self.controller.metadata
        newer = md.to_json() if body["metadata_epoch"] < md.epoch else None
        return {"error_code": 0, "metadata": newer}

    def stats(self) -> dict:
        rm = self.replica_manager
        return {
            "uptime_ms": self.clock.now_ms() - self.started_ms,
            "controller_id": self.controller_id,
            "metadata_epoch": self.metadata.epoch,
            "quorum": self.quorum.stats() if self.quorum else {},
            "connections": self.connections.open_connections if self.connections else 0,
            "purgatory": {
                "produce": rm.produce_purgatory.stats(),
                "fetch": rm.fetch_purgatory.stats(),
            },
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
        self.replica_manager.on_isr_change = self.propose_isr
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
            )
            # Bind before any task starts, so "address in use" surfaces as a plain OSError.
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                nursery.start_soon(self.connections.serve, listeners)
                self.load_state()
                if self.quorum is not None:
                    await nursery.start(self.quorum.run)
                if self.is_controller:
                    self.apply_metadata(self.controller.metadata)
                else:
                    host, port = self.voters[self.controller_id]
                    self.link = ControllerLink(self, host, port)
                    await nursery.start(self.link.run)
                nursery.start_soon(self._retention_loop)
                nursery.start_soon(self._isr_shrink_loop)
                if self.is_controller:
                    nursery.start_soon(self._session_loop)
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
            self.timer.shutdown()
            self.replica_manager.close()
            self.log.info("broker_stopped")

    async def _session_loop(self) -> None:
        """Controller: fence brokers whose heartbeats stopped for broker.session.timeout.ms."""
        timeout = self.config["broker.session.timeout.ms"]
        started = self.clock.now_ms()
        while True:
            await trio.sleep(min(timeout / 4, 250) / 1000)
            now = self.clock.now_ms()
            md = self.controller.metadata
            for broker_id in list(md.live):
                if broker_id == self.broker_id:
                    continue
                last = self.heartbeats.get(broker_id, started)
                if now - last > timeout:
                    try:
                        self.controller.fence(broker_id, reason=f"no heartbeat for {now - last} ms")
                    except MetadataPersistError:
                        pass  # logged by the controller; tried again next round

    async def controlled_shutdown(self) -> None:
        """Tell the controller we are going, so leaders move at once (best effort)."""
        if self.quorum is not None:
            await self.quorum.resign(timeout=1)
        if self.link is None:
            return
        with trio.move_on_after(2):
            try:
                await self.link.conn.request(
                    ApiKey.BROKER_HEARTBEAT,
                    {
                        "broker_id": self.broker_id,
                        "metadata_epoch": self.metadata.epoch,
                        "shutting_down": True,
                    },
                    timeout=2,
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
    broker = Broker(broker_id, host, port, data_dir, config, logger)
    # The timer thread must not wait 5 ms (CPython's default) for the GIL while the trio
    # thread is busy: that would be 5 ms of lateness on every timeout.
    sys.setswitchinterval(switch_interval_for(config["timer.tick.ms"]))
    fd = lock_data_dir(data_dir)
    try:
        broker.load_state()
        trio.run(serve, broker)
    finally:
        os.close(fd)
