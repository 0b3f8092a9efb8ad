"""Kafka's CooperativeStickyAssignor (AbstractStickyAssignor + KIP-429's adjustment).

Balanced: every member ends with as many partitions as any other it could trade with, give
or take one. Sticky: a partition stays with the member that owns it unless balance needs it
elsewhere, so a rebalance moves as few partitions as it can. Who owns what comes from the
subscriptions themselves (``owned_partitions`` and ``generation_id``, consumer protocol
v1+), not from the leader's memory: any member may lead the next generation.

Cooperative: a partition that changes hands is first taken from its owner and given to
nobody; the owner sees it revoked, rejoins, and the next generation gives it to its new
owner. So no partition is ever consumed by two members at once, and partitions that stay
put are never interrupted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from minibroker.client.records import TopicPartition

PartitionCounts = Mapping[str, int]  # topic -> partitions


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    """What a member said in JoinGroup: its topics, the partitions it owns now, and the
    generation in which it was given them (-1: none or unknown)."""

    topics: list[str]
    owned: list[TopicPartition] = field(default_factory=list)
    generation: int = -1


def current_owners(
    members: Mapping[str, MemberSubscription], counts: PartitionCounts
) -> dict[TopicPartition, str]:
    """Each partition's owner by the members' own claims, as Kafka's sticky assignor reads
    them. Only the newest generation's claims count: a member behind it missed a rebalance,
    so what it owned may be someone else's by now. A partition claimed twice within that
    generation is nobody's (neither claim can be trusted), and claims on partitions that are
    gone or of topics the member no longer reads are dropped."""
    newest = max((m.generation for m in members.values()), default=-1)
    owners: dict[TopicPartition, str] = {}
    contested: set[TopicPartition] = set()
    for member_id, member in members.items():
        if member.generation != newest:
            continue
        topics = set(member.topics)
        for tp in member.owned:
            if tp.topic not in topics or not 0 <= tp.partition < counts.get(tp.topic, 0):
                continue
            if owners.setdefault(tp, member_id) != member_id:
                contested.add(tp)
    for tp in contested:
        del owners[tp]
    return owners


def sticky_assign(
    members: Mapping[str, MemberSubscription], counts: PartitionCounts
) -> dict[str, list[TopicPartition]]:
    """The balanced assignment that moves the fewest owned partitions (eager: owners are
    handed their moves directly; see :func:`cooperative_sticky_assign`)."""
    owners = current_owners(members, counts)
    topics = sorted({t for m in members.values() for t in m.topics})
    partitions = [TopicPartition(t, p) for t in topics for p in range(counts.get(t, 0))]
    kept: dict[str, list[TopicPartition]] = {m: [] for m in members}
    for tp, member_id in owners.items():
        kept[member_id].append(tp)
    if len({frozenset(m.topics) for m in members.values()}) <= 1:
        plan = _constrained(kept, partitions)
    else:
        plan = _general(members, kept, partitions)
    return {m: sorted(tps) for m, tps in plan.items()}


def cooperative_sticky_assign(
    members: Mapping[str, MemberSubscription], counts: PartitionCounts
) -> dict[str, list[TopicPartition]]:
    """KIP-429: the sticky plan, minus every partition whose owner is about to lose it.
    Those go to nobody in this generation: their owners revoke them and rejoin, and the
    next generation (with the owners' claims gone) hands them to their new members."""
    owners = current_owners(members, counts)
    plan = sticky_assign(members, counts)
    return {m: [tp for tp in tps if owners.get(tp, m) == m] for m, tps in plan.items()}


def _constrained(
    kept: dict[str, list[TopicPartition]], partitions: list[TopicPartition]
) -> dict[str, list[TopicPartition]]:
    """Every member reads the same topics (the common case): each ends with
    ``len(partitions) // members`` or one more, and keeps as many of its own as that
    allows (Kafka's constrainedAssign)."""
    if not kept:
        return {}
    quota, extra = divmod(len(partitions), len(kept))
    plan: dict[str, list[TopicPartition]] = {}
    # Members that own the most keep the most: each of the `extra` larger shares given to
    # an owner of more than `quota` is one partition fewer to move.
    for member_id in sorted(kept, key=lambda m: (-len(kept[m]), m)):
        share = quota + 1 if extra and len(kept[member_id]) > quota else quota
        if share > quota:
            extra -= 1
        plan[member_id] = sorted(kept[member_id])[:share]
    taken = {tp for tps in plan.values() for tp in tps}
    free = [tp for tp in partitions if tp not in taken]
    # Fill to the quota first, then the remaining larger shares, fewest-held first.
    for limit in (quota, quota + 1):
        for member_id in sorted(plan, key=lambda m: (len(plan[m]), m)):
            while free and len(plan[member_id]) < limit and (limit == quota or extra > 0):
                plan[member_id].append(free.pop(0))
                if len(plan[member_id]) > quota:
                    extra -= 1
    return plan


def _general(
    members: Mapping[str, MemberSubscription],
    kept: dict[str, list[TopicPartition]],
    partitions: list[TopicPartition],
) -> dict[str, list[TopicPartition]]:
    """Members read different topics: hand out the free partitions to the least loaded
    member that reads them (partitions with the fewest candidates first), then move
    partitions from a member to a candidate holding at least two fewer until none can
    move: then no member could take a partition from one that holds more than one more
    (Kafka's isBalanced). Each move lowers the sum of squared loads, so this ends; only
    moves that balance are made, so owners keep the rest."""
    readers: dict[str, list[str]] = {}
    for member_id in sorted(members):
        for topic in members[member_id].topics:
            readers.setdefault(topic, []).append(member_id)
    plan = {m: set(tps) for m, tps in kept.items()}
    holder = {tp: m for m, tps in plan.items() for tp in tps}
    free = [tp for tp in partitions if tp not in holder]
    free.sort(key=lambda tp: len(readers[tp.topic]))
    for tp in free:
        member_id = min(readers[tp.topic], key=lambda m: (len(plan[m]), m))
        plan[member_id].add(tp)
        holder[tp] = member_id
    moved = True
    while moved:
        moved = False
        for tp in partitions:
            source = holder[tp]
            target = min(readers[tp.topic], key=lambda m: (len(plan[m]), m))
            if len(plan[source]) - len(plan[target]) >= 2:
                plan[source].discard(tp)
                plan[target].add(tp)
                holder[tp] = target
                moved = True
    return {m: list(tps) for m, tps in plan.items()}
