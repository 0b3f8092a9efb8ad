"""Kafka's murmur2 partitioning (same partition as a Java producer) and sticky null keys."""

from collections import Counter

import pytest

from minibroker.client.partitioner import StickyPartitioner, key_partition, murmur2


def _signed(x: int) -> int:
    return x - 2**32 if x >= 2**31 else x


# Vectors from Kafka's UtilsTest.testMurmur2.
@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("21", -973932308),
        ("foobar", -790332482),
        ("a-little-bit-long-string", -985981536),
        ("a-little-bit-longer-string", -1486304829),
        ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        ("abc", 479470107),
    ],
)
def test_murmur2_matches_kafka(key, expected):
    assert _signed(murmur2(key.encode())) == expected


def test_key_partition_is_stable_and_in_range():
    for n in (1, 3, 7, 100):
        for i in range(200):
            key = f"key-{i}".encode()
            p = key_partition(key, n)
            assert 0 <= p < n
            assert key_partition(key, n) == p


def test_keyed_records_ignore_stickiness():
    part = StickyPartitioner(batch_size=100)
    assert {part.partition("t", b"k", 10, 50) for _ in range(20)} == {key_partition(b"k", 10)}


def test_null_keys_stick_for_a_batch_then_move_on():
    part = StickyPartitioner(batch_size=1000)
    picks = [part.partition("t", None, 4, 100) for _ in range(40)]
    # 10 records of 100 bytes fill a batch: runs of 10 on one partition, then the next.
    runs = [picks[i : i + 10] for i in range(0, 40, 10)]
    assert all(len(set(run)) == 1 for run in runs)
    assert len({run[0] for run in runs}) == 4
    assert Counter(picks) == Counter({p: 10 for p in range(4)})


def test_sticky_partition_survives_a_shrunk_partition_count():
    part = StickyPartitioner(batch_size=1000)
    for _ in range(5):
        part.partition("t", None, 8, 10)
    assert 0 <= part.partition("t", None, 2, 10) < 2


def test_a_seed_places_null_keys_the_same_way_every_time():
    """A rerun of a writer with a fixed identity must put each record where it went before."""
    runs = [
        [StickyPartitioner(1000, seed=12345).partition("t", None, 5, 90) for _ in range(30)]
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    starts = {StickyPartitioner(1000, seed=s).partition("t", None, 5, 90) for s in range(10)}
    assert len(starts) == 5  # different seeds spread writers over the partitions
