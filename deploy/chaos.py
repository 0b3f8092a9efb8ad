"""`minibroker chaos`: a Jepsen-style run against a real local cluster.

Pipelined acks=all producers (every value unique, many records in flight) and a
consumer run while a seeded nemesis pauses, resumes, kills, restarts and isolates
brokers (a network partition: ``faults isolate``); then the cluster is healed, the
final log is read through the leaders and every replica's segment files are read from
disk, and ``deploy.chaos_check`` judges the history.

Bounds, so that "ISR >= min.insync.replicas" can hold and every fault is survivable:
one broker at a time is faulted, for 1-3.5 s, so a majority always stays connected;
an isolate cuts the victim off from every other broker or, sometimes, from some of
them (a partial partition). By default the nemesis picks any broker and, now and
then, whichever broker is the active controller at that moment (the quorum elects a
new one); ``--spare-controller`` leaves the active controller alone.
The same seed gives the same schedule.

``workload="groups"`` adds a consumer group (deploy/chaos_groups.py): member processes
consume and commit while the nemesis also targets the group's coordinator and pauses
members; after the heal the group must settle and drain (deploy/chaos_group_check.py).

``workload="transactions"`` adds transactional producers on a topic of their own
(deploy/chaos_txn.py) and a read_committed consumer, while the nemesis also targets the
transaction coordinators and that topic's leaders; the producers' workload runs beside
it with one producer (deploy/chaos_txn_check.py judges the transactions).
"""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from minibroker.client import Admin, NewTopic, Producer
from minibroker.deploy import interrupt, isolation
from minibroker.deploy.chaos_check import History, Send
from minibroker.deploy.chaos_groups import (
    GROUP,
    GROUP_BROKER_CONFIG,
    REJOIN_AFTER_S,
    GroupWorkload,
)
from minibroker.deploy.chaos_reads import consume, read_to_end
from minibroker.deploy.chaos_txn import TXN_BROKER_CONFIG, TXN_TOPIC, TxnWorkload
from minibroker.deploy.cluster import ClusterState
from minibroker.deploy.cluster_ops import acks_all_write
from minibroker.deploy.launcher import free_port_range
from minibroker.deploy.nemesis import (
    CONTROLLER,
    CONTROLLER_FAILOVER,
    COORDINATOR,
    FAULT_KINDS,
    GROUP_FAULT_KINDS,
    SLOW_REQUESTS,
    TXN_COORDINATOR,
    TXN_FAULT_KINDS,
    TXN_LEADER,
    UNDO,
    Fault,
    plan_nemesis,
    victims_for,
)
from minibroker.protocol import ApiKey
from minibroker.protocol.batch import iter_batches
from minibroker.protocol.errors import ErrorCode, KafkaError

__all__ = [
    "CONTROLLER",
    "CONTROLLER_FAILOVER",
    "FAULT_KINDS",
    "GROUP_FAULT_KINDS",
    "TXN_FAULT_KINDS",
    "ChaosRun",
    "Fault",
    "plan_nemesis",
    "victims_for",
]

TOPIC = "chaos"
BROKER_CONFIG = {
    "replica.lag.time.max.ms": "1500",
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "replica.fetch.wait.max.ms": "200",
    "replica.fetch.backoff.ms": "200",
    "unclean.leader.election.enable": "false",
    "faults.enable": "true",  # for isolate
}
PRODUCER = {
    "acks": "all",
    "linger.ms": 2,
    "request.timeout.ms": 2000,
    "delivery.timeout.ms": 6000,
    "retry.backoff.ms": 100,
}
# Records each producer keeps in flight: enough that batches, not round trips, set the
# pace. Three producers awaiting each ack got ~110 acknowledged records/s here (4,400 in
# a 40 s run); pipelined, several thousand, also under a CPU hog.
IN_FLIGHT = 256
RESOLVE_TIMEOUT_S = 10.0
# slow-heartbeats: how long a bounce takes (the leave, its rebalance, the newcomer's start)
BOUNCE_S = REJOIN_AFTER_S + 0.5


