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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from protocol import ApiKey
from protocol.errors import ErrorCode, KafkaError

from .apis import RequestHandler
from .cluster_auth import Authenticator, ClusterCredentials, SecretFileError, load_credentials
from .config import BrokerConfig, ConfigError
from .controller import METADATA_FILE, Controller
from .faults import FaultInjector
from .membership import ControllerLink, VotersError, parse_voters
from .metadata import BrokerInfo, ClusterMetadata, epoch_regression, load_metadata
from .metadata_check import MetadataError
from .metadata_records import MetadataImage
from .network import ConnectionHandler, max_connections_for
from .partition import Partition
from .pending import PendingResponse
from .purgatory import MonotonicClock, Purgatory, SystemTimer, switch_interval_for
from .quorum import QuorumConfig
from .quorum_driver import QuorumDriver
from .replica_fetcher import ReplicaFetcher
from .replica_manager import ReplicaManager

# A client request held for the metadata catch-up (after_catch_up) waits at most this long,
# then is answered from what the broker knows: below a client's default request timeout.
CATCH_UP_WAIT_S = 25


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
        # The active controller is whichever voter leads the metadata quorum with its epoch
        # committed (KRaft): both follow the quorum (_leader_changed, _active_changed).
        self.controller_id = -1
        self.is_controller = False
        self.activated_ms = 0
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
        self.heartbeats: dict[int, int] = {}
        self._isr_in_flight: set[tuple[str, int]] = set()
        self.image: MetadataImage | None = None
        self.leader_known = trio.Event()  # set (and replaced) whenever the controller changes
        # Set once this broker's metadata has caught up with the quorum after its start:
        # until then client requests wait (apis.WAIT_FOR_METADATA).
        self.metadata_ready = trio.Event()
        self.legacy_metadata: ClusterMetadata | None = None
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
            self.legacy_metadata = load_metadata(self.data_dir / METADATA_FILE)

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

    def _active_changed(self, active: bool) -> None:
        """Quorum leader with its epoch committed: build the controller from the image."""
        if active:
            self.controller_id = self.broker_id
            self.controller = Controller(
                self.broker_id,
                self.config,
                self.log,
                self.image.metadata.copy(),
                self.quorum.append_and_answer,
            )
            # Every broker gets a full session from now: a new controller does not fence
            # brokers whose heartbeats went to the old one.
            self.heartbeats = {}
            self.activated_ms = self.clock.now_ms()
            self.is_controller = True
            self.controller.register_broker(
                BrokerInfo(self.broker_id, self.host, self.port), {"error_code": 0}
            )
            if self.legacy_metadata is not None and not self.image.metadata.topics:
                self.controller.import_legacy(self.legacy_metadata)
                self.log.info(
                    "legacy_metadata_imported",
                    file=METADATA_FILE,
                    topics=sorted(self.legacy_metadata.topics),
                )
        else:
            self.controller = None
            self.is_controller = False
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
        self.metadata_ready.set()  # a broker outside the quorum: the controller's snapshot

    # --- controller-bound requests ----------------------------------------------------------

    def create_topics(
        self, topics: list[dict], validate_only: bool, *, forwarded: bool = False
    ) -> dict | PendingResponse:
        """``{"topics": results}``. A client's request goes to the active controller (here or
        forwarded), retried on the next one after NOT_CONTROLLER; a forwarded one is answered
        here or refused, never forwarded again (no loops while the brokers disagree)."""
        body = {"topics": topics, "validate_only": validate_only}
        if forwarded:
            if self.controller is None:
                return self._not_controller_topics(topics)
            return self.controller.create_topics(topics, validate_only)
        pending = PendingResponse()

        async def call() -> None:
            answer = await self.controller_call(
                ApiKey.CREATE_TOPICS,
                body,
                lambda b: self.controller.create_topics(b["topics"], b["validate_only"]),
                timeout=30,
            )
            if "topics" not in answer:
                answer = self._not_controller_topics(topics, answer)
            pending.set(answer)

        self.nursery.start_soon(call)
        return pending

    def _not_controller_topics(self, topics: list[dict], error: dict | None = None) -> dict:
        error = error or {
            "error_code": int(ErrorCode.NOT_CONTROLLER),
            "error_message": f"broker {self.broker_id} is not the controller "
            f"(the controller is {self.controller_id})",
        }
        return {
            "topics": [
                {
                    "name": t["name"],
                    "error_code": error["error_code"],
                    "error_message": error.get("error_message"),
                    "num_partitions": t["num_partitions"],
                    "replication_factor": t["replication_factor"],
                }
                for t in topics
            ]
        }

    async def controller_call(
        self, api_key: int, body: dict, local: Callable[[dict], Any], *, timeout: float
    ) -> dict:
        """Ask the active controller, whoever it is now: locally when it is this broker,
        else over the link; NOT_CONTROLLER or an unreachable controller means wait for the
        quorum to name the next one and ask again, until ``timeout``."""
        answer: dict = {"error_code": int(ErrorCode.NOT_CONTROLLER), "error_message": None}
        with trio.move_on_after(timeout):
            while True:
                unreachable = False
                try:
                    if self.controller is not None:
                        answer = local(body)
                        if isinstance(answer, PendingResponse):
                            answer = await answer.wait()
                    elif self.controller_id >= 0 and self.controller_id != self.broker_id:
                        answer = await self.link.request(self.controller_id, api_key, body)
                    else:
                        answer = {
                            "error_code": int(ErrorCode.NOT_CONTROLLER),
                            "error_message": "no active controller yet",
                        }
                except KafkaError as exc:
                    unreachable = True
                    answer = {
                        "error_code": int(exc.code),
                        "error_message": f"controller unreachable: {exc}",
                    }
                code = answer.get("error_code", 0)
                topic_codes = {t["error_code"] for t in answer.get("topics", [])}
                if not (
                    unreachable
                    or code == ErrorCode.NOT_CONTROLLER
                    or ErrorCode.NOT_CONTROLLER in topic_codes
                ):
                    return answer
                with trio.move_on_after(0.2):
                    await self.leader_known.wait()
                await trio.sleep(0.02)
        return answer

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
        self.create_topics(
            [
                {"name": n, "num_partitions": -1, "replication_factor": -1, "configs": {}}
                for n in names
            ],
            False,
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
        self._isr_in_flight.add(key)

        async def send() -> None:
            try:
                answer = await self.controller_call(
                    ApiKey.ALTER_PARTITION, request, self._alter_partition_here, timeout=10
                )
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
            finally:
                self._isr_in_flight.discard(key)

        self.nursery.start_soon(send)

    async def _isr_shrink_loop(self) -> None:
        lag = self.config["replica.lag.time.max.ms"]
        while True:
            await trio.sleep(max(lag / 2, 10) / 1000)
            self.replica_manager.maybe_shrink_isr(self.clock.now_ms(), lag)

    def _alter_partition_here(self, request: dict) -> dict | PendingResponse:
        return self.controller.alter_partition(request)

    def register_broker(self, body: dict) -> dict | PendingResponse:
        if not body["host"] or body["port"] < 1:
            # Never let a registration make the metadata one that brokers (or this
            # controller, at its next start) would refuse to load.
            return {
                "error_code": int(ErrorCode.INVALID_REQUEST),
                "error_message": f"cannot register {body['host']!r}:{body['port']}",
            }
        self.heartbeats[body["broker_id"]] = self.clock.now_ms()
        # Voters get metadata from the quorum itself; the answer carries none.
        return self.controller.register_broker(
            BrokerInfo(body["broker_id"], body["host"], body["port"]),
            {"error_code": 0, "metadata": None},
        )

    def heartbeat(self, body: dict) -> dict | PendingResponse:
        broker_id = body["broker_id"]
        if body.get("shutting_down"):
            # Controlled shutdown: move leadership now instead of after the session timeout.
            self.heartbeats.pop(broker_id, None)
            return self.controller.fence(
                broker_id, "controlled_shutdown", {"error_code": 0, "metadata": None}
            )
        self.heartbeats[broker_id] = self.clock.now_ms()
        return self.controller.broker_alive(broker_id, {"error_code": 0, "metadata": None})

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
                self.apply_metadata(self.metadata)
                if self.quorum is not None:
                    await nursery.start(self.quorum.run)
                self.link = ControllerLink(self)
                nursery.start_soon(self.link.run)
                nursery.start_soon(self._retention_loop)
                nursery.start_soon(self._isr_shrink_loop)
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
        while True:
            await trio.sleep(min(timeout / 4, 250) / 1000)
            if self.controller is None:
                continue  # fencing runs only on the active controller
            now = self.clock.now_ms()
            for broker_id in list(self.controller.metadata.live):
                if broker_id == self.broker_id:
                    continue
                last = self.heartbeats.get(broker_id, self.activated_ms)
                if now - last > timeout:
                    self.controller.fence(broker_id, reason=f"no heartbeat for {now - last} ms")

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
