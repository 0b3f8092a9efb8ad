"""pytest plugin: a real local minibroker cluster per test, with faults in one line.

Installed with the package (entry point ``pytest11``), so a project that depends on
minibroker gets these fixtures without a conftest:

- ``minibroker_cluster``: a running cluster (3 brokers, ``faults.enable=true``) for the
  test, stopped afterwards. Shape it with ``@pytest.mark.minibroker(brokers=..., config={...})``.
- ``minibroker_cluster_factory``: ``start(brokers=3, config=None)`` for tests that want
  several clusters or to start one midway.
- ``minibroker_shared_cluster``: one cluster (3 brokers, ``faults.enable=true``) for the
  whole session, put back after each test with :meth:`LocalCluster.reset` (faults
  cleared, paused brokers resumed, stopped or killed ones restarted, the test's topics
  deleted): for suites that prefer speed over isolation.

Both hand out a :class:`LocalCluster`: the bootstrap address for your clients, process
control (pause/resume/kill/restart), the fault-injection API (network partitions
included: ``isolate``), and waits on metadata.

Its methods block. Each runs its network calls in its own trio loop on a worker thread,
so they work in plain tests and inside trio tests alike; in a trio test they hold up the
test's loop while they run, so wrap a long wait in ``trio.to_thread.run_sync`` if tasks
of your own (a producer, say) must keep going meanwhile.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from minibroker.client import Admin, NewTopic, PartitionInfo
from minibroker.deploy import isolation
from minibroker.deploy.cluster import ClusterState
from minibroker.deploy.cluster_ops import HEALTH_TOPIC, acks_all_write
from minibroker.deploy.launcher import configured_ports, free_port_range, port_in_use
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, KafkaError

T = TypeVar("T")

DEFAULT_CONFIG: Mapping[str, Any] = {"faults.enable": True}


def run_blocking(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run an async function to completion in a fresh trio loop on a worker thread.

    A thread, not ``trio.run`` here: the caller may itself be inside a trio loop
    (a pytest-trio test), where a nested ``trio.run`` is refused.
    """
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append((True, trio.run(fn, *args)))
        except BaseException as exc:
            outcome.append((False, exc))

    worker = threading.Thread(target=target, name="minibroker-testing", daemon=True)
    worker.start()
    worker.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _config_strings(config: Mapping[str, Any]) -> dict[str, str]:
    """Broker config as the launcher passes it: ``True`` -> ``"true"``."""
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in config.items()}


def _api_key(api: int | str) -> int:
    return int(api) if isinstance(api, int) else int(ApiKey[api.upper().replace("-", "_")])


def _error_code(error: int | str) -> int:
    return int(error) if isinstance(error, int) else int(ErrorCode[error.upper()])


