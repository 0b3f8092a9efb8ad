"""The consumer-group workload of ``minibroker chaos --workload groups``: member processes
(deploy/chaos_member.py) that consume and commit while the nemesis faults brokers (the
group's coordinator among them) and pauses members; then the group must settle and drain.

What it records goes into ``chaos_group_check.GroupHistory``: the members' own logs, the
committed offsets sampled from the coordinator, how long the group took to settle after
the cluster healed, and whether it drained (committed = end offsets everywhere).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from minibroker.client import Admin
from minibroker.deploy.chaos_group_check import GroupHistory
from minibroker.deploy.chaos_member import MEMBER
from minibroker.protocol import LATEST_TIMESTAMP
from minibroker.protocol.errors import KafkaError

GROUP = "chaos-group"
# Lets the members' short session timeout through and rebalances without waiting.
GROUP_BROKER_CONFIG = {
    "group.min.session.timeout.ms": "1000",
    "group.initial.rebalance.delay.ms": "0",
}
BUNDLED, CONFLUENT = "bundled", "confluent-kafka"  # the members' clients
SETTLE_BOUND_S = (MEMBER["session.timeout.ms"] + MEMBER["max.poll.interval.ms"]) / 1000
DRAIN_TIMEOUT_S = 60.0
# A bounced member's successor starts this long after it left: after the rebalance its
# leave began (two slow-heartbeats hold times and the members' rejoin) is over.
REJOIN_AFTER_S = 4.0


MEMBER_FAULTS = ("pause", "kill")


@dataclass(frozen=True)
class MemberFault:
    start_s: float
    end_s: float
    member: int
    kind: str = "pause"  # "pause" (SIGSTOP, then SIGCONT) or "kill" (SIGKILL, then a new process)


def plan_member_faults(seed: int, duration_s: float, members: int) -> list[MemberFault]:
    """One member faulted at a time for 1-6 s (a pause past the 4 s session timeout about
    half the time), gaps of 1-4 s; a quarter of them kill the member (its successor joins as
    a new member). Its own random stream, so the brokers' schedule is unchanged."""
    rng = random.Random(f"members-{seed}")
    out = []
    t = rng.uniform(1.0, 3.0)
    while members and t < duration_s - 1.0:
        end = min(t + rng.uniform(1.0, 6.0), duration_s)
        kind = "kill" if rng.random() < 0.25 else "pause"
        out.append(MemberFault(round(t, 2), round(end, 2), rng.randrange(members), kind))
        t = end + rng.uniform(1.0, 4.0)
    return out


