"""How many partitions a broker can hold open: its share of the descriptor budget.

broker/common/descriptors.py splits the file-descriptor limit between the broker's own
files, its links to other brokers, connections and partitions; a partition costs one
descriptor at rest (its active segment's log file). Kafka has no such check (operators
size ``ulimit -n`` by hand); here a CreateTopics that would run a broker out of
descriptors is refused (POLICY_VIOLATION) before anything is saved, instead of a
broker that stops accepting connections and then cannot restart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from minibroker.broker.common.descriptors import descriptor_budget, fd_limit

__all__ = ["fd_limit", "partition_cap", "partition_cap_error", "replica_counts"]


def partition_cap(limit: int | None = None, brokers: int = 1) -> int:
    """Partitions one broker may host under ``limit`` descriptors (at least 1)."""
    return descriptor_budget(brokers, limit=limit).partitions


def replica_counts(hosted: Iterable[list[int]], brokers: Iterable[int]) -> dict[int, int]:
    """Partition replicas each of ``brokers`` hosts, from every partition's replica list.

    Counted once per CreateTopics and kept up to date as its topics are placed: counting
    per topic made a 2,000-topic request quadratic (2 s of the controller's loop)."""
    counts = dict.fromkeys(brokers, 0)
    for replicas in hosted:
        for broker in replicas:
            if broker in counts:
                counts[broker] += 1
    return counts


def partition_cap_error(
    counts: dict[int, int],
    num_partitions: int,
    replication_factor: int,
    limit: int | None = None,
) -> str | None:
    """Why a new topic would push a broker over its cap, or None if it fits.

    ``counts`` is each live broker's hosted replicas (``replica_counts``). New replicas are
    spread round-robin, so no broker gets more than ceil(partitions * rf / brokers).
    The controller's own limit stands for every broker's (a local cluster shares one
    machine and one ulimit).
    """
    if not counts:
        return None
    budget = descriptor_budget(len(counts), limit=limit)
    cap = budget.partitions
    added = math.ceil(num_partitions * replication_factor / len(counts))
    busiest = max(counts, key=lambda b: counts[b])
    if counts[busiest] + added <= cap:
        return None
    return (
        f"the topic would put {counts[busiest] + added} partition replicas on broker {busiest}, "
        f"over its cap of {cap} (ulimit -n = {budget.limit}, less {budget.connection_floor} kept "
        f"for connections, {budget.headroom} headroom and {budget.reserved} for its own files): raise `ulimit -n` before "
        "starting the brokers, or use fewer partitions"
    )
