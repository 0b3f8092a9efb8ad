"""Fetch sessions between brokers (KIP-227's request side): the follower names only what
changed, the leader fills in the rest, and either side starting over is always safe."""

from __future__ import annotations

import pytest
import trio

from minibroker.broker.replication.fetch_sessions import (
    FollowerSession,
    ReplicaFetchSessions,
    next_epoch,
)
from minibroker.broker.replication.leader_link import LeaderLink
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import (
    FetchSessionIdNotFound,
    InvalidFetchSessionEpoch,
    UnsupportedVersion,
)


def part(index: int, offset: int = 0) -> dict:
    return {"partition": index, "fetch_offset": offset, "high_watermark": offset}


def fetched(body: dict) -> dict[tuple[str, int], int]:
    return {
        (t["name"], p["partition"]): p["fetch_offset"]
        for t in body["topics"]
        for p in t["partitions"]
    }


def request(replica_id: int, session_id: int, epoch: int, topics: dict, forgotten=()) -> dict:
    return {
        "replica_id": replica_id,
        "session_id": session_id,
        "session_epoch": epoch,
        "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()],
        "forgotten_topics": [{"name": n, "partitions": ps} for n, ps in forgotten],
    }


def test_a_session_fills_in_what_an_incremental_fetch_leaves_out():
    sessions = ReplicaFetchSessions(lambda replica_id: replica_id in (2, 3))
    full = request(2, 0, 0, {"a": [part(0), part(1)], "b": [part(0)]})
    session_id = sessions.resolve(full)
    assert session_id > 0
    assert fetched(full) == {("a", 0): 0, ("a", 1): 0, ("b", 0): 0}
    # Epoch 1 names a moved partition and forgets another: the rest comes from the session.
    step = request(2, session_id, 1, {"a": [part(1, 7)]}, forgotten=[("b", [0])])
    assert sessions.resolve(step) == session_id
    assert fetched(step) == {("a", 0): 0, ("a", 1): 7}
    # Nothing named at epoch 2: the same partitions, as last sent.
    empty = request(2, session_id, 2, {})
    sessions.resolve(empty)
    assert fetched(empty) == {("a", 0): 0, ("a", 1): 7}
    assert sessions.stats() == {
        "sessions": 1,
        "partitions_cached": 2,
        "full_fetches": 1,
        "incremental_fetches": 2,
    }


def test_a_wrong_epoch_or_id_is_refused_and_a_full_fetch_replaces_the_session():
    sessions = ReplicaFetchSessions(lambda replica_id: replica_id in (2, 3))
    first = sessions.resolve(request(2, 0, 0, {"a": [part(0)]}))
    with pytest.raises(InvalidFetchSessionEpoch, match="expects epoch 1, got 3"):
        sessions.resolve(request(2, first, 3, {}))
    with pytest.raises(FetchSessionIdNotFound):
        sessions.resolve(request(2, first + 1, 1, {}))
    with pytest.raises(FetchSessionIdNotFound):  # another follower's id is not ours
        sessions.resolve(request(3, first, 1, {}))
    second = sessions.resolve(request(2, 0, 0, {"b": [part(0)]}))
    assert second != first
    with pytest.raises(FetchSessionIdNotFound):
        sessions.resolve(request(2, first, 1, {}))
    stale = request(2, second, 1, {})
    sessions.resolve(stale)
    assert fetched(stale) == {("b", 0): 0}


def test_consumers_and_sessionless_fetches_get_no_session():
    sessions = ReplicaFetchSessions(lambda replica_id: replica_id in (2, 3))
    consumer = request(-1, 0, 0, {"a": [part(0)]})
    assert sessions.resolve(consumer) == 0
    with pytest.raises(FetchSessionIdNotFound):
        sessions.resolve(request(-1, 5, 1, {}))
    sessionless = request(2, 0, -1, {"a": [part(0)]})
    assert sessions.resolve(sessionless) == 0
    assert fetched(sessionless) == {("a", 0): 0}
    assert sessions.stats()["sessions"] == 0


def test_a_broker_that_follows_nothing_here_gets_no_session():
    """Only a follower of a partition led here: a client claiming made-up replica ids
    cannot make the leader hold sessions for them."""
    sessions = ReplicaFetchSessions(lambda replica_id: replica_id in (2, 3))
    for made_up in (4, 99, 2**31 - 1):
        assert sessions.resolve(request(made_up, 0, 0, {"a": [part(0)]})) == 0
    assert sessions.stats()["sessions"] == 0


def test_epochs_wrap_past_the_largest_to_one():
    assert next_epoch(0) == 1
    assert next_epoch(2**31 - 1) == 1
    assert next_epoch(-1) == -1