class GroupWorkload:
    def __init__(
        self,
        data_dir: Path,
        bootstrap: str,
        topic: str,
        partitions: int,
        members: int,
        seed: int,
        duration_s: float,
        log: Callable[[str], None],
        confluent: int = 0,
        kafka_bootstrap: str = "",
    ) -> None:
        """The last ``confluent`` of the ``members`` are confluent-kafka consumers
        (chaos_member_rdkafka.py) on the Kafka listeners at ``kafka_bootstrap``."""
        self.dir = data_dir / "members"
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.kafka_bootstrap = kafka_bootstrap
        self.log = log
        self.history = GroupHistory(members, settle_bound_s=SETTLE_BOUND_S)
        self.history.clients = {
            f"m{i}": CONFLUENT if i >= members - confluent else BUNDLED for i in range(members)
        }
        self.schedule = plan_member_faults(seed, duration_s, members)
        self.procs: list[subprocess.Popen] = []
        self.rng = random.Random(f"bounce-{seed}")
        self.busy: set[int] = set()  # members being bounced
        self._at: Callable[[float], float] | None = None  # a run offset as trio time

    async def start(self, admin: Admin, timeout_s: float = 60) -> None:
        """Start every member and wait (bounded) for the group to be Stable with all of
        them, so the nemesis does not fault a group that is still forming."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.procs = [self._spawn(i) for i in range(self.history.members)]
        with trio.move_on_after(timeout_s):
            while not await self._stable(admin):
                await trio.sleep(0.2)
            self.log(f"group {GROUP}: {self.history.members} members, Stable")
            return
        self.log(f"group {GROUP} not Stable with every member after {timeout_s}s; going on")

    def _spawn(self, i: int) -> subprocess.Popen:
        name = f"m{i}"
        if self.history.clients[name] == CONFLUENT:
            args = [sys.executable, "-m", "minibroker.deploy.chaos_member_rdkafka"]
            args.append(self.kafka_bootstrap)
        else:
            args = [sys.executable, "-m", "minibroker.deploy.chaos_member", self.bootstrap]
        args += [GROUP, self.topic, name, str(self.dir / f"{name}.jsonl")]
        with open(self.dir / f"{name}.out", "a") as out:
            return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

    async def nemesis(self, at: Callable[[float], float]) -> None:
        """Pause/resume or kill/restart members on schedule (``at``: a run offset as trio
        time)."""
        counts = self.history.nemesis
        self._at = at
        for f in self.schedule:
            await trio.sleep_until(at(f.start_s))
            if f.member in self.busy:
                self.log(f"nemesis: {f.kind} member m{f.member} skipped: it is being bounced")
                continue
            self.log(f"nemesis: {f.kind} member m{f.member}")
            proc = self.procs[f.member]
            proc.send_signal(signal.SIGSTOP if f.kind == "pause" else signal.SIGKILL)
            counts[f"{f.kind}_member"] = counts.get(f"{f.kind}_member", 0) + 1
            await trio.sleep_until(at(f.end_s))
            if f.kind == "pause":
                self.log(f"nemesis: resume member m{f.member}")
                proc.send_signal(signal.SIGCONT)
            else:
                await trio.to_thread.run_sync(proc.wait)
                self.log(f"nemesis: restart member m{f.member}")
                self.procs[f.member] = self._spawn(f.member)

    async def bounce(self) -> bool:
        """A member leaves (SIGTERM: it sends LeaveGroup) and, REJOIN_AFTER_S later, a new
        process takes its place: two rebalances, one after the other (a newcomer joining
        while the first is completing would start it over). Only a member the member
        nemesis is not faulting (a paused one would not leave). False: none was free."""
        now, at = trio.current_time(), self._at
        faulted = {f.member for f in self.schedule if at and at(f.start_s) <= now <= at(f.end_s)}
        free = [i for i in range(self.history.members) if i not in faulted | self.busy]
        if not free:
            self.log("nemesis: bounce skipped: every member is faulted")
            return False
        i = self.rng.choice(free)
        self.busy.add(i)
        try:
            self.log(f"nemesis: bounce member m{i} (leave, then a new process joins)")
            proc = self.procs[i]
            proc.send_signal(signal.SIGTERM)
            await trio.to_thread.run_sync(proc.wait)
            await trio.sleep(REJOIN_AFTER_S)
            self.log(f"nemesis: a new process for member m{i} joins")
            self.procs[i] = self._spawn(i)
            counts = self.history.nemesis
            counts["bounce_member"] = counts.get("bounce_member", 0) + 1
        finally:
            self.busy.discard(i)
        return True

    async def sample_commits(self, admin: Admin, stop: trio.Event) -> None:
        while not stop.is_set():
            await self._sample(admin)
            await trio.sleep(0.2)

    async def _sample(self, admin: Admin) -> dict[int, int]:
        """The coordinator's committed offsets, recorded when they change."""
        try:
            with trio.move_on_after(2):
                found = await admin.list_consumer_group_offsets(GROUP)
                now = time.time()
                last = self._last_committed()
                for tp, offset in sorted(found.items()):
                    if tp.topic == self.topic and offset >= 0 and last.get(tp.partition) != offset:
                        self.history.committed.append((now, tp.partition, offset))
        except KafkaError:
            pass
        return self._last_committed()

    def _last_committed(self) -> dict[int, int]:
        return {p: o for _, p, o in self.history.committed}

    async def settle(self, admin: Admin) -> None:
        """After the heal: how long until the group is Stable with every member and every
        partition owned; then wait for it to drain (committed = end offsets)."""
        for proc in self.procs:
            proc.send_signal(signal.SIGCONT)  # in case the run ended mid-pause
        healed = time.monotonic()
        with trio.move_on_after(self.history.settle_bound_s * 3):
            while not await self._stable(admin):
                await self._sample(admin)
                await trio.sleep(0.2)
            self.history.settle_s = round(time.monotonic() - healed, 3)
        self.log(f"group settled after {self.history.settle_s}s")
        latest = {(self.topic, p): LATEST_TIMESTAMP for p in range(self.partitions)}
        ends = {tp.partition: o.offset for tp, o in (await admin.list_offsets(latest)).items()}
        with trio.move_on_after(DRAIN_TIMEOUT_S):
            while (await self._sample(admin)) != ends:
                await trio.sleep(0.2)
            self.history.drained = True
        self.log(f"group drained: {self.history.drained} (end offsets {ends})")

    async def _stable(self, admin: Admin) -> bool:
        try:
            with trio.move_on_after(2):
                g = await admin.describe_consumer_group(GROUP)
                owned = sorted(tp.partition for m in g.members for tp in m.assignment)
                return (
                    g.state == "Stable"
                    and len(g.members) == self.history.members
                    and owned == list(range(self.partitions))
                )
        except KafkaError:
            pass
        return False

    def stop(self) -> None:
        """SIGTERM every member (they leave the group), then read their logs."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        events = []
        for i in range(self.history.members):
            path = self.dir / f"m{i}.jsonl"
            if path.exists():
                events += _lines(path)
        self.history.events = sorted(events, key=lambda e: e["t"])


def _lines(path: Path) -> list[dict]:
    """A member's log; a line cut short (the member was killed mid-write) is dropped."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
