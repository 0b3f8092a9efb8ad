"""The chaos nemesis' schedule: which fault, on which broker, when; reproducible by seed.

One fault at a time, 1-3.5 s each, so a majority of the brokers always stays up and
connected. Kinds: ``pause`` (SIGSTOP, then resume), ``kill`` (SIGKILL, then restart)
and ``isolate`` (a network partition, ``deploy/isolation.py``, then heal). A victim is
a broker id or ``CONTROLLER``: whichever broker is the active controller when the
fault starts (the quorum elects another while it is down or cut off), or, with the
group workload, ``COORDINATOR``: whichever broker coordinates the consumer group then;
with the transactional workload, ``TXN_COORDINATOR`` (the coordinator of a chaos
producer's transactional id then) or ``TXN_LEADER`` (the leader of a partition its
transactions write to then).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from minibroker.protocol import ApiKey

PROCESS_FAULTS = ("pause", "kill")
FAULT_KINDS = ("pause", "kill", "isolate")
# The group workload adds two. fail-heartbeats: the group's coordinator answers every
# Heartbeat NOT_COORDINATOR (as while its group moves), so members' heartbeats sit in
# their retry loop, still carrying the generation they were sent for, while rebalances
# go on. slow-heartbeats: the coordinator holds every Heartbeat and SyncGroup request
# SLOW_GROUP_REQUEST_MS before handling it (faults delay-request) while a member leaves
# and, once that rebalance is over, a new one joins (chaos_groups.REJOIN_AFTER_S): a heartbeat a member sent for generation N, just
# before its own join, is judged after that join completed N+1 (ILLEGAL_GENERATION) and
# answered while the member still waits for its SyncGroup (issue 35's interleaving, made
# on purpose).
GROUP_FAULT_KINDS = (*FAULT_KINDS, "fail-heartbeats", "slow-heartbeats")
# The transactional workload adds one. slow-commits: a transaction coordinator holds
# every EndTxn request SLOW_COMMIT_MS before handling it (faults delay-request), longer
# than librdkafka's socket.timeout.ms: its commit times out and is sent again while the
# first is still being judged, and may give up (an unknown outcome); the bundled
# producer waits up to max.block.ms.
TXN_FAULT_KINDS = (*FAULT_KINDS, "slow-commits")
UNDO = {
    "pause": "resume",
    "kill": "restart",
    "isolate": "heal",
    "fail-heartbeats": "heal",
    "slow-heartbeats": "heal",
    "slow-commits": "heal",
}
# Under request.timeout.ms (3 s) and heartbeat.interval.ms + this under session.timeout.ms
# (4 s) of the chaos members, so the delay alone neither times requests out nor expires
# anyone; longer than members take to rejoin once told to (their batches' work, up to
# 0.5 s), so a heartbeat sent just before a join is judged after it completed, and
# answered while SyncGroup, held as long, has not been.
SLOW_GROUP_REQUEST_MS = 1500
SLOW_COMMIT_MS = 2500  # over the chaos producers' request.timeout.ms (2 s)
# The delay-request faults: which APIs the victim holds, and how long.
SLOW_REQUESTS = {
    "slow-heartbeats": ((ApiKey.HEARTBEAT, ApiKey.SYNC_GROUP), SLOW_GROUP_REQUEST_MS),
    "slow-commits": ((ApiKey.END_TXN,), SLOW_COMMIT_MS),
}
CONTROLLER = -1  # a planned victim resolved, when its fault starts, to the active controller
COORDINATOR = -2  # ... to the broker coordinating the consumer group (group workload)
TXN_COORDINATOR = -3  # ... to a transactional id's coordinator (transactional workload)
TXN_LEADER = -4  # ... to the leader of a partition the transactions write to
# Any voter can take over as controller, so the nemesis targets the active controller by
# default (``--spare-controller`` turns it off).
CONTROLLER_FAILOVER = True


@dataclass(frozen=True)
class Fault:
    start_s: float
    end_s: float
    kind: str  # "pause" (then resume), "kill" (then restart) or "isolate" (then heal)
    broker: int  # or CONTROLLER: whichever broker is the active controller at start_s
    peers: tuple[int, ...] | None = None  # isolate: cut off from these (None: all others)


def plan_nemesis(
    seed: int,
    duration_s: float,
    victims: Sequence[int],
    kinds: Sequence[str] = PROCESS_FAULTS,
    brokers: int | None = None,
) -> list[Fault]:
    """A reproducible schedule: one fault at a time, each 1-3.5 s (fail-heartbeats up to
    7.5 s, slow-heartbeats 3-8.5 s, slow-commits 2-7.5 s), gaps of 0.5-2 s.

    ``brokers`` (the cluster size) lets a third of the isolates cut the victim off from a
    random part of the others only; the rest cut it off from all of them.
    """
    rng = random.Random(seed)
    faults = []
    t = rng.uniform(0.5, 1.5)
    while victims and t < duration_s - 1.0:
        end = min(t + rng.uniform(1.0, 3.5), duration_s)
        kind, victim = rng.choice(kinds), rng.choice(victims)
        if kind == "fail-heartbeats":
            victim = COORDINATOR  # only the coordinator answers heartbeats
            # Often past the members' session timeout: they are dropped, learn it from a
            # refused commit and rejoin while a heartbeat of their old membership still
            # waits in its retry loop (issue 35's interleaving).
            end = min(end + rng.uniform(0.0, 4.0), duration_s)
        elif kind == "slow-commits":
            victim = TXN_COORDINATOR  # only a transaction coordinator answers EndTxn
            end = min(end + rng.uniform(1.0, 4.0), duration_s)  # several commits held
        elif kind == "slow-heartbeats":
            victim = COORDINATOR
            # Long enough for the leave's rebalance and the newcomer's.
            end = min(end + rng.uniform(2.0, 5.0), duration_s)
        peers = None
        partial = kind == "isolate" and victim >= 0 and (brokers or 0) >= 3
        if partial and rng.random() < 1 / 3:
            others = [b for b in range(brokers) if b != victim]
            peers = tuple(sorted(rng.sample(others, rng.randint(1, len(others) - 1))))
        faults.append(Fault(round(t, 2), round(end, 2), kind, victim, peers))
        t = end + rng.uniform(0.5, 2.0)
    return faults


def victims_for(
    brokers: int,
    controller: int,
    target_controller: bool,
    coordinator: bool = False,
    transactions: bool = False,
) -> list[int]:
    """Every broker but the controller; or every broker and, as one more choice, the
    active controller whoever it is then; ``coordinator``: also (twice as likely as any
    one broker) whichever broker coordinates the consumer group then; ``transactions``:
    also (as likely) a transaction coordinator, and a transactional partition's leader."""
    extra = [COORDINATOR, COORDINATOR] if coordinator else []
    if transactions:
        extra += [TXN_COORDINATOR, TXN_COORDINATOR, TXN_LEADER]
    if target_controller:
        return [*range(brokers), CONTROLLER, *extra]
    return [b for b in range(brokers) if b != controller] + extra