class LocalCluster:
    """A running local cluster: broker ``i`` listens on ``127.0.0.1:(base_port + i)``."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        # Brokers this handle paused or cut off: any broker may be the controller or a
        # follower, and one that cannot answer (or only with stale metadata) must not be
        # the address the handle's own reads and new clients start from.
        self.impaired: set[int] = set()

    @property
    def bootstrap(self) -> str:
        """Every broker's address, less those this handle paused or isolated."""
        healthy = [b for b in range(self.brokers) if b not in self.impaired]
        return ",".join(self.address(b) for b in healthy) or self.state.bootstrap

    @property
    def brokers(self) -> int:
        return self.state.brokers

    @property
    def kafka_bootstrap(self) -> str:
        """bootstrap.servers for stock Kafka clients (confluent-kafka, kafka-python,
        aiokafka, kcat), less the brokers this handle paused or isolated."""
        healthy = [b for b in range(self.brokers) if b not in self.impaired]
        return (
            ",".join(f"{self.state.host}:{self.state.kafka_base_port + b}" for b in healthy)
            or self.state.kafka_bootstrap
        )

    @property
    def data_dir(self) -> Path:
        return self.state.data_dir

    @property
    def controller(self) -> int:
        """The active controller's id, as the cluster's metadata names it now."""

        async def ask(admin: Admin) -> int:
            return (await admin.describe_cluster())[1]

        return self._admin(ask)

    def address(self, broker_id: int) -> str:
        """One broker's address: a client bootstrapped here still learns the whole cluster."""
        self.state.check_id(broker_id)
        return f"{self.state.host}:{self.state.port(broker_id)}"

    # --- processes ---------------------------------------------------------------------

    def pause(self, broker_id: int) -> None:
        """SIGSTOP: the broker holds its sockets but answers nothing (a stalled JVM, a GC).
        Returns once it shows as paused (every thread of a busy process stops a bit later)."""
        self.state.signal(broker_id, signal.SIGSTOP)
        self.impaired.add(broker_id)
        deadline = time.monotonic() + 10
        while self.state.status_of(broker_id) == "alive" and time.monotonic() < deadline:
            time.sleep(0.001)

    def resume(self, broker_id: int) -> None:
        self.state.signal(broker_id, signal.SIGCONT)
        self.impaired.discard(broker_id)

    def kill(self, broker_id: int) -> None:
        """SIGKILL: no clean shutdown, no flush beyond what the broker already did."""
        self.state.kill(broker_id)

    def stop(self, broker_id: int) -> None:
        """SIGTERM: a controlled shutdown (leadership moves at once)."""
        self.state.check_id(broker_id)
        self.state.stop(broker_id)

    def restart(self, broker_id: int) -> None:
        """Start the broker again on its data (stopping it first if it runs); wait for it."""
        self.state.restart(broker_id)

    def status(self, broker_id: int) -> str:
        """``alive``, ``paused``, or not running: ``stopped`` (cleanly) or ``dead``
        (killed or crashed)."""
        self.state.check_id(broker_id)
        return self.state.status_of(broker_id)

    def close(self) -> None:
        self.state.stop_all()

    def reset(self, keep: Iterable[str] = ()) -> None:
        """Back to a fresh cluster for the next test: paused brokers resumed, stopped or
        killed ones restarted, every fault cleared, every topic deleted but ``keep`` (and
        minibroker's own), every broker back in sync. What a shared cluster runs between
        tests (``minibroker_shared_cluster``)."""
        statuses = {b: self.state.status_of(b) for b in range(self.brokers)}
        down = ("stopped", "dead")
        for broker_id, status in statuses.items():
            if status not in down:
                # Paused or not: a SIGSTOP just sent may not show in the status yet.
                self.state.signal(broker_id, signal.SIGCONT)
        for broker_id, status in statuses.items():
            if status in down:
                self._wait_port_free(broker_id)
                self.state.restart(broker_id)
        self.impaired.clear()
        kept = {HEALTH_TOPIC, *keep}

        async def clean(admin: Admin) -> None:
            _, errors = await isolation.clear(admin, None, range(self.brokers))
            if errors:
                raise next(iter(errors.values()))
            doomed = [t for t in await admin.list_topics() if t not in kept]
            if doomed:
                # A broker that was down may still list a topic the controller deleted.
                outcome = await admin.delete_topics(doomed, raise_errors=False)
                for error in outcome.values():
                    if error is not None and error.code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                        raise error

        self._admin(clean)
        # A restarted broker is back once it is in sync on the health topic again.
        self.wait_for_isr(HEALTH_TOPIC, timeout=30)

    def _wait_port_free(self, broker_id: int, timeout: float = 30) -> None:
        """A killed broker's connections to a peer that was paused stay bound to its port
        (FIN_WAIT) until that peer, resumed, closes them: wait for it, then restart."""
        port = self.state.port(broker_id)
        deadline = time.monotonic() + timeout
        while port_in_use(self.state.host, port) and time.monotonic() < deadline:
            time.sleep(0.01)

    # --- topics and metadata -----------------------------------------------------------

    def _admin(self, fn: Callable[[Admin], Awaitable[T]]) -> T:
        async def call() -> T:
            async with Admin(self.bootstrap) as admin:
                return await fn(admin)

        return run_blocking(call)

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        """Create a topic (replication factor: min(brokers, 3) unless given); waits for leaders."""
        rf = replication_factor or min(self.brokers, 3)
        topic = NewTopic(name, partitions, rf, _config_strings(config or {}))
        self._admin(lambda admin: admin.create_topics([topic]))

    def partition(self, topic: str, partition: int = 0) -> PartitionInfo:
        """Leader, epoch, replicas and ISR as the cluster's metadata has them now."""

        async def describe(admin: Admin) -> PartitionInfo:
            return (await admin.describe_topics([topic]))[topic].partitions[partition]

        return self._admin(describe)

    def leader(self, topic: str, partition: int = 0) -> int:
        """The leader's id, or -1 while the partition is offline."""
        return self.partition(topic, partition).leader

    def isr(self, topic: str, partition: int = 0) -> list[int]:
        return sorted(self.partition(topic, partition).isr)

    def wait_for(
        self, check: Callable[[PartitionInfo], bool], topic: str, partition: int, timeout: float
    ) -> PartitionInfo:
        """Poll the partition's metadata until ``check`` holds; AssertionError after timeout."""
        deadline = time.monotonic() + timeout
        last: PartitionInfo | str = "no answer"
        while time.monotonic() < deadline:
            try:
                last = self.partition(topic, partition)
                if check(last):
                    return last
            except KafkaError as exc:  # the metadata's broker may be the one we stopped
                last = repr(exc)
            time.sleep(0.05)
        raise AssertionError(f"{topic}-{partition}: condition not met in {timeout}s; last: {last}")

    def wait_for_leader(
        self, topic: str, partition: int = 0, *, not_on: Iterable[int] = (), timeout: float = 30
    ) -> int:
        """Wait until the partition has a leader that is not one of ``not_on``; its id."""
        excluded = set(not_on)
        info = self.wait_for(
            lambda p: p.leader >= 0 and p.leader not in excluded, topic, partition, timeout
        )
        return info.leader

    def wait_for_isr(
        self,
        topic: str,
        partition: int = 0,
        isr: Iterable[int] | None = None,
        *,
        timeout: float = 30,
    ) -> list[int]:
        """Wait until the ISR is exactly ``isr`` (default: every replica); the ISR."""
        wanted = None if isr is None else sorted(isr)

        def check(p: PartitionInfo) -> bool:
            return sorted(p.isr) == (sorted(p.replicas) if wanted is None else wanted)

        return sorted(self.wait_for(check, topic, partition, timeout).isr)

    def elect_preferred_leaders(
        self, partitions: Iterable[tuple[str, int]] | None = None
    ) -> dict[tuple[str, int], KafkaError | None]:
        """Move leadership back to the preferred replicas now (of ``partitions``, default
        all): per partition None (elected) or why not (PreferredLeaderNotAvailable, ...;
        with the default, partitions already led by their preferred replica are left out).
        Answered once the change is committed; each broker applies it a moment later."""
        wanted = None if partitions is None else list(partitions)
        return self._admin(lambda admin: admin.elect_leaders("preferred", wanted))

    def stats(self, broker_id: int) -> dict[str, Any]:
        """The broker's own figures: purgatory metrics and its partition states."""
        self.state.check_id(broker_id)

        async def call() -> dict[str, Any]:
            async with Admin(self.address(broker_id)) as admin:
                return (await admin.broker_stats(broker_id))["stats"]

        return run_blocking(call)

    # --- faults (the brokers run with faults.enable=true) -------------------------------

    def _fault(self, broker_id: int, action: str, **spec: Any) -> list[dict[str, Any]]:
        self.state.check_id(broker_id)
        return self._admin(lambda admin: admin.faults(broker_id, action, **spec))

    def delay_replication(
        self, broker_id: int, delay_ms: int, topic: str | None = None, partition: int = -1
    ) -> list[dict[str, Any]]:
        """Delay this broker's replica fetches (as a follower) by ``delay_ms``."""
        spec = {"delay_ms": delay_ms, "partition": partition}
        return self._fault(broker_id, "delay-replication", **spec, **_topic(topic))

    def drop_replication(
        self, broker_id: int, topic: str | None = None, partition: int = -1
    ) -> list[dict[str, Any]]:
        """Discard what this broker fetches as a follower: it stops catching up."""
        spec = {"partition": partition}
        return self._fault(broker_id, "drop-replication", **spec, **_topic(topic))

    def delay_api(self, broker_id: int, api: int | str, delay_ms: int) -> list[dict[str, Any]]:
        """Delay this broker's responses of one API (``"produce"``, ``"fetch"``, ...)."""
        return self._fault(broker_id, "delay-api", api_key=_api_key(api), delay_ms=delay_ms)

    def fail_api(
        self, broker_id: int, api: int | str, error: int | str, count: int = -1
    ) -> list[dict[str, Any]]:
        """Answer the next ``count`` requests of one API with ``error`` (-1: until cleared)."""
        spec = {"api_key": _api_key(api), "error_code": _error_code(error), "count": count}
        return self._fault(broker_id, "fail-api", **spec)

    def isolate(self, broker_id: int, from_: Iterable[int] | None = None) -> None:
        """A network partition: drop all traffic between this broker and ``from_`` (default:
        every other broker), both ways, controller and replication alike, until
        ``clear_faults``. Clients still reach every broker."""
        self.state.check_id(broker_id)
        peers = None if from_ is None else list(from_)
        self._admin(lambda admin: isolation.isolate(admin, broker_id, peers))
        self.impaired.add(broker_id)

    def clear_faults(self, broker_id: int | None = None) -> None:
        """Remove every fault from every live broker; or from one broker, together with
        the other live brokers' isolation from it (both sides of an ``isolate``)."""
        if broker_id is not None:
            self.state.check_id(broker_id)
        alive = [b for b in range(self.brokers) if self.state.status_of(b) == "alive"]
        among = alive if broker_id is None else sorted({broker_id, *alive})
        _, errors = self._admin(lambda admin: isolation.clear(admin, broker_id, among))
        if broker_id is None:
            self.impaired.clear()
        else:
            self.impaired.discard(broker_id)
        if errors:
            raise next(iter(errors.values()))


