"""The chaos checker's rules for consumer groups (``minibroker chaos --workload groups``),
pure functions over what the members logged and what the runner sampled, so each rule
can be tested on a doctored history.

- group_unconsumed: every acknowledged record was consumed by some member at least once
  (judged once the group has drained: committed = end offsets everywhere);
- commit_regression: a partition's committed offset, as sampled from the coordinator and
  as members saw their commits accepted, never moves backwards;
- double_owner: no two members own one partition in one generation at the same time
  (from the members' own assignment logs: assigned ... revoked/lost);
- ownerless: a member is handed partitions while it holds no generation (it would
  consume without membership: nobody fences it, another member gets the same records);
- duplicate_outside_window: a record consumed again by a member of a generation in
  which (or after which) a commit past it had been accepted: duplicates may only come
  from the uncommitted window a member held when it lost the partition;
- group_not_settled: after the last fault the group is Stable with every partition owned
  within session timeout + rebalance timeout, and then drains.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GroupHistory:
    members: int
    # every member's log lines (chaos_member.py), all members merged, in time order
    events: list[dict[str, Any]] = field(default_factory=list)
    # (wall time, partition, committed offset) sampled from the coordinator as it changed
    committed: list[tuple[float, int, int]] = field(default_factory=list)
    settle_s: float | None = None  # heal -> Stable with every partition owned (None: never)
    settle_bound_s: float = 0.0  # session.timeout.ms + rebalance timeout
    drained: bool = False  # committed reached the end offsets everywhere
    nemesis: dict[str, int] = field(default_factory=dict)  # member faults by kind
    clients: dict[str, str] = field(default_factory=dict)  # member name -> its client

    def to_json(self) -> dict[str, Any]:
        return {
            "members": self.members,
            "events": self.events,
            "committed": self.committed,
            "settle_s": self.settle_s,
            "settle_bound_s": self.settle_bound_s,
            "drained": self.drained,
            "nemesis": self.nemesis,
            "clients": self.clients,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> GroupHistory:
        g = cls(doc["members"], doc["events"], [tuple(c) for c in doc["committed"]])
        g.settle_s, g.settle_bound_s = doc["settle_s"], doc["settle_bound_s"]
        g.drained, g.nemesis = doc["drained"], doc["nemesis"]
        g.clients = doc.get("clients", {})  # (histories from before confluent-kafka members)
        return g


RULES = (
    "group_unconsumed",
    "commit_regression",
    "double_owner",
    "ownerless",
    "duplicate_outside_window",
    "group_not_settled",
)


def check_groups(group: GroupHistory, acknowledged: set[str]) -> dict[str, list[str]]:
    return {
        "group_unconsumed": unconsumed(group, acknowledged),
        "commit_regression": commit_regressions(group),
        "double_owner": double_owners(group),
        "ownerless": ownerless(group),
        "duplicate_outside_window": duplicates_outside_window(group),
        "group_not_settled": not_settled(group),
    }


def counts(group: GroupHistory) -> dict[str, Any]:
    consumed = [r for e in group.events if e["ev"] == "consumed" for r in e["recs"]]
    generations = {e["gen"] for e in group.events if e["ev"] == "assigned"}
    return {
        "group_consumed": len(consumed),
        "group_redelivered": len(consumed) - len({(p, o) for p, o, _ in consumed}),
        "group_generations": len(generations),
        "group_commits": sum(1 for e in group.events if e["ev"] == "committed"),
        "group_commit_failures": sum(1 for e in group.events if e["ev"] == "commit_failed"),
        "group_stale_answers_ignored": sum(
            1
            for e in group.events
            if e["ev"] == "client" and e.get("what") == "stale_group_answer_ignored"
        ),
        "group_settle_s": group.settle_s,
        "group_nemesis": dict(group.nemesis),
        # records consumed per client kind: every kind took part
        "group_consumed_by": {
            kind: sum(
                len(e["recs"])
                for e in group.events
                if e["ev"] == "consumed" and group.clients.get(e["m"]) == kind
            )
            for kind in sorted(set(group.clients.values()))
        },
    }


def unconsumed(group: GroupHistory, acknowledged: set[str]) -> list[str]:
    if not group.drained:
        return []  # reported as group_not_settled; what is missing proves nothing more
    seen = {v for e in group.events if e["ev"] == "consumed" for _, _, v in e["recs"]}
    return [f"{v} was acknowledged but no member consumed it" for v in sorted(acknowledged - seen)]


def _commits(group: GroupHistory) -> dict[int, list[tuple[float, int, int, str]]]:
    """Per partition: (time, offset, generation, member) of every commit a member saw
    accepted, in time order."""
    out: dict[int, list[tuple[float, int, int, str]]] = defaultdict(list)
    for e in group.events:
        if e["ev"] == "committed":
            for p, o in e["offsets"].items():
                out[int(p)].append((e["t"], o, e["gen"], e["m"]))
    return {p: sorted(v) for p, v in out.items()}


def commit_regressions(group: GroupHistory) -> list[str]:
    """Sampled from the coordinator, the committed offset only grows. (Members' own
    accepted commits may land in another order than their answers came back, so only
    the coordinator's samples are compared with each other.)"""
    out = []
    last: dict[int, tuple[float, int]] = {}
    for t, p, o in sorted(group.committed):
        before = last.get(p)
        if before is not None and o < before[1]:
            out.append(f"partition {p}: committed offset {before[1]} -> {o} at t={t:.3f}")
        last[p] = (t, o)
    return out


def _ownership(group: GroupHistory) -> list[tuple[str, int, int, float, float]]:
    """(member, partition, generation, from, until) from each member's own log."""
    out = []
    open_: dict[tuple[str, int], tuple[int, float]] = {}
    last_t: dict[str, float] = {}
    for e in group.events:
        m = e["m"]
        last_t[m] = e["t"]
        if e["ev"] == "assigned":
            for p in e["tps"]:
                if (m, p) in open_:  # assigned again without a revoke: the old one ends
                    gen, since = open_[(m, p)]
                    out.append((m, p, gen, since, e["t"]))
                open_[(m, p)] = (e["gen"], e["t"])
        elif e["ev"] in ("revoked", "lost"):
            for p in e["tps"]:
                if (m, p) in open_:
                    gen, since = open_.pop((m, p))
                    out.append((m, p, gen, since, e["t"]))
    for (m, p), (gen, since) in open_.items():
        out.append((m, p, gen, since, last_t[m]))
    return out


def double_owners(group: GroupHistory) -> list[str]:
    by_key: dict[tuple[int, int], list[tuple[str, float, float]]] = defaultdict(list)
    for m, p, gen, since, until in _ownership(group):
        if gen >= 0:
            by_key[(p, gen)].append((m, since, until))
    out = []
    for (p, gen), owners in sorted(by_key.items()):
        for i, (m1, s1, u1) in enumerate(owners):
            for m2, s2, u2 in owners[i + 1 :]:
                if m1 != m2 and s1 < u2 and s2 < u1:
                    out.append(
                        f"partition {p}, generation {gen}: owned by {m1} and by {m2} at once "
                        f"({max(s1, s2):.3f}..{min(u1, u2):.3f})"
                    )
    return out


def ownerless(group: GroupHistory) -> list[str]:
    return [
        f"{e['m']} was handed partitions {e['tps']} at t={e['t']:.3f} holding no generation "
        f"(member id {e['mid']!r}): it consumes without membership"
        for e in group.events
        if e["ev"] == "assigned" and e["tps"] and e["gen"] < 0
    ]


def duplicates_outside_window(group: GroupHistory) -> list[str]:
    """A record read again by a member of generation G after a commit past it was accepted
    in generation G or earlier: its position should have come from that commit. A member
    that lost its generation (-1) or holds an older one is a zombie reading its own
    uncommitted window (Kafka fences it at its next commit); a new owner reading what the
    old one never committed is the window the old owner lost. Both are allowed."""
    commits = _commits(group)
    first: dict[tuple[int, int], tuple[str, float]] = {}
    out = []
    for e in group.events:
        if e["ev"] != "consumed":
            continue
        for p, o, v in e["recs"]:
            if (p, o) not in first:
                first[(p, o)] = (e["m"], e["t"])
                continue
            if e["gen"] < 0:
                continue
            past = [
                (t, c, gen, who)
                for t, c, gen, who in commits.get(p, ())
                if t < e["t"] and c > o and gen <= e["gen"]
            ]
            if past:
                t, c, gen, who = past[0]
                by, when = first[(p, o)]
                out.append(
                    f"partition {p} offset {o} ({v}) consumed again by {e['m']} in generation "
                    f"{e['gen']} at t={e['t']:.3f} (first by {by} at {when:.3f}), though {who} "
                    f"had committed offset {c} in generation {gen} at {t:.3f}"
                )
    return out


def not_settled(group: GroupHistory) -> list[str]:
    out = []
    if group.settle_s is None:
        out.append("the group never became Stable with every partition owned after the faults")
    elif group.settle_s > group.settle_bound_s:
        out.append(
            f"the group took {group.settle_s:.1f}s to settle after the faults, more than "
            f"session timeout + rebalance timeout ({group.settle_bound_s:.1f}s)"
        )
    if not group.drained:
        out.append("the group's committed offsets never reached the end of the log")
    return out


# --- planted violations -------------------------------------------------------------------

PLANTS = ("double-owner", "commit-regress", "ownerless", "group-dup")


def plant(group: GroupHistory, kind: str) -> None:
    """Doctor a group history so that its rule must fire."""
    if kind == "double-owner":
        a = next(e for e in group.events if e["ev"] == "assigned" and e["tps"] and e["gen"] >= 0)
        other = next(e["m"] for e in group.events if e["m"] != a["m"])
        group.events.insert(group.events.index(a) + 1, {**a, "m": other, "mid": "planted"})
    elif kind == "commit-regress":
        t, p, o = max(c for c in group.committed if c[2] > 0)
        group.committed.append((t + 0.001, p, o - 1))
    elif kind == "ownerless":
        a = next(e for e in group.events if e["ev"] == "assigned" and e["tps"])
        a["gen"], a["mid"] = -1, ""
    elif kind == "group-dup":
        # The first committed record consumed again after its commit: outside any window.
        c = next(e for e in group.events if e["ev"] == "committed")
        p, o = next(iter(c["offsets"].items()))
        rec = next(
            r for e in group.events if e["ev"] == "consumed" for r in e["recs"]
            if r[0] == int(p) and r[1] == o - 1
        )  # fmt: skip
        group.events.append({**c, "t": group.events[-1]["t"] + 1, "ev": "consumed", "recs": [rec]})
    else:
        raise ValueError(f"unknown plant {kind!r}; one of {', '.join(PLANTS)}")
