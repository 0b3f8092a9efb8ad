"""How many partitions a broker can hold open: derived from its file-descriptor limit.

At rest a partition costs one descriptor (its active segment's log file; indexes are
opened only to be written, sealed segments share a small LRU). A broker also needs
descriptors for connections, sealed-segment reads and its own files, so a fixed
headroom is kept aside. Kafka has no such check (operators size ``ulimit -n`` by hand);
here a CreateTopics that would run a broker out of descriptors is refused before
anything is saved, instead of a broker that stops accepting connections and then
cannot restart.
"""

from __future__ import annotations

import math
import resource
from collections.abc import Iterable

from minibroker.broker.storage.segment import MAX_OPEN_SEALED

FDS_PER_PARTITION = 1
# Connections, sealed-segment reads, metadata and checkpoint files, the lock file, logs.
HEADROOM_FDS = 256 + MAX_OPEN_SEALED


def fd_limit() -> int:
    """This process's soft RLIMIT_NOFILE (a large number when unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 2**31 - 1 if soft == resource.RLIM_INFINITY else soft


def partition_cap(limit: int | None = None) -> int:
    """Partitions one broker may host under ``limit`` descriptors (at least 1)."""
    limit = fd_limit() if limit is None else limit
    return max(1, (limit - HEADROOM_FDS) // FDS_PER_PARTITION)


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
    limit = fd_limit() if limit is None else limit
    cap = partition_cap(limit)
    added = math.ceil(num_partitions * replication_factor / len(counts))
    busiest = max(counts, key=lambda b: counts[b])
    if counts[busiest] + added <= cap:
        return None
    return (
        f"the topic would put {counts[busiest] + added} partition replicas on broker {busiest}, "
        f"over its cap of {cap} derived from the open-file limit (ulimit -n = {limit}, "
        f"{HEADROOM_FDS} kept for connections and files); raise it with `ulimit -n` "
        "before starting the brokers, or use fewer partitions"
    )
