"""Replica placement spreads leaders and followers like Kafka's assignReplicasToBrokers."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from minibroker.broker.controller.placement import assign_replicas


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize(("brokers", "partitions", "rf"), [(3, 1, 3), (3, 7, 2), (5, 12, 3)])
def test_replicas_are_distinct_live_brokers_led_by_the_first(seed, brokers, partitions, rf):
    ids = [10 * b for b in range(brokers)]  # ids need not be 0..n-1
    assignment = assign_replicas(ids, partitions, rf, random.Random(seed))
    assert len(assignment) == partitions
    for replicas in assignment:
        assert len(replicas) == rf and len(set(replicas)) == rf
        assert set(replicas) <= set(ids)


def test_within_a_topic_leaders_go_round_robin():
    """As many partitions as brokers: each broker leads exactly one."""
    for seed in range(50):
        leaders = [r[0] for r in assign_replicas([0, 1, 2, 3], 8, 3, random.Random(seed))]
        assert Counter(leaders) == {0: 2, 1: 2, 2: 2, 3: 2}


def test_across_topics_every_broker_leads_about_the_same():
    """Many one-partition topics: the leader (partition 0) is spread over all brokers."""
    rng = random.Random(7)
    leaders = Counter(assign_replicas([0, 1, 2], 1, 3, rng)[0][0] for _ in range(3000))
    assert set(leaders) == {0, 1, 2}
    assert all(900 <= count <= 1100 for count in leaders.values()), leaders


def test_partition_zero_is_not_always_on_the_same_broker():
    firsts = {tuple(assign_replicas([0, 1, 2], 3, 3, random.Random(s))[0]) for s in range(40)}
    assert {replicas[0] for replicas in firsts} == {0, 1, 2}


def test_followers_spread_too():
    """Followers of a broker's partitions are not always the same broker (the shift)."""
    rng = random.Random(3)
    followers = Counter()
    for _ in range(600):
        for replicas in assign_replicas([0, 1, 2, 3], 4, 2, rng):
            followers[(replicas[0], replicas[1])] += 1
    # Every leader has each of the 3 other brokers as follower, each about a third of the time.
    assert len(followers) == 12
    assert all(120 <= count <= 280 for count in followers.values()), followers


def test_the_shift_moves_after_each_round_of_brokers():
    """Kafka's rule: partitions n apart share a leader but not the same follower."""
    for seed in range(20):
        a = assign_replicas([0, 1, 2], 6, 2, random.Random(seed))
        assert a[0][0] == a[3][0] and a[0][1] != a[3][1]


def test_a_bad_replication_factor_is_refused():
    with pytest.raises(ValueError, match=r"replication factor 4 needs 1\.\.3 brokers"):
        assign_replicas([0, 1, 2], 1, 4)