class ChaosRun:
    """One run: cluster, workload, nemesis, heal, final reads. Produces a History."""

    def __init__(
        self,
        data_dir: Path,
        brokers: int,
        seed: int,
        duration_s: float,
        partitions: int = 3,
        producers: int = 3,
        say: Callable[[str], None] = print,
        *,
        kinds: Sequence[str] = FAULT_KINDS,
        target_controller: bool = CONTROLLER_FAILOVER,
        idempotence: bool = True,
        workload: str = "producers",
        members: int = 3,
        confluent_members: int = 0,
        confluent_producers: int = 0,
    ) -> None:
        groups = workload == "groups"
        transactions = workload == "transactions"
        config = {
            **BROKER_CONFIG,
            **(GROUP_BROKER_CONFIG if groups else {}),
            **(TXN_BROKER_CONFIG if transactions else {}),
        }
        # confluent-kafka members and producers talk to the Kafka listeners
        stock = (groups and confluent_members) or (transactions and confluent_producers)
        kafka_base = free_port_range(brokers) if stock else 0
        self.state = ClusterState(
            data_dir, free_port_range(brokers), brokers, config, kafka_base_port=kafka_base
        )
        self.seed = seed
        self.duration_s = duration_s
        self.partitions = partitions
        # With the transactional workload: that many transactional producers, one plain one.
        self.producers = 1 if transactions else producers
        self.say = say
        self.target_controller = target_controller
        self.history = History(TOPIC, idempotent=idempotence)
        self.producer_config = {**PRODUCER, "enable.idempotence": idempotence}
        victims = victims_for(
            brokers, CONTROLLER, target_controller, coordinator=groups, transactions=transactions
        )
        if groups and tuple(kinds) == FAULT_KINDS:
            kinds = GROUP_FAULT_KINDS
        if transactions and tuple(kinds) == FAULT_KINDS:
            kinds = TXN_FAULT_KINDS
        self.kinds = tuple(kinds)
        self.schedule = plan_nemesis(seed, duration_s, victims, kinds, brokers)
        self.groups = (
            GroupWorkload(
                data_dir, self.state.bootstrap, TOPIC, partitions, members, seed, duration_s,
                self._log, confluent_members, self.state.kafka_bootstrap,
            )
            if groups
            else None
        )  # fmt: skip
        self.txn = (
            TxnWorkload(
                self.state.bootstrap,
                partitions,
                producers,
                seed,
                self._log,
                confluent_producers,
                self.state.kafka_bootstrap,
            )
            if transactions
            else None
        )
        self.signal_status = 0  # 130/143: SIGINT/SIGTERM stopped the run
        self._t0 = 0.0
        self._admin: Admin | None = None

    def _log(self, text: str) -> None:
        elapsed = time.monotonic() - self._t0
        self.history.events.append((round(elapsed, 3), text))
        self.say(f"[{elapsed:6.2f}s] {text}")

    # --- the run ---------------------------------------------------------------------------

    def run(self) -> History | None:
        """The run's history; None if SIGINT or SIGTERM stopped it (``signal_status``:
        130 or 143). Either way every broker and member it started is stopped first."""
        status = 0
        try:
            self.state.start_all()
            status = interrupt.run(self._main)  # a signal cancels the run
        finally:
            # Whatever ended the run (an error, a signal), the processes it started stop;
            # a signal meanwhile does not cut that short, but counts.
            with interrupt.held() as noted:
                if self.groups is not None:
                    self.groups.stop()
                    self.history.group = self.groups.history
                if self.txn is not None:
                    self.history.txn = self.txn.history
                self.state.stop_all()
        self.signal_status = status or (interrupt.exit_status(noted[0]) if noted else 0)
        if self.signal_status:
            return None
        self.history.replicas = self._read_replicas()
        return self.history

    async def _main(self) -> int:
        state = self.state
        await acks_all_write(state.bootstrap, min(state.brokers, 3))
        async with Admin(state.bootstrap) as admin:
            self._admin = admin
            configs = {"min.insync.replicas": str(min(2, state.brokers))}
            rf = min(3, state.brokers)
            await admin.create_topics([NewTopic(TOPIC, self.partitions, rf, configs)])
            if self.txn is not None:
                await self.txn.start(admin, rf, min(2, state.brokers))
            if self.groups is not None:
                self._t0 = time.monotonic()  # (the members' start, timed from here)
                await self.groups.start(admin)
            self._t0 = time.monotonic()
            for f in self.schedule:
                self._log(f"planned: {self._describe(f)} from {f.start_s}s to {f.end_s}s")
            for m in self.groups.schedule if self.groups is not None else ():
                self._log(f"planned: {m.kind} member m{m.member} from {m.start_s}s to {m.end_s}s")
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                if self.groups is not None:
                    nursery.start_soon(self.groups.nemesis, self._trio_at)
                    nursery.start_soon(self.groups.sample_commits, admin, stop)
                if self.txn is not None:
                    for i in range(len(self.txn.ids)):
                        nursery.start_soon(self.txn.produce, i, stop)
                    nursery.start_soon(self.txn.consume, stop)
                for p in range(self.producers):
                    nursery.start_soon(self._produce, p, stop)
                nursery.start_soon(self._consume, stop)
                nursery.start_soon(self._sample_hws, stop)
                await self._nemesis()
                stop.set()
            self.history.workload_s = round(time.monotonic() - self._t0, 3)
            self._log("workload stopped; healing")
            await self._heal()
            if self.groups is not None:
                await self.groups.settle(admin)
        await self._final_read()
        if self.txn is not None:
            await self.txn.final_read()
        return 0

    @staticmethod
    def _describe(f: Fault) -> str:
        who = {
            CONTROLLER: "the active controller",
            COORDINATOR: "the group coordinator",
            TXN_COORDINATOR: "a transaction coordinator",
            TXN_LEADER: f"a leader of {TXN_TOPIC}",
        }.get(f.broker, f"broker {f.broker}")
        if f.kind == "isolate":
            return f"isolate {who} from {'all others' if f.peers is None else list(f.peers)}"
        return f"{f.kind} {who}"

    async def _nemesis(self) -> None:
        counts = self.history.nemesis
        for f in self.schedule:
            await trio.sleep_until(self._trio_at(f.start_s))
            broker = await self._resolve(f.broker)
            if broker is None:
                self._log(f"nemesis: {self._describe(f)} skipped: nobody to resolve it to")
                continue
            what = self._describe(f) + (f" (broker {broker})" if f.broker < 0 else "")
            self._log(f"nemesis: {what}")
            try:
                await self._fault(f.kind, broker, f.peers)
            except (KafkaError, isolation.IsolationError) as exc:
                self._log(f"nemesis: {f.kind} broker {broker} failed: {exc}; skipped")
                continue
            counts[f.kind] = counts.get(f.kind, 0) + 1
            if f.broker == CONTROLLER:
                counts["controller"] = counts.get("controller", 0) + 1
            role = {
                COORDINATOR: "coordinator",
                TXN_COORDINATOR: "txn_coordinator",
                TXN_LEADER: "txn_leader",
            }.get(f.broker)
            if role is not None:
                counts[role] = counts.get(role, 0) + 1
            if f.kind == "slow-heartbeats" and self.groups is not None:
                # The rebalances the held heartbeats must straddle: a member leaves, a new
                # one joins once that rebalance is over; again while the fault lasts. (A
                # bounce is never cut short: the fault may outlast its plan a little.)
                with trio.CancelScope(shield=True):
                    bounced = await self.groups.bounce()
                    while bounced and trio.current_time() < self._trio_at(f.end_s - BOUNCE_S):
                        bounced = await self.groups.bounce()
            await trio.sleep_until(self._trio_at(f.end_s))
            undo = UNDO[f.kind]
            self._log(f"nemesis: {undo} broker {broker}")
            try:
                await self._fault(undo, broker)
            except KafkaError as exc:  # the heal at the end tries again
                self._log(f"nemesis: {undo} broker {broker} failed: {exc}")
            counts[undo] = counts.get(undo, 0) + 1
        await trio.sleep_until(self._trio_at(self.duration_s))

    async def _resolve(self, broker: int) -> int | None:
        """A planned victim: a role (CONTROLLER, COORDINATOR, TXN_COORDINATOR, TXN_LEADER)
        becomes the broker that holds it now (None if none is known within
        RESOLVE_TIMEOUT_S: the fault is skipped)."""
        admin = self._admin

        async def controller() -> int:  # -1 while the quorum is still electing
            return (await admin.describe_cluster())[1]

        async def group_coordinator() -> int:
            return (await admin.describe_consumer_group(GROUP)).coordinator

        ask = {
            CONTROLLER: controller,
            COORDINATOR: group_coordinator,
            TXN_COORDINATOR: lambda: self.txn.coordinator(admin),
            TXN_LEADER: lambda: self.txn.leader(admin),
        }.get(broker)
        if ask is None:
            return broker
        with trio.move_on_after(RESOLVE_TIMEOUT_S):
            while True:
                try:
                    found = await ask()
                except KafkaError:
                    found = -1  # no answer yet (a broker down, a group moving)
                if found >= 0:
                    return found
                await trio.sleep(0.05)
        return None

    def _trio_at(self, offset_s: float) -> float:
        return trio.current_time() + (self._t0 + offset_s - time.monotonic())

    async def _fault(self, kind: str, broker: int, peers: tuple[int, ...] | None = None) -> None:
        state = self.state
        if kind == "isolate":
            await isolation.isolate(self._admin, broker, peers)
            return
        if kind == "fail-heartbeats":
            await self._admin.faults(
                broker,
                "fail-api",
                api_key=int(ApiKey.HEARTBEAT),
                error_code=int(ErrorCode.NOT_COORDINATOR),
                count=-1,
            )
            return
        if kind in SLOW_REQUESTS:
            apis, delay_ms = SLOW_REQUESTS[kind]
            for api in apis:
                await self._admin.faults(
                    broker, "delay-request", api_key=int(api), delay_ms=delay_ms
                )
            return
        if kind == "heal":
            _, errors = await isolation.clear(self._admin, broker)
            if errors:
                raise next(iter(errors.values()))
            return
        action = {
            "pause": lambda: state.signal(broker, signal.SIGSTOP),
            "resume": lambda: state.signal(broker, signal.SIGCONT),
            "kill": lambda: state.kill(broker),
            "restart": lambda: state.restart(broker),
        }[kind]
        await trio.to_thread.run_sync(action)

    async def _produce(self, producer_id: int, stop: trio.Event) -> None:
        """Pipelined: up to IN_FLIGHT records wait for their acks while more are queued."""
        sends = self.history.sends
        in_flight: deque = deque()
        async with Producer(self.state.bootstrap, self.producer_config) as producer:
            seq = 0
            while not stop.is_set():
                send = Send(f"p{producer_id}-{seq}".encode(), seq % self.partitions)
                sends.append(send)
                seq += 1
                try:
                    handle = await producer.enqueue(TOPIC, send.value, partition=send.partition)
                except KafkaError as exc:
                    send.outcome, send.error = "error", exc.code.name
                    await trio.sleep(0.05)
                    continue
                in_flight.append((send, handle))
                while in_flight and (len(in_flight) >= IN_FLIGHT or in_flight[0][1].done()):
                    await self._settle(*in_flight.popleft())
            # Stopped: every send still in flight ends within delivery.timeout.ms.
            while in_flight:
                await self._settle(*in_flight.popleft())

    @staticmethod
    async def _settle(send: Send, handle) -> None:
        try:
            meta = await handle
        except KafkaError as exc:
            send.outcome, send.error = "error", exc.code.name
        else:
            send.outcome, send.offset = "ok", meta.offset

    async def _consume(self, stop: trio.Event) -> None:
        await consume(
            self.state.bootstrap, TOPIC, self.partitions, self.history.consumed, stop, self._log
        )

    async def _sample_hws(self, stop: trio.Event) -> None:
        """Every replica's HW, per process life (a restarted broker starts a new series).

        The nemesis restarts brokers from a worker thread, so a broker's pid can change
        while its stats are on the way: a sample counts only if the pid is the same
        before and after it, or a new process's first HW (from its checkpoint, possibly
        lower) would be filed under the old process and look like a regression.
        """
        samples = self.history.hw_samples
        while not stop.is_set():
            for broker in range(self.state.brokers):
                pid = self.state.pids.get(broker)
                if self.state.status_of(broker) != "alive":
                    continue
                stats = await self._stats(broker)
                if stats is None or self.state.pids.get(broker) != pid:
                    continue
                for p in stats:
                    if p["topic"] == TOPIC:
                        key = (broker, pid, p["partition"])
                        samples.setdefault(key, []).append(p["high_watermark"])
            await trio.sleep(0.1)

    async def _stats(self, broker: int) -> list[dict] | None:
        with trio.move_on_after(1.0):
            try:
                address = f"{self.state.host}:{self.state.port(broker)}"
                async with Admin(address) as admin:
                    return (await admin.broker_stats(broker))["stats"]["partitions"]
            except KafkaError:
                return None
        return None

    async def _heal(self, timeout_s: float = 40) -> None:
        state = self.state
        for broker in range(state.brokers):
            status = state.status_of(broker)
            if status == "paused":
                await self._fault("resume", broker)
            elif status in ("stopped", "dead"):
                await self._fault("restart", broker)
        with trio.move_on_after(timeout_s):
            while True:
                # Every isolation lifted (again, in case an undo failed), then wait.
                _, errors = await isolation.clear(self._admin)
                if not errors and await self._healed():
                    break
                await trio.sleep(0.2)
            self._log("healed: every ISR full, every replica at the same HW and LEO")
            return
        self.history.healed = False
        self._log(f"NOT healed after {timeout_s}s")

    async def _healed(self) -> bool:
        """Every replica of every partition reports the same HW = LEO and a full ISR."""
        views: dict[int, list[tuple[int, int, list[int], list[int]]]] = {}
        for broker in range(self.state.brokers):
            stats = await self._stats(broker)
            if stats is None:
                return False
            for p in stats:
                if p["topic"] == TOPIC:
                    views.setdefault(p["partition"], []).append(
                        (
                            p["high_watermark"],
                            p["log_end_offset"],
                            sorted(p["isr"]),
                            sorted(p["replicas"]),
                        )
                    )
        return len(views) == self.partitions and all(
            len(v) == len(v[0][3])  # every replica answered
            and len(set(map(str, v))) == 1  # ...with the same figures
            and v[0][2] == v[0][3]  # ISR = all replicas
            and v[0][0] == v[0][1]  # HW = LEO
            for v in views.values()
        )

    async def _final_read(self) -> None:
        final, complete = await read_to_end(self.state.bootstrap, TOPIC, self.partitions)
        self.history.final = final
        self._log(f"final read: {len(final)} records, every partition to its end: {complete}")

    def _read_replicas(self) -> dict[int, dict[int, list[tuple[int, int, int]]]]:
        """Each broker's batches from its segment files (the brokers are stopped)."""
        out: dict[int, dict[int, list[tuple[int, int, int]]]] = {}
        for p in range(self.partitions):
            for broker in range(self.state.brokers):
                directory = self.state.data_dir / f"broker-{broker}" / f"{TOPIC}-{p}"
                data = b"".join(f.read_bytes() for f in sorted(directory.glob("*.log")))
                out.setdefault(p, {})[broker] = [
                    (h.base_offset, h.last_offset, h.crc) for _, h in iter_batches(data)
                ]
        return out