def test_the_follower_names_changed_and_forgotten_partitions_and_starts_over_on_reset():
    session = FollowerSession()
    asks = {("a", 0): part(0, 5), ("a", 1): part(1, 5)}
    full = session.next_fetch(asks)
    assert (full["session_epoch"], fetched(full)) == (0, {("a", 0): 5, ("a", 1): 5})
    session.answered({"session_id": 42, "topics": []})
    # Equal fields, new objects (a fetcher builds its ask afresh): not named again.
    step = session.next_fetch({("a", 0): part(0, 5), ("a", 1): part(1, 9), ("b", 0): part(0)})
    assert (step["session_id"], step["session_epoch"]) == (42, 1)
    assert fetched(step) == {("a", 1): 9, ("b", 0): 0}
    assert step["forgotten_topics"] == []
    session.answered({"topics": []})
    step = session.next_fetch({("b", 0): part(0)})
    assert step["session_epoch"] == 2
    assert fetched(step) == {}
    assert sorted((t["name"], t["partitions"]) for t in step["forgotten_topics"]) == [("a", [0, 1])]
    session.reset()
    again = session.next_fetch({("b", 0): part(0)})
    assert (again["session_id"], again["session_epoch"]) == (0, 0)
    session.answered({"session_id": 0, "topics": []})  # the leader keeps no session for us
    assert session.next_fetch({("b", 0): part(0)})["session_epoch"] == 0


class SessionLeader:
    """A leader that keeps sessions as the broker does (ReplicaFetchSessions), answers
    every partition it reads, and fails as told."""

    def __init__(self, versions=(0, 1, 2)) -> None:
        self.sessions = ReplicaFetchSessions(lambda replica_id: replica_id in (2, 3))
        self.requests: list[tuple[int, dict]] = []
        self.fail_next: type[Exception] | None = None
        self.versions = versions

    async def request(self, api_key: int, body: dict, *, timeout: float, version: int = 0) -> dict:
        await trio.sleep(0)
        named = fetched(body)
        self.requests.append((version, named))
        if version not in self.versions:
            raise UnsupportedVersion(f"Fetch version {version}")
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc("refused")
        read = dict(body)  # the leader reads what the session holds
        session_id = self.sessions.resolve(read) if version >= 2 else 0
        return {"topics": read["topics"], "session_id": session_id}

    async def close(self) -> None:
        pass


async def fetch_rounds(leader, offsets_per_round: list[dict[tuple[str, int], int]]) -> LeaderLink:
    """Run one link with a member per partition; round r asks each partition at its offset."""
    link = LeaderLink(1, leader, {ApiKey.FETCH: {"replica_id": 2}}, {ApiKey.FETCH: 5})
    keys = sorted({k for offsets in offsets_per_round for k in offsets})
    members = {key: object() for key in keys}
    for member in members.values():
        link.join(member)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        for offsets in offsets_per_round:
            async with trio.open_nursery() as asking:
                for key, member in members.items():
                    asking.start_soon(
                        link.ask, member, ApiKey.FETCH, key, part(key[1], offsets[key])
                    )
        link.cancel_scope.cancel()
    return link


async def test_a_link_sends_a_full_fetch_then_only_what_moved():
    leader = SessionLeader()
    idle = {("idle", i): 3 for i in range(5)}
    rounds = [{("busy", 0): 0, **idle}, {("busy", 0): 10, **idle}, {("busy", 0): 20, **idle}]
    await fetch_rounds(leader, rounds)
    versions = [version for version, _ in leader.requests]
    assert versions == [2, 2, 2]
    assert leader.requests[0][1] == rounds[0]
    assert leader.requests[1][1] == {("busy", 0): 10}
    assert leader.requests[2][1] == {("busy", 0): 20}


async def test_a_refused_session_is_not_an_error_for_the_partitions_it_goes_full_again():
    leader = SessionLeader()
    rounds = [{("a", 0): 0, ("a", 1): 0}, {("a", 0): 4, ("a", 1): 0}, {("a", 0): 8, ("a", 1): 0}]
    link = LeaderLink(1, leader, {ApiKey.FETCH: {"replica_id": 2}}, {ApiKey.FETCH: 5})
    members = {key: object() for key in rounds[0]}
    for member in members.values():
        link.join(member)
    answers = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        for number, offsets in enumerate(rounds):
            if number == 1:
                leader.fail_next = FetchSessionIdNotFound  # the leader restarted, say
            async with trio.open_nursery() as asking:

                async def ask(key, member, offset):
                    answers.append(await link.ask(member, ApiKey.FETCH, key, part(key[1], offset)))

                for key, member in members.items():
                    asking.start_soon(ask, key, member, offsets[key])
        link.cancel_scope.cancel()
    assert len(answers) == 6  # every ask answered, none failed
    # Round 2 was refused and went again at once as a full fetch; round 3 is incremental.
    assert [named for _, named in leader.requests] == [
        rounds[0],
        {("a", 0): 4},
        rounds[1],
        {("a", 0): 8},
    ]


async def test_a_leader_without_sessions_gets_full_fetches_of_the_version_it_knows():
    leader = SessionLeader(versions=(0, 1))
    rounds = [{("a", 0): 0, ("a", 1): 0}, {("a", 0): 4, ("a", 1): 0}]
    link = await fetch_rounds(leader, rounds)
    assert link.session is None
    assert leader.requests == [(2, rounds[0]), (0, rounds[0]), (0, rounds[1])]
