"""`minibroker chaos`: a Jepsen-style run against a real local cluster.

Concurrent acks=all producers (every value unique) and a consumer run while a seeded
nemesis pauses, resumes, kills and restarts brokers; then the cluster is healed, the
final log is read through the leaders and every replica's segment files are read from
disk, and ``deploy.chaos_check`` judges the history.

Bounds, so that "ISR >= min.insync.replicas" can hold and every fault is survivable:
one broker at a time is faulted, for 1-3.5 s, and never the controller (there is one
controller and no controller failover; faulting it would stop failover, which is a
known limitation, not a finding). The same seed gives the same schedule.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from client import Admin, Consumer, NewTopic, Producer
from protocol.batch import iter_batches
from protocol.errors import KafkaError

from .chaos_check import History, Send
from .cluster import ClusterState
from .cluster_ops import acks_all_write
from .launcher import free_port_range

TOPIC = "chaos"
BROKER_CONFIG = {
    "replica.lag.time.max.ms": "1500",
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "replica.fetch.wait.max.ms": "200",
    "replica.fetch.backoff.ms": "200",
    "unclean.leader.election.enable": "false",
}
PRODUCER = {
    "acks": "all",
    "linger.ms": 0,
    "request.timeout.ms": 2000,
    "delivery.timeout.ms": 6000,
    "retry.backoff.ms": 100,
}


@dataclass(frozen=True)
class Fault:
    start_s: float
    end_s: float
    kind: str  # "pause" (then resume) or "kill" (then restart)
    broker: int


def plan_nemesis(seed: int, duration_s: float, victims: list[int]) -> list[Fault]:
    """A reproducible schedule: one fault at a time, each 1-3.5 s, gaps of 0.5-2 s."""
    rng = random.Random(seed)
    faults = []
    t = rng.uniform(0.5, 1.5)
    while victims and t < duration_s - 1.0:
        end = min(t + rng.uniform(1.0, 3.5), duration_s)
        faults.append(
            Fault(round(t, 2), round(end, 2), rng.choice(("pause", "kill")), rng.choice(victims))
        )
        t = end + rng.uniform(0.5, 2.0)
    return faults


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
    ) -> None:
        self.state = ClusterState(data_dir, free_port_range(brokers), brokers, BROKER_CONFIG)
        self.seed = seed
        self.duration_s = duration_s
        self.partitions = partitions
        self.producers = producers
        self.say = say
        self.history = History(TOPIC)
        self.schedule = plan_nemesis(seed, duration_s, list(range(1, brokers)))
        self._t0 = 0.0

    def _log(self, text: str) -> None:
        self.say(f"[{time.monotonic() - self._t0:6.2f}s] {text}")

    # --- the run ---------------------------------------------------------------------------

    def run(self) -> History:
        self.state.start_all()
        try:
            trio.run(self._main)
        finally:
            self.state.stop_all()
        self.history.replicas = self._read_replicas()
        return self.history

    async def _main(self) -> None:
        state = self.state
        await acks_all_write(state.bootstrap, min(state.brokers, 3))
        async with Admin(state.bootstrap) as admin:
            configs = {"min.insync.replicas": str(min(2, state.brokers))}
            rf = min(3, state.brokers)
            await admin.create_topics([NewTopic(TOPIC, self.partitions, rf, configs)])
        self._t0 = time.monotonic()
        for f in self.schedule:
            self._log(f"planned: {f.kind} broker {f.broker} from {f.start_s}s to {f.end_s}s")
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for p in range(self.producers):
                nursery.start_soon(self._produce, p, stop)
            nursery.start_soon(self._consume, stop)
            nursery.start_soon(self._sample_hws, stop)
            await self._nemesis()
            stop.set()
        self._log("workload stopped; healing")
        await self._heal()
        await self._final_read()

    async def _nemesis(self) -> None:
        counts = self.history.nemesis
        for f in self.schedule:
            await trio.sleep_until(self._trio_at(f.start_s))
            self._log(f"nemesis: {f.kind} broker {f.broker}")
            await self._fault(f.kind, f.broker)
            counts[f.kind] = counts.get(f.kind, 0) + 1
            await trio.sleep_until(self._trio_at(f.end_s))
            undo = "resume" if f.kind == "pause" else "restart"
            self._log(f"nemesis: {undo} broker {f.broker}")
            await self._fault(undo, f.broker)
            counts[undo] = counts.get(undo, 0) + 1
        await trio.sleep_until(self._trio_at(self.duration_s))

    def _trio_at(self, offset_s: float) -> float:
        return trio.current_time() + (self._t0 + offset_s - time.monotonic())

    async def _fault(self, kind: str, broker: int) -> None:
        state = self.state
        action = {
            "pause": lambda: state.signal(broker, signal.SIGSTOP),
            "resume": lambda: state.signal(broker, signal.SIGCONT),
            "kill": lambda: state.kill(broker),
            "restart": lambda: state.restart(broker),
        }[kind]
        await trio.to_thread.run_sync(action)

    async def _produce(self, producer_id: int, stop: trio.Event) -> None:
        sends = self.history.sends
        async with Producer(self.state.bootstrap, PRODUCER) as producer:
            seq = 0
            while not stop.is_set():
                send = Send(f"p{producer_id}-{seq}".encode(), seq % self.partitions)
                sends.append(send)
                seq += 1
                try:
                    meta = await producer.send(TOPIC, send.value, partition=send.partition)
                except KafkaError as exc:
                    send.outcome, send.error = "error", exc.code.name
                    await trio.sleep(0.05)
                else:
                    send.outcome, send.offset = "ok", meta.offset

    async def _consume(self, stop: trio.Event) -> None:
        consumed = self.history.consumed
        settings = {"fetch.max.wait.ms": 200, "request.timeout.ms": 3000}
        async with Consumer(self.state.bootstrap, **settings) as consumer:
            consumer.assign([(TOPIC, p) for p in range(self.partitions)])
            consumer.seek_to_beginning()
            while not stop.is_set():
                try:
                    records = await consumer.poll(timeout_ms=200)
                except KafkaError as exc:
                    self._log(f"consumer: {exc.code.name}; retrying")
                    await trio.sleep(0.2)
                    continue
                consumed.extend((r.partition, r.offset, r.value) for r in records)

    async def _sample_hws(self, stop: trio.Event) -> None:
        """Every replica's HW, per process life (a restarted broker starts a new series)."""
        samples = self.history.hw_samples
        while not stop.is_set():
            for broker in range(self.state.brokers):
                pid = self.state.pids.get(broker)
                if self.state.status_of(broker) != "alive":
                    continue
                stats = await self._stats(broker)
                for p in stats or []:
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
            elif status == "dead":
                await self._fault("restart", broker)
        with trio.move_on_after(timeout_s):
            while not await self._healed():
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
        final = self.history.final
        tps = [(TOPIC, p) for p in range(self.partitions)]
        async with Consumer(self.state.bootstrap, **{"fetch.max.wait.ms": 100}) as consumer:
            consumer.assign(tps)
            consumer.seek_to_beginning()
            ends = await consumer.end_offsets(tps)
            want = sum(ends.values())
            with trio.move_on_after(60):
                while len(final) < want:
                    for r in await consumer.poll(timeout_ms=500):
                        final[(r.partition, r.offset)] = r.value
        self._log(f"final read: {len(final)} of {want} records")

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
