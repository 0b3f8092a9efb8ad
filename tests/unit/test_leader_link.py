"""LeaderLink: the fetchers of one leader share one request per round and one connection."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from minibroker.broker.replication.leader_link import LeaderLink
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import KafkaError, NetworkException


class FakeLeader:
    """Stands in for the leader broker (the peer), answering each partition it is asked."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, dict]] = []
        self.fail = False
        self.closed = False

    async def request(self, api_key: int, body: dict, *, timeout: float, version: int = 0) -> dict:
        self.requests.append((api_key, body))
        await trio.sleep(0.01)
        if self.fail:
            raise NetworkException("leader gone")
        return {
            "topics": [
                {
                    "name": t["name"],
                    "partitions": [
                        {**p, "error_code": 0, "answered": len(self.requests)}
                        for p in t["partitions"]
                        if p["partition"] != 99  # left out of the answer
                    ],
                }
                for t in body["topics"]
            ]
        }

    async def close(self) -> None:
        self.closed = True


def link_to(leader: FakeLeader) -> LeaderLink:
    return LeaderLink(
        1,
        leader,
        {ApiKey.OFFSET_FOR_LEADER_EPOCH: {"replica_id": 2}, ApiKey.FETCH: {"replica_id": 2}},
        {ApiKey.OFFSET_FOR_LEADER_EPOCH: 5, ApiKey.FETCH: 5},
    )


async def test_every_member_rides_one_request_and_gets_its_own_part():
    leader = FakeLeader()
    link = link_to(leader)
    keys = [("a", 0), ("a", 1), ("b", 0)]
    members = [object() for _ in keys]
    for m in members:
        link.join(m)
    got = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)

        async def member(m, key):
            truncation = await link.ask(
                m, ApiKey.OFFSET_FOR_LEADER_EPOCH, key, {"partition": key[1]}
            )
            fetched = await link.ask(m, ApiKey.FETCH, key, {"partition": key[1], "fetch_offset": 7})
            got[key] = (truncation["answered"], fetched["answered"], fetched["fetch_offset"])

        async with trio.open_nursery() as members_nursery:
            for m, key in zip(members, keys, strict=True):
                members_nursery.start_soon(member, m, key)
        link.cancel_scope.cancel()
    # One OffsetsForLeaderEpoch, then one Fetch, each with all three partitions.
    assert [api for api, _ in leader.requests] == [ApiKey.OFFSET_FOR_LEADER_EPOCH, ApiKey.FETCH]
    fetch = leader.requests[1][1]
    assert fetch["replica_id"] == 2
    assert (
        sorted((t["name"], p["partition"]) for t in fetch["topics"] for p in t["partitions"])
        == keys
    )
    assert got == {key: (1, 2, 7) for key in keys}
    assert leader.closed


async def test_a_pausing_member_does_not_hold_back_the_others():
    leader = FakeLeader()
    link = link_to(leader)
    busy, sleeper = object(), object()
    link.join(busy)
    link.join(sleeper)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        nursery.start_soon(link.pause, sleeper, 3600)
        with trio.fail_after(5):
            for _ in range(3):
                await link.ask(busy, ApiKey.FETCH, ("a", 0), {"partition": 0})
        # A member that leaves is not waited for either.
        link.leave(sleeper)
        nursery.cancel_scope.cancel()
    assert len(leader.requests) == 3


async def test_a_failed_round_fails_each_ask_and_a_missing_part_is_named():
    leader = FakeLeader()
    link = link_to(leader)
    m = object()
    link.join(m)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        with pytest.raises(KafkaError, match="left a-99 out of its FETCH answer"):
            await link.ask(m, ApiKey.FETCH, ("a", 99), {"partition": 99})
        leader.fail = True
        with pytest.raises(NetworkException, match="leader gone"):
            await link.ask(m, ApiKey.FETCH, ("a", 0), {"partition": 0})
        nursery.cancel_scope.cancel()


