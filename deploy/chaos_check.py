"""The chaos checker's judgement, as pure functions over a recorded history.

Kept apart from the runner so every rule can be tested on a doctored history (a planted
violation must be caught) without starting a cluster. The rules, after Jepsen's Kafka
checks, for acks=all with ISR >= min.insync.replicas:

- lost: a send acknowledged at (partition, offset) must be that record in the final log;
- unresolved: every send ends as an acknowledgement or an error, never silence;
- divergent: no offset holds different batches on different replicas;
- hw regression: a replica's high watermark never moves back within one process life;
- consumer gap: a consumer sees each partition's offsets in order, one by one, and what
  it saw (below the HW) is still there at the end;
- not healed: after the nemesis stops, every ISR is full again and every replica agrees.

With the idempotent producer (the default; ``History.idempotent``) two more, as Jepsen
checks them: a value twice in the final log is a ``duplicate``, and one producer's
records within a partition stored in another order than sent is a ``nonmonotonic_send``.

With the consumer-group workload (``History.group``) the rules of
``deploy.chaos_group_check`` are judged too; with the transactional workload
(``History.txn``), those of ``deploy.chaos_txn_check``.

Every violation is reported under the name of the rule that fired, and a history can
be saved to disk and judged again later (``save_history`` / ``load_history``).

A send that failed may still have been written (a timeout says nothing either way), so
"failed but present" is reported, not judged.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from minibroker.deploy import chaos_group_check, chaos_txn_check
from minibroker.deploy.chaos_group_check import GroupHistory
from minibroker.deploy.chaos_order import duplicates, nonmonotonic_sends
from minibroker.deploy.chaos_txn_check import TxnHistory

TP = tuple[str, int]


@dataclass
class Send:
    value: bytes
    partition: int
    outcome: str = "pending"  # "ok", "error" or (never answered) "pending"
    offset: int = -1
    error: str = ""


@dataclass
class History:
    topic: str
    sends: list[Send] = field(default_factory=list)
    # (partition, offset, value) in the order the live consumer saw them
    consumed: list[tuple[int, int, bytes]] = field(default_factory=list)
    # (broker, pid, partition) -> high watermarks in sampling order
    hw_samples: dict[tuple[int, int, int], list[int]] = field(default_factory=dict)
    # the final log read through the leaders: (partition, offset) -> value
    final: dict[tuple[int, int], bytes] = field(default_factory=dict)
    # per partition, per broker: [(base_offset, last_offset, crc), ...] from its segments
    replicas: dict[int, dict[int, list[tuple[int, int, int]]]] = field(default_factory=dict)
    healed: bool = True
    nemesis: dict[str, int] = field(default_factory=dict)
    # (seconds since the workload started, what happened): the nemesis' timeline
    events: list[tuple[float, str]] = field(default_factory=list)
    workload_s: float = 0.0  # how long the producers ran
    # Producers ran with enable.idempotence: duplicates and reordering are violations.
    idempotent: bool = True
    # The consumer-group workload's members and samples (None: no group workload ran).
    group: GroupHistory | None = None
    # The transactional workload's transactions and read_committed reads (None: not run).
    txn: TxnHistory | None = None


@dataclass
class Verdict:
    violations: dict[str, list[str]]
    counts: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def lines(self) -> list[str]:
        """Every violation, each prefixed with the rule that fired."""
        return [f"[{rule}] {item}" for rule, items in self.violations.items() for item in items]


def check(history: History) -> Verdict:
    found = {
        "lost": lost_writes(history),
        "unresolved": [
            f"{s.value.decode()} was never answered"
            for s in history.sends
            if s.outcome == "pending"
        ],
        "divergent": divergent_offsets(history.replicas),
        "hw_regressions": hw_regressions(history.hw_samples),
        "consumer_gaps": consumer_gaps(history.consumed, history.final),
        "not_healed": [] if history.healed else ["the cluster did not heal (full ISR, equal HW)"],
        "duplicate": duplicates(history.final) if history.idempotent else [],
        "nonmonotonic_send": nonmonotonic_sends(history.final) if history.idempotent else [],
    }
    if history.group is not None:
        acknowledged = {s.value.decode() for s in history.sends if s.outcome == "ok"}
        found |= chaos_group_check.check_groups(history.group, acknowledged)
    if history.txn is not None:
        found |= chaos_txn_check.check_txns(history.txn)
    present = set(history.final.values())
    by_outcome: dict[str, int] = defaultdict(int)
    for s in history.sends:
        by_outcome[s.outcome] += 1
    counts = {
        "sent": len(history.sends),
        "acknowledged": by_outcome["ok"],
        "failed": by_outcome["error"],
        "failed_but_present": sum(
            1 for s in history.sends if s.outcome == "error" and s.value in present
        ),
        "duplicates": len(history.final) - len(present),
        "consumed": len(history.consumed),
        "final_records": len(history.final),
        "hw_samples": sum(len(v) for v in history.hw_samples.values()),
        **{name: len(items) for name, items in found.items()},
        "nemesis": dict(history.nemesis),
        "acked_per_s": round(by_outcome["ok"] / history.workload_s) if history.workload_s else 0,
    }
    if history.group is not None:
        counts |= chaos_group_check.counts(history.group)
    if history.txn is not None:
        counts |= chaos_txn_check.counts(history.txn)
    counts["violations"] = sum(len(items) for items in found.values())
    return Verdict(found, counts)


def lost_writes(history: History) -> list[str]:
    out = []
    for s in history.sends:
        if s.outcome != "ok":
            continue
        there = history.final.get((s.partition, s.offset))
        if there != s.value:
            where = f"{history.topic}-{s.partition}@{s.offset}"
            now = "nothing" if there is None else repr(there.decode(errors="replace"))
            out.append(f"{s.value.decode()} acknowledged at {where}, which now holds {now}")
    return out


def divergent_offsets(replicas: dict[int, dict[int, list[tuple[int, int, int]]]]) -> list[str]:
    """Offsets covered by two replicas' batches that are not the same batch."""
    out = []
    for partition, by_broker in sorted(replicas.items()):
        owner: dict[int, tuple[int, tuple[int, int, int]]] = {}
        for broker, batches in sorted(by_broker.items()):
            for batch in batches:
                base, last, _crc = batch
                for offset in range(base, last + 1):
                    seen = owner.get(offset)
                    if seen is None:
                        owner[offset] = (broker, batch)
                    elif seen[1] != batch:
                        out.append(
                            f"partition {partition} offset {offset}: broker {seen[0]} has batch "
                            f"{seen[1]}, broker {broker} has {batch} (base, last, crc)"
                        )
                        break  # one line per diverging batch is enough
    return out


