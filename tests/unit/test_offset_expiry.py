"""Offset expiry (offsets.retention.minutes, KIP-211) on a manual clock: a group with
members never loses its offsets, an Empty one loses them retention after it emptied, a
group that never had members loses each offset retention after its commit; expired
offsets and deleted groups are tombstones that a new coordinator's load respects."""

from __future__ import annotations

import trio

from minibroker.broker.coordinator import OFFSETS_TOPIC, GroupState
from tests.unit.test_group_coordinator import Harness, _body

RETENTION_MIN = 60
RETENTION = RETENTION_MIN * 60_000
WALL_START = 1_700_000_000_000


def harness(tmp_path, tasks=None, minutes: int = RETENTION_MIN) -> Harness:
    h = Harness(tmp_path, tasks=tasks, **{"offsets.retention.minutes": minutes})
    # Commit timestamps and expiry read one wall clock, moved by the manual clock.
    wall = lambda: WALL_START + h.clock.now_ms()  # noqa: E731
    h.service.manager.now_ms_wall = wall
    h.service.expiry.wall_ms = wall
    h.service.manager.owned[0] = 1
    return h


def test_offsets_of_a_group_without_members_expire_after_their_commit(tmp_path) -> None:
    h = harness(tmp_path)
    assert (
        _body(h.commit("", -1, {("t", 0): 7}, group="simple"))["topics"][0]["partitions"][0][
            "error_code"
        ]
        == 0
    )
    h.clock.advance(RETENTION // 2)
    h.commit("", -1, {("t", 1): 9}, group="simple")
    h.clock.advance(RETENTION // 2 - 1)
    assert h.service.expiry.cleanup() == (0, 0)
    h.clock.advance(1)
    # t-0 is now retention old; t-1 is not: only it stays, and so does the group.
    assert h.service.expiry.cleanup() == (1, 0)
    assert h.fetch_offsets("simple") == {("t", 1): 9}
    h.clock.advance(RETENTION // 2)
    assert h.service.expiry.cleanup() == (1, 1)
    assert "simple" not in h.groups
    assert h.fetch_offsets("simple") == {}
    h.rm.close()


def test_a_group_with_members_keeps_its_offsets_until_retention_after_it_empties(
    tmp_path,
) -> None:
    h = harness(tmp_path, minutes=1)
    (a, b), gen = h.stable_group(2)
    h.commit(a, gen, {("t", 0): 3})
    # Old commits, but the group is alive (KIP-211): its members heartbeat on.
    for _ in range(3 * 60_000 // 5000):
        h.clock.advance(5000)
        assert h.heartbeat(a, gen) == 0 and h.heartbeat(b, gen) == 0
    assert h.service.expiry.cleanup() == (0, 0)
    assert h.fetch_offsets() == {("t", 0): 3}
    h.leave(a, b)
    assert h.state() is GroupState.EMPTY
    h.clock.advance(60_000 - 1)
    assert h.service.expiry.cleanup() == (0, 0)
    h.clock.advance(1)
    assert h.service.expiry.cleanup() == (1, 1)
    assert "g" not in h.groups
    stats = h.service.stats()
    assert (stats["offsets_expired"], stats["groups_expired"]) == (1, 1)
    h.rm.close()


async def test_tombstones_are_what_a_new_coordinator_loads(tmp_path) -> None:
    h = harness(tmp_path)
    (a,), gen = h.stable_group(1)
    h.commit(a, gen, {("t", 0): 3})
    h.commit("", -1, {("t", 0): 1}, group="simple")
    h.leave(a)
    h.clock.advance(RETENTION // 2)
    h.commit("", -1, {("t", 0): 2}, group="young")
    h.clock.advance(RETENTION // 2)
    assert h.service.expiry.cleanup() == (2, 2)
    h.rm.close()
    async with trio.open_nursery() as nursery:
        fresh = harness(tmp_path, tasks=nursery)
        fresh.service.manager.owned.clear()
        fresh.service.manager.start_load(0, 2, fresh.service.partition_loaded)
        with trio.fail_after(5):
            while 0 not in fresh.service.manager.owned:
                await trio.sleep(0)
    assert set(fresh.groups) == {"young"}
    assert fresh.fetch_offsets("g") == {} and fresh.fetch_offsets("simple") == {}
    assert fresh.fetch_offsets("young") == {("t", 0): 2}
    fresh.rm.close()


async def test_a_loaded_empty_group_counts_from_when_it_emptied(tmp_path) -> None:
    h = harness(tmp_path)
    (a,), gen = h.stable_group(1)
    h.commit(a, gen, {("t", 0): 3})
    h.leave(a)  # the group's Empty record is written now
    h.rm.close()
    async with trio.open_nursery() as nursery:
        fresh = harness(tmp_path, tasks=nursery)
        fresh.clock.advance(RETENTION - 10)  # the failover happens much later
        fresh.service.manager.owned.clear()
        fresh.service.manager.start_load(0, 2, fresh.service.partition_loaded)
        with trio.fail_after(5):
            while 0 not in fresh.service.manager.owned:
                await trio.sleep(0)
    assert fresh.state() is GroupState.EMPTY
    assert fresh.service.expiry.cleanup() == (0, 0)
    fresh.clock.advance(10)  # retention after it emptied, not after the load
    assert fresh.service.expiry.cleanup() == (1, 1)
    fresh.rm.close()


def test_only_owned_partitions_are_expired(tmp_path) -> None:
    h = harness(tmp_path)
    h.commit("", -1, {("t", 0): 1}, group="simple")
    h.clock.advance(RETENTION)
    h.service.manager.owned.clear()  # resigned (its groups would be unloaded too)
    assert h.service.expiry.cleanup() == (0, 0)
    log = h.rm.partitions[(OFFSETS_TOPIC, 0)].log
    end = log.log_end_offset
    h.service.manager.owned[0] = 1
    assert h.service.expiry.cleanup() == (1, 1)
    assert log.log_end_offset == end + 2  # the offset's and the group's tombstones
    h.rm.close()


def test_the_offsets_topic_is_compacted_even_without_its_config(tmp_path) -> None:
    """One created before it was created compacted: no time retention for live groups."""
    h = harness(tmp_path)
    config = h.rm.partitions[(OFFSETS_TOPIC, 0)].log.config
    assert config.compact and not config.delete
    h.rm.close()


def test_the_config_keys_have_kafkas_defaults() -> None:
    from minibroker.broker.common.config import BrokerConfig

    config = BrokerConfig()
    assert config["offsets.retention.minutes"] == 10080
    assert config["offsets.retention.check.interval.ms"] == 600000