class ParkingLeader(FakeLeader):
    """A leader whose Fetch with a single partition parks (a long poll with nothing new)
    until released; anything else is answered at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = trio.Event()

    async def request(self, api_key: int, body: dict, *, timeout: float, version: int = 0) -> dict:
        if api_key == ApiKey.FETCH and sum(len(t["partitions"]) for t in body["topics"]) == 1:
            self.requests.append((api_key, body))
            await self.release.wait()
        return await super().request(api_key, body, timeout=timeout)


async def test_a_new_member_calls_back_a_parked_fetch_and_both_ride_the_next_round():
    leader = ParkingLeader()
    link = link_to(leader)
    old, new = object(), object()
    answers: dict[str, dict] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        link.join(old)

        async def fetch(member: object, name: str, partition: int) -> None:
            answers[name] = await link.ask(
                member, ApiKey.FETCH, ("t", partition), {"partition": partition}
            )

        nursery.start_soon(fetch, old, "old", 0)
        with trio.fail_after(5):
            while not leader.requests:  # the old member's fetch is out, parked
                await trio.sleep(0)
        link.join(new)
        nursery.start_soon(fetch, new, "new", 1)
        with trio.fail_after(5):  # answered without the parked fetch being released
            while len(answers) < 2:
                await trio.sleep(0.001)
        link.cancel_scope.cancel()
    assert not leader.release.is_set()
    last_api, last_body = leader.requests[-1]
    assert last_api == ApiKey.FETCH
    assert sorted(p["partition"] for p in last_body["topics"][0]["partitions"]) == [0, 1]
    assert answers["old"]["partition"] == 0 and answers["new"]["partition"] == 1


async def test_a_new_leaders_follower_fetches_after_its_epoch_check_without_waiting():
    """A partition whose leader moved asks OffsetsForLeaderEpoch first. The Fetch round
    of the leader's other partitions goes out right after that answer, before the
    newcomer asks its first Fetch; the newcomer must call it back, not wait it out."""
    leader = ParkingLeader()
    link = link_to(leader)
    steady, moved = object(), object()
    answers: dict[str, dict] = {}

    async def follow_steady() -> None:
        while True:  # a follower partition with nothing new: one parked Fetch after another
            await link.ask(steady, ApiKey.FETCH, ("t", 0), {"partition": 0})

    async def follow_moved() -> None:
        answers["epoch"] = await link.ask(
            moved, ApiKey.OFFSET_FOR_LEADER_EPOCH, ("t", 1), {"partition": 1}
        )
        answers["fetch"] = await link.ask(moved, ApiKey.FETCH, ("t", 1), {"partition": 1})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        link.join(steady)
        nursery.start_soon(follow_steady)
        with trio.fail_after(5):
            while not leader.requests:  # the steady partition's Fetch is out, parked
                await trio.sleep(0)
        link.join(moved)
        nursery.start_soon(follow_moved)
        with trio.fail_after(5):
            while "fetch" not in answers:
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()  # the steady member asks on
    assert not leader.release.is_set()
    assert answers["fetch"]["partition"] == 1


async def test_a_member_retrying_a_refused_partition_calls_back_the_round_parked_meanwhile():
    """A follower of a new topic asks before its leader knows the topic: refused, it
    pauses, and the round that goes out meanwhile parks without it. Its retry must not
    wait that round out (replica.fetch.wait.max.ms: about one topic creation in ten
    held its first acks=all write ~500 ms)."""
    leader = ParkingLeader()
    link = link_to(leader)
    steady, refused = object(), object()
    answers: list[dict] = []

    async def fetch(member: object, partition: int) -> dict:
        return await link.ask(member, ApiKey.FETCH, ("t", partition), {"partition": partition})

    async def retry(rejoin: bool, paused: trio.CancelScope) -> None:
        if rejoin:
            link.rejoin(refused)
        with paused:  # the fetcher's retry pause, ended by the test
            await link.pause(refused, 3600)
        answers.append(await fetch(refused, 1))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        link.join(steady)
        link.join(refused)
        async with trio.open_nursery() as first_round:  # both carried: neither is new
            first_round.start_soon(fetch, steady, 0)
            first_round.start_soon(fetch, refused, 1)
        for rejoin in (False, True):
            out = len(leader.requests)
            paused = trio.CancelScope()
            nursery.start_soon(retry, rejoin, paused)
            nursery.start_soon(fetch, steady, 0)
            with trio.fail_after(5):  # the steady member's round is out alone, parked
                while len(leader.requests) == out:
                    await trio.sleep(0)
            paused.cancel()
            if not rejoin:
                # Without rejoin the retry waits behind the parked round.
                await trio.testing.wait_all_tasks_blocked()
                assert not answers
                leader.release.set()  # let it go, then park anew for the second pass
            with trio.fail_after(5):
                while not answers:
                    await trio.sleep(0.001)
            if not rejoin:
                answers.clear()
                leader.release = trio.Event()
        link.cancel_scope.cancel()
    # With rejoin, answered without the parked round's release.
    assert not leader.release.is_set()
    assert answers[0]["partition"] == 1


class OmittingLeader(FakeLeader):
    """Leaves a partition out of its Fetch answer until ``changed`` names it (a leader
    that has nothing new for a follower that gave its HW)."""

    def __init__(self) -> None:
        super().__init__()
        self.changed: set[int] = set()

    async def request(self, api_key: int, body: dict, *, timeout: float, version: int = 0) -> dict:
        answer = await super().request(api_key, body, timeout=timeout)
        for t in answer["topics"]:
            t["partitions"] = [p for p in t["partitions"] if p["partition"] in self.changed]
        self.changed.clear()
        return answer


async def test_a_partition_left_out_sleeps_on_and_rides_the_next_round():
    """A follower ask that gave its HW and was left out of the answer is not woken (no
    error, no answer): it goes out again, unchanged, until the leader answers it."""
    leader = OmittingLeader()
    link = link_to(leader)
    busy, idle = object(), object()
    link.join(busy)
    link.join(idle)
    idle_answers = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)

        async def idle_member():
            part = {"partition": 1, "fetch_offset": 5, "high_watermark": 5}
            idle_answers.append(await link.ask(idle, ApiKey.FETCH, ("a", 1), part))

        nursery.start_soon(idle_member)
        with trio.fail_after(5):
            for _ in range(3):
                leader.changed.add(0)
                await link.ask(busy, ApiKey.FETCH, ("a", 0), {"partition": 0, "high_watermark": 0})
            assert idle_answers == []  # three rounds, never woken
            leader.changed.update((0, 1))
            await link.ask(busy, ApiKey.FETCH, ("a", 0), {"partition": 0, "high_watermark": 0})
            while not idle_answers:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    # Every round carried the idle partition's ask, as it was asked.
    fetches = [body for api, body in leader.requests if api == ApiKey.FETCH]
    assert len(fetches) == 4
    for body in fetches:
        parts = {p["partition"]: p for t in body["topics"] for p in t["partitions"]}
        assert parts[1] == {"partition": 1, "fetch_offset": 5, "high_watermark": 5}
    assert idle_answers[0]["answered"] == 4