def hw_regressions(samples: dict[tuple[int, int, int], list[int]]) -> list[str]:
    out = []
    for (broker, pid, partition), hws in sorted(samples.items()):
        for before, after in pairwise(hws):
            if after < before:
                out.append(
                    f"broker {broker} (pid {pid}) partition {partition}: HW {before} -> {after}"
                )
                break
    return out


def consumer_gaps(
    consumed: list[tuple[int, int, bytes]], final: dict[tuple[int, int], bytes]
) -> list[str]:
    out = []
    expected: dict[int, int] = defaultdict(int)
    for partition, offset, value in consumed:
        if offset != expected[partition]:
            out.append(
                f"partition {partition}: consumer expected offset "
                f"{expected[partition]}, got {offset}"
            )
        elif final.get((partition, offset)) != value:
            out.append(
                f"partition {partition} offset {offset}: the consumer saw "
                f"{value!r}, the final log holds {final.get((partition, offset))!r}"
            )
        expected[partition] = offset + 1
    return out


# --- on disk: a failed run's history, judged again later ---------------------------------


def save_history(history: History, path: Path) -> None:
    """One JSON document, gzipped if ``path`` ends in .gz; values (unique ASCII by
    construction) are stored as text."""
    doc = {
        "topic": history.topic,
        "sends": [
            [s.value.decode(), s.partition, s.outcome, s.offset, s.error] for s in history.sends
        ],
        "consumed": [[p, o, v.decode()] for p, o, v in history.consumed],
        "hw_samples": [[*key, hws] for key, hws in history.hw_samples.items()],
        "final": [[p, o, v.decode()] for (p, o), v in history.final.items()],
        "replicas": [
            [p, b, [list(batch) for batch in batches]]
            for p, by_broker in history.replicas.items()
            for b, batches in by_broker.items()
        ],
        "healed": history.healed,
        "nemesis": history.nemesis,
        "events": history.events,
        "workload_s": history.workload_s,
        "idempotent": history.idempotent,
        "group": None if history.group is None else history.group.to_json(),
        "txn": None if history.txn is None else history.txn.to_json(),
    }
    data = json.dumps(doc).encode()
    Path(path).write_bytes(gzip.compress(data, 6) if str(path).endswith(".gz") else data)


