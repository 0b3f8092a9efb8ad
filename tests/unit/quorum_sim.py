"""A deterministic simulation of KRaft voters (broker.raft) over a faulty network.

One seed fixes everything: the network's drops, delays, duplicates and reordering, the
partitions (symmetric and one-way), crashes (also between two effects of one step) and
restarts, pauses (a SIGSTOPped process: no ticks, nothing delivered to or from it, then
resumed with its clock jumped), the client's appends and snapshots, and each voter's own
random source. Time is a
ManualClock advanced from event to event, so thousands of simulated seconds take moments.

A restarted voter is a new KafkaRaftClient built from what its "disk" holds: the last
persisted quorum-state, the log and snapshot as the applied effects left them. The checker
(quorum_checker.py) sees every effect as it lands; the state machine is a digest chain.
"""

from __future__ import annotations

import heapq
import random
import zlib
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from minibroker.broker.common.clock import ManualClock
from minibroker.broker.raft import (
    AppendLog,
    Effect,
    HighWatermarkUpdated,
    KafkaRaftClient,
    LeaderChanged,
    PersistQuorumState,
    QuorumConfig,
    QuorumStateData,
    RaftLog,
    Send,
    StoreSnapshot,
    TruncateLog,
)
from tests.unit.quorum_checker import (
    SafetyChecker,
    SafetyViolation,
    decode_snapshot,
    decode_snapshot_image,
    encode_snapshot,
)

CONFIG = QuorumConfig(request_timeout_ms=700)  # < fetch timeout: one lost fetch is retried
FAULT_PHASE_MS = 20_000
LIVENESS_BOUND_MS = (
    10_000  # after healing: elect, then commit a fresh append everywhere (seen: p95 2 s)
)
NEVER = 1 << 62


@dataclass(slots=True)
class Voter:
    id: int
    quorum_state: QuorumStateData | None = None
    log: RaftLog = field(default_factory=RaftLog)  # the durable log ("disk")
    core: KafkaRaftClient | None = None
    hw: int = 0  # high watermark this incarnation reported
    applied: int = 0  # state machine: entries below this are applied
    digest: int = 0
    deadline: int = NEVER
    image: dict[int, int] = field(default_factory=dict)  # unit -> its records applied here


@dataclass(slots=True)
class Network:
    drop: float = 0.0
    duplicate: float = 0.0
    max_delay_ms: int = 20
    blocked: set[tuple[int, int]] = field(default_factory=set)  # (source, destination)


