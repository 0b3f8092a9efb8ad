"""Replica placement for a new topic, after Kafka's ``AdminUtils.assignReplicasToBrokers``.

Why not "partition i on broker i": every topic's partition 0 would be led by the
same broker (today also the controller), so one-partition topics all pile on it and
the first failover anyone tries kills the controller too. Kafka (rack-unaware)
picks, per topic, a random *start index* (where the first leader lands) and a
random *replica shift* (how far the followers sit from their leader, bumped after
each full round of brokers so that followers spread too). Across topics, leaders
and followers are then spread evenly in expectation; within a topic, leaders go
round-robin from the start index, so a topic with as many partitions as brokers
has each broker lead exactly one.

Pure: the caller passes the randomness (tests pass a seeded ``random.Random``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol


class _Rng(Protocol):
    def randrange(self, stop: int, /) -> int: ...


def assign_replicas(
    brokers: Sequence[int], num_partitions: int, replication_factor: int, rng: _Rng = random
) -> list[list[int]]:
    """Per partition, its replicas (distinct broker ids; the first one is the leader).

    ``brokers``: the live broker ids (any order; they are sorted so the result
    depends on the randomness alone). Needs ``1 <= replication_factor <= len(brokers)``.
    """
    ids = sorted(brokers)
    n = len(ids)
    if not 1 <= replication_factor <= n:
        raise ValueError(f"replication factor {replication_factor} needs 1..{n} brokers")
    start = rng.randrange(n)
    # Kafka draws the shift from 0..n-1 and uses it mod n-1, which makes shift 0 twice as
    # likely as the others; drawing from 0..n-2 spreads followers evenly.
    shift = rng.randrange(max(n - 1, 1))
    assignment = []
    for partition in range(num_partitions):
        if partition > 0 and partition % n == 0:
            # A full round of leaders done: move the followers so they spread as well.
            shift += 1
        first = (partition + start) % n
        replicas = [ids[first]]
        for j in range(replication_factor - 1):
            replicas.append(ids[_follower_index(first, shift, j, n)])
        assignment.append(replicas)
    return assignment


def _follower_index(first: int, shift: int, j: int, n: int) -> int:
    """Kafka's replicaIndex: the j-th follower sits 1..n-1 places after the leader, never on it."""
    return (first + 1 + (shift + j) % (n - 1)) % n