def load_history(path: Path) -> History:
    raw = Path(path).read_bytes()
    doc = json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)
    h = History(doc["topic"])
    h.sends = [Send(v.encode(), p, outcome, o, e) for v, p, outcome, o, e in doc["sends"]]
    h.consumed = [(p, o, v.encode()) for p, o, v in doc["consumed"]]
    h.hw_samples = {(b, pid, p): hws for b, pid, p, hws in doc["hw_samples"]}
    h.final = {(p, o): v.encode() for p, o, v in doc["final"]}
    for p, b, batches in doc["replicas"]:
        h.replicas.setdefault(p, {})[b] = [tuple(batch) for batch in batches]
    h.healed = doc["healed"]
    h.nemesis = doc["nemesis"]
    h.events = [(t, text) for t, text in doc["events"]]
    h.workload_s = doc["workload_s"]
    h.idempotent = doc.get("idempotent", False)  # histories from before the rule
    if doc.get("group") is not None:
        h.group = GroupHistory.from_json(doc["group"])
    if doc.get("txn") is not None:
        h.txn = TxnHistory.from_json(doc["txn"])
    return h


# --- planted violations: prove the checker catches each kind ------------------------------

PLANTS = (
    "lose-ack",
    "diverge",
    "hw-regress",
    "consumer-gap",
    "silent",
    "duplicate",
    "reorder",
    *chaos_group_check.PLANTS,
    *chaos_txn_check.PLANTS,
)


def plant(history: History, kind: str) -> None:
    """Doctor a history so that exactly one rule must fire."""
    if kind == "lose-ack":
        s = next(s for s in history.sends if s.outcome == "ok")
        history.final.pop((s.partition, s.offset))
    elif kind == "diverge":
        by_broker = next(p for p in history.replicas.values() if len(p) > 1 and any(p.values()))
        broker = max(b for b, batches in by_broker.items() if batches)
        base, last, crc = by_broker[broker][0]
        by_broker[broker][0] = (base, last, crc ^ 1)
    elif kind == "hw-regress":
        hws = next(v for v in history.hw_samples.values() if v and v[-1] > 0)
        hws.append(hws[-1] - 1)
    elif kind == "consumer-gap":
        i = next(i for i, c in enumerate(history.consumed) if c[1] > 0)
        del history.consumed[i]
    elif kind == "silent":
        next(s for s in history.sends if s.outcome == "ok").outcome = "pending"
    elif kind == "duplicate":
        # The newest record of a partition stored again at its end: a retry stored twice.
        partition, offset = max(history.final)
        history.final[(partition, offset + 1)] = history.final[(partition, offset)]
    elif kind == "reorder":
        _swap_two_sends(history)
    elif kind in chaos_group_check.PLANTS:
        if history.group is None:
            raise ValueError(f"plant {kind!r} needs the group workload (--workload groups)")
        chaos_group_check.plant(history.group, kind)
    elif kind in chaos_txn_check.PLANTS:
        if history.txn is None:
            raise ValueError(
                f"plant {kind!r} needs the transactional workload (--workload transactions)"
            )
        chaos_txn_check.plant(history.txn, kind)
    else:
        raise ValueError(f"unknown plant {kind!r}; one of {', '.join(PLANTS)}")


def _swap_two_sends(history: History) -> None:
    """Two acknowledged records of one producer in one partition trade places everywhere
    (final log, acks, what the consumer saw): only their order is wrong."""
    by_key: dict[tuple[int, str], list[Send]] = defaultdict(list)
    for s in history.sends:
        if s.outcome == "ok":
            by_key[(s.partition, s.value.decode().rpartition("-")[0])].append(s)
    a, b = next(sends[:2] for sends in by_key.values() if len(sends) >= 2)
    a.offset, b.offset = b.offset, a.offset
    history.final[(a.partition, a.offset)] = a.value
    history.final[(b.partition, b.offset)] = b.value
    swapped = {a.offset: a.value, b.offset: b.value}
    history.consumed = [
        (p, o, swapped.get(o, v) if p == a.partition else v) for p, o, v in history.consumed
    ]