class Simulation:
    def __init__(
        self,
        seed: int,
        voters: int,
        client_class: type[KafkaRaftClient] = KafkaRaftClient,
        *,
        config: QuorumConfig = CONFIG,
        units: bool = False,
        split_units: bool = False,
    ) -> None:
        self.seed = seed
        self.config = config
        # With ``units`` every append is a unit: the records of one controller change in
        # one entry, some far larger than a fetch (fetch_max_bytes / fetch_max_entries).
        # ``split_units`` plants the bug this replaced: one entry per record of a change.
        self.units = units or split_units
        self.split_units = split_units
        self.unit_sizes: dict[int, int] = {}
        self.rng = random.Random(seed)
        self.clock = ManualClock()
        self.client_class = client_class
        self.ids = list(range(voters))
        self.nodes = {i: Voter(i) for i in self.ids}
        self.net = Network()
        self.crash_mid_step = 0.0
        self.paused: set[int] = set()  # stopped voters: no polls, no messages in or out
        self.messages: list[tuple[int, int, int, int, object]] = []  # (at, seq, src, dst, msg)
        self.actions: list[tuple[int, int, Callable[[], None]]] = []
        self.seq = 0
        self.next_value = 0
        self.trace: deque[str] = deque(maxlen=40)
        self.stats: Counter[str] = Counter()  # what this run exercised
        self.recovery_ms = -1  # healing -> a fresh append applied on every voter
        self.checker = SafetyChecker(self._leaders)
        for node in self.nodes.values():
            self._start(node)

    # -------------------------------------------------------------- voters

    def _leaders(self):
        for node in self.nodes.values():
            if node.core is not None and node.core.role == "leader":
                yield node.id, node.core.epoch, node.log

    def _start(self, node: Voter) -> None:
        self.paused.discard(node.id)
        node.core = self.client_class(
            node.id,
            self.ids,
            self.clock,
            random.Random(self.rng.getrandbits(64)),
            config=self.config,
            quorum_state=node.quorum_state,
            log=node.log.copy(),
        )
        node.hw = node.log.start_offset
        snap = node.log.snapshot
        node.applied, node.digest = decode_snapshot(snap.data) if snap else (0, 0)
        node.image = decode_snapshot_image(snap.data) if snap else {}
        self.trace.append(f"{self.clock.now_ms()} start {node.id}")
        self._apply(node, node.core.poll())

    def _crash(self, node: Voter) -> None:
        self.paused.discard(node.id)
        node.core, node.deadline = None, NEVER
        self.stats["crash"] += 1
        self.trace.append(f"{self.clock.now_ms()} crash {node.id}")

    def _bounce(self, node: Voter) -> None:
        """Crash now and come back soon: a restart inside one election is where lost votes bite."""
        self._crash(node)
        self.schedule(self.rng.randint(1, 500), lambda: node.core is None and self._start(node))

    def _apply(self, node: Voter, effects: list[Effect]) -> None:
        """Carry out effects in order, as a driver must; maybe crash between two of them."""
        crash_at = -1
        if effects and self.crash_mid_step and self.rng.random() < self.crash_mid_step:
            crash_at = self.rng.randrange(len(effects))
        for i, effect in enumerate(effects):
            if i == crash_at:
                self._bounce(node)
                return
            kind = type(effect)
            if kind is Send:
                self._transmit(node.id, effect.destination, effect.message)
            elif kind is AppendLog:
                self.stats["appended"] += len(effect.entries)
                self.checker.append(node, effect)
                node.log.append(effect.entries)
            elif kind is HighWatermarkUpdated:
                self.checker.high_watermark(node, effect)
            elif kind is PersistQuorumState:
                node.quorum_state = effect.state
            elif kind is LeaderChanged:
                self.trace.append(f"{self.clock.now_ms()} node {node.id}: {effect}")
                self.checker.leader_changed(node, effect)
                self.stats[effect.role] += 1
            elif kind is TruncateLog:
                self.checker.truncate(node, effect.offset)
                self.stats["truncate"] += node.log.end_offset > effect.offset
                node.log.truncate(effect.offset)
            elif kind is StoreSnapshot:
                self.checker.store_snapshot(node, effect.snapshot)
                node.log.store_snapshot(effect.snapshot)
                offset, digest = decode_snapshot(effect.snapshot.data)
                if offset > node.applied:  # fetched from the leader: state replaced
                    node.applied, node.digest = offset, digest
                    node.image = decode_snapshot_image(effect.snapshot.data)
                    self.checker.image_whole(node.id, node.image, self.unit_sizes)
                    self.stats["snapshot_installed"] += 1
        self._apply_committed(node)
        node.deadline = NEVER if node.id in self.paused else node.core.next_deadline_ms()

    def _apply_committed(self, node: Voter) -> None:
        while node.applied < node.hw:
            entry = node.log.entry(node.applied)
            if entry is None:  # below the log start: the snapshot must be ahead of us
                raise SafetyViolation(f"node {node.id} cannot apply offset {node.applied}")
            if not entry.control:
                node.digest = zlib.crc32(entry.data, node.digest)
                if self.units:
                    self._apply_unit(node, entry.data)
            node.applied += 1
            self.checker.applied(node.id, node.applied, node.digest)

    def _apply_unit(self, node: Voter, data: bytes) -> None:
        """Record by record, as MetadataImage.apply does; then the image must be whole."""
        head, *records = data.split(b"|")
        unit = int(head.split(b":")[0][1:])
        for _record in records:
            node.image[unit] = node.image.get(unit, 0) + 1
        if len(records) > self.config.fetch_max_entries:
            self.stats["big_unit_applied"] += 1
        self.checker.image_whole(node.id, node.image, self.unit_sizes)

    # -------------------------------------------------------------- network

    def _transmit(self, src: int, dst: int, message: object) -> None:
        net = self.net
        if dst in self.paused or (src, dst) in net.blocked or self.rng.random() < net.drop:
            return
        copies = 2 if self.rng.random() < net.duplicate else 1
        for _ in range(copies):
            at = self.clock.now_ms() + self.rng.randint(1, net.max_delay_ms)
            self.seq += 1
            heapq.heappush(self.messages, (at, self.seq, src, dst, message))

    def _request_failed(self, src: int, dst: int, message: object) -> None:
        node = self.nodes[src]
        if node.core is not None and src not in self.paused:
            self._apply(node, node.core.request_failed(dst, message))

    def schedule(self, delay_ms: int, action: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.actions, (self.clock.now_ms() + delay_ms, self.seq, action))

    # -------------------------------------------------------------- the loop

    def run_until(self, end_ms: int) -> None:
        polls_at_same_instant = 0
        while True:
            at_node = min(self.nodes.values(), key=lambda n: n.deadline)
            t_msg = self.messages[0][0] if self.messages else NEVER
            t_act = self.actions[0][0] if self.actions else NEVER
            now = self.clock.now_ms()
            t = max(now, min(at_node.deadline, t_msg, t_act))
            if t > end_ms:
                self.clock.advance(end_ms - now)
                return
            self.clock.advance(t - now)
            if t_msg <= t:
                _, _, src, dst, message = heapq.heappop(self.messages)
                node = self.nodes[dst]
                if dst in self.paused:
                    pass  # a stopped process reads nothing; its peers' requests time out
                elif node.core is not None:
                    self._apply(node, node.core.handle(src, message))
                elif type(message).__name__.endswith("Request"):
                    # A request to a crashed voter is refused (a lost one, above, is not):
                    # the sender learns of it and retries after its backoff.
                    self.schedule(1, lambda s=src, d=dst, m=message: self._request_failed(s, d, m))
            elif t_act <= t:
                heapq.heappop(self.actions)[2]()
            else:
                polls_at_same_instant = polls_at_same_instant + 1 if t == now else 0
                if polls_at_same_instant > 10_000:
                    raise SafetyViolation(f"node {at_node.id} polls forever at {t}")
                self._apply(at_node, at_node.core.poll())

    # -------------------------------------------------------------- workload and faults

    def client_append(self) -> int | None:
        """Append one value through a node that thinks it leads (maybe a stale one)."""
        leaders = [n for n in self.live() if n.core.role == "leader"]
        if not leaders:
            return None
        node = self.rng.choice(leaders)
        self.next_value += 1
        data = f"v{self.next_value}".encode()
        if self.units:
            # Mostly small changes; one in five larger than a fetch in entries and bytes.
            big = self.rng.random() < 0.2
            size = self.rng.randint(501, 1200) if big else self.rng.randint(1, 3)
            self.unit_sizes[self.next_value] = size
            head = b"u%d:%d" % (self.next_value, size)
            records = [b"r%d.%-10d" % (self.next_value, i) for i in range(size)]
            if self.split_units:
                offset, effects = node.core.append([head + b"|" + r for r in records])
                self._apply(node, effects)
                return offset
            data = b"|".join([head, *records])
        offset, effects = node.core.append([data])
        self._apply(node, effects)
        return offset

    def live(self) -> list[Voter]:
        """Voters running now: started and not paused."""
        return [n for n in self.nodes.values() if n.core is not None and n.id not in self.paused]

    def pause(self, node: Voter) -> None:
        """SIGSTOP: no ticks, nothing delivered to or from it (its peers' requests time out)."""
        self.paused.add(node.id)
        node.deadline = NEVER
        self.stats["pause"] += 1
        self.trace.append(f"{self.clock.now_ms()} pause {node.id}")

    def resume(self, node: Voter) -> None:
        """SIGCONT: its timers see the whole pause at once, as a resumed process's do."""
        if node.id in self.paused:
            self.paused.discard(node.id)
            node.deadline = node.core.next_deadline_ms()
            self.trace.append(f"{self.clock.now_ms()} resume {node.id}")

    def take_snapshot(self) -> None:
        live = self.live()
        if live:
            node = self.rng.choice(live)
            if node.applied > node.log.start_offset:
                effects = node.core.create_snapshot(
                    node.applied, encode_snapshot(node.applied, node.digest, node.image)
                )
                self._apply(node, effects)

    def random_fault(self) -> None:
        rng, net, now = self.rng, self.net, self.clock.now_ms()
        choice = rng.randrange(10)
        live = self.live()
        if choice == 0:
            if live:
                self._crash(rng.choice(live))
        elif choice == 8:
            if live:
                self._bounce(rng.choice(live))
        elif choice == 1:
            dead = [n for n in self.nodes.values() if n.core is None]
            if dead:
                self._start(rng.choice(dead))
        elif choice == 2:  # symmetric partition into two sides
            side = set(rng.sample(self.ids, rng.randint(1, len(self.ids) // 2)))
            net.blocked = {(a, b) for a in self.ids for b in self.ids if (a in side) != (b in side)}
        elif choice == 3:  # one-way links: a voter hears but is not heard, or the reverse
            a, b = rng.sample(self.ids, 2)
            net.blocked.add((a, b))
        elif choice == 4:
            net.blocked.clear()
        elif choice == 5:
            net.drop = rng.choice((0.0, 0.05, 0.2))
            net.duplicate = rng.choice((0.0, 0.05, 0.2))
        elif choice == 6:
            net.max_delay_ms = rng.choice((5, 20, 100, 400))
        elif choice == 7:
            self.crash_mid_step = rng.choice((0.0, 0.0, 0.01, 0.05))
        elif choice == 9 and live:
            node = rng.choice(live)
            self.pause(node)
            self.schedule(rng.randint(100, 15_000), lambda: self.resume(node))
        self.trace.append(f"{now} fault {choice}: blocked={sorted(net.blocked)} drop={net.drop}")

    def _repeat(self, low: int, high: int, action: Callable[[], None], until_ms: int) -> None:
        def run() -> None:
            if self.clock.now_ms() < until_ms:  # a fault never fires after healing
                action()
                self.schedule(self.rng.randint(low, high), run)

        self.schedule(self.rng.randint(low, high), run)

    def heal(self) -> None:
        self.net = Network(max_delay_ms=20)
        self.crash_mid_step = 0.0
        for node in self.nodes.values():
            if node.core is None:
                self._start(node)
            else:
                self.resume(node)
        self.trace.append(f"{self.clock.now_ms()} healed")

    def run(self, fault_ms: int = FAULT_PHASE_MS) -> None:
        """Faults for ``fault_ms``, then heal and demand progress within LIVENESS_BOUND_MS."""
        end = fault_ms + LIVENESS_BOUND_MS
        self._repeat(20, 150, self.client_append, end)
        self._repeat(500, 2_000, self.take_snapshot, end)
        self._repeat(100, 900, self.random_fault, fault_ms)
        self.run_until(fault_ms)
        self.heal()
        self.check_liveness(self.clock.now_ms() + LIVENESS_BOUND_MS)

    def check_liveness(self, deadline_ms: int) -> None:
        marker: int | None = None
        healed_at = self.clock.now_ms()
        while self.clock.now_ms() < deadline_ms:
            self.run_until(self.clock.now_ms() + 50)
            if marker is None:
                if self.stable_leader() is not None:
                    marker = self.client_append()
            elif all(n.applied > marker for n in self.nodes.values()):
                self.recovery_ms = self.clock.now_ms() - healed_at
                return
        raise SafetyViolation(
            f"liveness: no append committed on every voter within {LIVENESS_BOUND_MS} ms of "
            f"healing (marker offset {marker}, roles {self.roles()})"
        )

    def stable_leader(self) -> int | None:
        cores = [n.core for n in self.nodes.values()]
        leaders = [c for c in cores if c is not None and c.role == "leader"]
        if len(leaders) != 1:
            return None
        leader = leaders[0]
        if all(
            c is not None and c.epoch == leader.epoch and c.leader_id == leader.node_id
            for c in cores
        ):
            return leader.node_id
        return None

    def roles(self) -> dict[int, str]:
        return {
            n.id: "down" if n.core is None else f"{n.core.role}@{n.core.epoch} hw={n.hw}"
            for n in self.nodes.values()
        }


def reproduce_command(seed: int, voters: int) -> str:
    return (
        f"QUORUM_SIM_SEED={seed} QUORUM_SIM_VOTERS={voters} .venv/bin/python -m pytest "
        f"-q tests/unit/test_quorum_simulation.py -k many_seeds"
    )


def run_seed(
    seed: int,
    voters: int,
    client_class: type[KafkaRaftClient] = KafkaRaftClient,
    **options,
) -> Simulation:
    """Run one seed; on any failure raise SafetyViolation naming the seed and how to replay it."""
    sim = Simulation(seed, voters, client_class, **options)
    try:
        sim.run()
    except Exception as exc:
        trace = "\n  ".join(sim.trace)
        raise SafetyViolation(
            f"seed {seed}, {voters} voters, at {sim.clock.now_ms()} ms: "
            f"{type(exc).__name__}: {exc}\nreproduce: {reproduce_command(seed, voters)}\n"
            f"last events:\n  {trace}"
        ) from exc
    return sim
