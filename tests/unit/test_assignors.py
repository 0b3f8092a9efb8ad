"""The consumer's assignors against Kafka's documented examples (the RangeAssignor and
RoundRobinAssignor javadocs), plus the properties every assignment must have."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from minibroker.client.assignors import (
    ASSIGNORS,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    range_assign,
    round_robin_assign,
)
from minibroker.client.records import TopicPartition


def tps(*names: str) -> list[TopicPartition]:
    """``"t0p1"`` -> TopicPartition("t0", 1)."""
    out = []
    for name in names:
        topic, partition = name.split("p")
        out.append(TopicPartition(topic, int(partition)))
    return out


BOTH = {"C0": ["t0", "t1"], "C1": ["t0", "t1"]}
THREE_EACH = {"t0": 3, "t1": 3}


def test_range_kafka_example():
    assert range_assign(BOTH, THREE_EACH) == {
        "C0": tps("t0p0", "t0p1", "t1p0", "t1p1"),
        "C1": tps("t0p2", "t1p2"),
    }


def test_round_robin_kafka_example():
    assert round_robin_assign(BOTH, THREE_EACH) == {
        "C0": tps("t0p0", "t0p2", "t1p1"),
        "C1": tps("t0p1", "t1p0", "t1p2"),
    }


def test_round_robin_kafka_example_with_different_subscriptions():
    """The javadoc's second case: C0 reads t0, C1 t0 and t1, C2 t0, t1 and t2 (1, 2 and 3
    partitions): a member is skipped for a topic it does not read."""
    subscriptions = {"C0": ["t0"], "C1": ["t0", "t1"], "C2": ["t0", "t1", "t2"]}
    assert round_robin_assign(subscriptions, {"t0": 1, "t1": 2, "t2": 3}) == {
        "C0": tps("t0p0"),
        "C1": tps("t1p0"),
        "C2": tps("t1p1", "t2p0", "t2p1", "t2p2"),
    }


def test_range_gives_the_first_members_one_more_and_skips_non_subscribers():
    subscriptions = {"C1": ["t0"], "C0": ["t0", "t1"], "C2": ["t0"]}  # order: by member id
    assert range_assign(subscriptions, {"t0": 5, "t1": 2}) == {
        "C0": tps("t0p0", "t0p1", "t1p0", "t1p1"),
        "C1": tps("t0p2", "t0p3"),
        "C2": tps("t0p4"),
    }


def test_members_beyond_the_partitions_get_nothing_and_unknown_topics_nothing():
    subscriptions = {"C0": ["t0", "gone"], "C1": ["t0"], "C2": ["t0"]}
    for assign in ASSIGNORS.values():
        plan = assign(subscriptions, {"t0": 2})
        assert sorted(map(len, plan.values())) == [0, 1, 1]


def test_subscription_and_assignment_bytes_round_trip():
    assert decode_subscription(encode_subscription(["b", "a"])) == ["a", "b"]
    assignment = tps("t1p2", "t0p1", "t0p0")
    assert sorted(decode_assignment(encode_assignment(assignment))) == sorted(assignment)
    assert decode_assignment(b"") == []


_topics = st.sampled_from(["t0", "t1", "t2", "t3"])
_cases = st.tuples(
    st.dictionaries(
        st.text("abcdef", min_size=1, max_size=4), st.lists(_topics, unique=True), max_size=6
    ),
    st.dictionaries(_topics, st.integers(0, 12)),
)


@given(_cases)
def test_every_partition_of_a_subscribed_topic_goes_to_exactly_one_subscriber(case):
    subscriptions, counts = case
    wanted = {
        TopicPartition(t, p)
        for t in {t for ts in subscriptions.values() for t in ts}
        for p in range(counts.get(t, 0))
    }
    for assign in ASSIGNORS.values():
        plan = assign(subscriptions, counts)
        assert set(plan) == set(subscriptions)
        given_out = [tp for owned in plan.values() for tp in owned]
        assert len(given_out) == len(set(given_out))  # no partition twice
        assert set(given_out) == wanted  # none missing
        for member, owned in plan.items():
            assert all(tp.topic in subscriptions[member] for tp in owned)


@given(_cases)
def test_range_shares_each_topic_within_one_partition(case):
    subscriptions, counts = case
    plan = range_assign(subscriptions, counts)
    for topic in {t for ts in subscriptions.values() for t in ts}:
        shares = [
            sum(tp.topic == topic for tp in plan[m])
            for m, ts in subscriptions.items()
            if topic in ts
        ]
        assert max(shares) - min(shares) <= 1