def _topic(topic: str | None) -> dict[str, str]:
    return {} if topic is None else {"topic": topic}


def start_cluster(
    data_dir: Path, brokers: int = 3, config: Mapping[str, Any] | None = None
) -> LocalCluster:
    """Start ``brokers`` processes on free ports; return once an acks=all write succeeds."""
    # One free run for both listeners: native ports first, then the Kafka listeners'.
    base = free_port_range(2 * brokers)
    state = ClusterState(
        data_dir, base, brokers, _config_strings(config or {}), kafka_base_port=base + brokers
    )
    try:
        state.start_all()
        run_blocking(acks_all_write, state.bootstrap, min(brokers, 3))
    except BaseException:
        state.stop_all()
        raise
    return LocalCluster(state)


# --- the plugin ---------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    try:
        configured_ports()
    except ValueError as exc:  # a bad MINIBROKER_PORT_RANGE: one line, not a traceback
        raise pytest.UsageError(str(exc)) from None
    config.addinivalue_line(
        "markers",
        "minibroker(brokers=3, config=None): the cluster the minibroker_cluster fixture starts",
    )


@pytest.fixture
def minibroker_cluster_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterable[Callable[..., LocalCluster]]:
    """``start(brokers=3, config=None)``; every cluster started is stopped after the test."""
    started: list[LocalCluster] = []

    def start(brokers: int = 3, config: Mapping[str, Any] | None = None) -> LocalCluster:
        data_dir = tmp_path_factory.mktemp("minibroker")
        cluster = start_cluster(data_dir, brokers, {**DEFAULT_CONFIG, **(config or {})})
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        cluster.close()


@pytest.fixture(scope="session")
def minibroker_session_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterable[LocalCluster]:
    """One cluster for the session (3 brokers, faults enabled); ``minibroker_shared_cluster``
    hands it to tests and resets it after each."""
    cluster = start_cluster(tmp_path_factory.mktemp("minibroker-shared"), 3, DEFAULT_CONFIG)
    yield cluster
    cluster.close()


@pytest.fixture
def minibroker_shared_cluster(minibroker_session_cluster: LocalCluster) -> Iterable[LocalCluster]:
    """The session's cluster for this test, reset afterwards (``LocalCluster.reset``): a
    test costs its own work, not a cluster start. Tests share it one after another, so
    one must not depend on another's topics, faults or broker states."""
    yield minibroker_session_cluster
    minibroker_session_cluster.reset()


@pytest.fixture
def minibroker_cluster(
    request: pytest.FixtureRequest, minibroker_cluster_factory: Callable[..., LocalCluster]
) -> LocalCluster:
    """A running cluster for this test; ``@pytest.mark.minibroker(...)`` shapes it."""
    marker = request.node.get_closest_marker("minibroker")
    options = dict(marker.kwargs) if marker else {}
    return minibroker_cluster_factory(**options)
