"""The group coordinator on a manual clock: every state transition, join timing with and
without group.initial.rebalance.delay.ms, heartbeat expiry, rebalance and sync timeouts,
stale generations and unknown members, commits replicated through a real replica manager
and loaded back from its log (Kafka's GroupCoordinatorTest, cut to the classic protocol).

Requests go through the real schemas (defaults filled in); the offsets partition is a
real log led by this broker with itself as the only in-sync replica, so acks=all
appends complete at once and the timers are the only source of waiting.
"""

from __future__ import annotations

import msgpack
import pytest
import structlog
import trio

import minibroker.protocol as p
from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.coordinator import (
    OFFSETS_TOPIC,
    CoordinatorService,
    GroupMetadata,
    GroupState,
    MemberMetadata,
)
from minibroker.broker.coordinator.records import (
    Offset,
    PartitionContents,
    offset_key,
    offset_value,
)
from minibroker.broker.metadata.image import ClusterMetadata, PartitionState, TopicState
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.purgatory import ManualClock, ManualTimer, Purgatory
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.protocol.api import NEWEST_VERSIONS
from minibroker.protocol.errors import ErrorCode

SESSION = 10_000
REBALANCE = 30_000
E = ErrorCode
TOPIC_PARTITIONS = 4  # of topic "t", the one the harness's metadata knows


class Harness:
    def __init__(self, tmp_path, tasks=None, **config) -> None:
        self.clock = ManualClock()
        self.timer = ManualTimer(self.clock)
        self.config = BrokerConfig(
            {
                "offsets.topic.num.partitions": 1,
                "group.initial.rebalance.delay.ms": 0,
                **config,
            }
        )
        self.rm = ReplicaManager(
            0,
            tmp_path,
            self.config,
            structlog.get_logger(),
            Purgatory("Fetch", self.timer),
            Purgatory("Produce", self.timer),
            self.clock.now_ms,
        )
        self.rm.host_partition(OFFSETS_TOPIC, 0, PartitionState(0, 1, [0], [0], 1))
        # The topics commits name: OffsetCommit answers UNKNOWN_TOPIC_OR_PARTITION otherwise.
        partitions = [PartitionState(0, 1, [0], [0], 1) for _ in range(TOPIC_PARTITIONS)]
        self.metadata = ClusterMetadata(topics={"t": TopicState("t", partitions)})
        self.service = CoordinatorService(
            0,
            self.config,
            structlog.get_logger(),
            replica_manager=self.rm,
            timer=self.timer,
            tasks=tasks,
            metadata=lambda: self.metadata,
            create_offsets_topic=lambda n, rf: None,
        )
        self.groups = self.service.manager.groups

    def own(self) -> None:
        self.service.manager.owned[0] = 1

    def call(self, api: p.ApiKey, raw: dict):
        # In the newest version, the coordinator's own (the broker narrows for older ones).
        version = NEWEST_VERSIONS[api]
        body = p.validate_request(p.RequestHeader(api, version, 1, "test"), raw)
        s = self.service
        if api == p.ApiKey.JOIN_GROUP:
            return s.join_group(body, "client", "127.0.0.1")
        method = {
            p.ApiKey.SYNC_GROUP: s.sync_group,
            p.ApiKey.HEARTBEAT: s.heartbeat,
            p.ApiKey.LEAVE_GROUP: s.leave_group,
            p.ApiKey.OFFSET_COMMIT: s.commit_offsets,
            p.ApiKey.OFFSET_FETCH: s.fetch_offsets,
            p.ApiKey.LIST_GROUPS: s.list_groups,
            p.ApiKey.DESCRIBE_GROUPS: s.describe_groups,
            p.ApiKey.DELETE_GROUPS: s.delete_groups,
        }[api]
        return method(body)

    def join(self, member_id: str = "", group: str = "g", protocols=(("range", b"sub"),), **kw):
        return self.call(
            p.ApiKey.JOIN_GROUP,
            {
                "group_id": group,
                "member_id": member_id,
                "session_timeout_ms": kw.get("session", SESSION),
                "rebalance_timeout_ms": kw.get("rebalance", REBALANCE),
                "protocol_type": kw.get("protocol_type", "consumer"),
                "protocols": [{"name": n, "metadata": m} for n, m in protocols],
            },
        )

    def new_member(self, group: str = "g", **kw) -> tuple[str, PendingResponse | dict]:
        """KIP-394's two steps: get an id (MEMBER_ID_REQUIRED), join with it."""
        first = self.join("", group, **kw)
        assert first["error_code"] == E.MEMBER_ID_REQUIRED
        member_id = first["member_id"]
        return member_id, self.join(member_id, group, **kw)

    def sync(self, member_id: str, generation: int, assignments=None, group: str = "g"):
        return self.call(
            p.ApiKey.SYNC_GROUP,
            {
                "group_id": group,
                "generation_id": generation,
                "member_id": member_id,
                "assignments": [
                    {"member_id": m, "assignment": a} for m, a in (assignments or {}).items()
                ],
            },
        )

    def heartbeat(self, member_id: str, generation: int, group: str = "g") -> int:
        body = self.call(
            p.ApiKey.HEARTBEAT,
            {"group_id": group, "generation_id": generation, "member_id": member_id},
        )
        return body["error_code"]

    def leave(self, *member_ids: str, group: str = "g") -> dict:
        return self.call(
            p.ApiKey.LEAVE_GROUP,
            {"group_id": group, "members": [{"member_id": m} for m in member_ids]},
        )

    def commit(self, member_id: str, generation: int, offsets: dict, group: str = "g"):
        return self.call(
            p.ApiKey.OFFSET_COMMIT,
            {
                "group_id": group,
                "generation_id": generation,
                "member_id": member_id,
                "topics": [
                    {
                        "name": t,
                        "partitions": [{"partition": part, "committed_offset": o}],
                    }
                    for (t, part), o in offsets.items()
                ],
            },
        )

    def fetch_offsets(self, group: str = "g") -> dict:
        body = self.call(p.ApiKey.OFFSET_FETCH, {"group_id": group, "topics": None})
        return {
            (t["name"], x["partition"]): x["committed_offset"]
            for t in body["topics"]
            for x in t["partitions"]
        }

    def state(self, group: str = "g") -> GroupState:
        return self.groups[group].state

    def stable_group(self, n: int) -> tuple[list[str], int]:
        """``n`` members joined and synced (the first leads); returns (ids, generation)."""
        ids, pendings = [], []
        for _ in range(n):
            member_id, answer = self.new_member()
            ids.append(member_id)
            pendings.append(answer)
        if n > 1 and not all(_done(a) for a in pendings):
            # Members after the first joined a running rebalance: everyone rejoins.
            for member_id, answer in zip(ids, pendings, strict=True):
                if _done(answer):
                    pendings[ids.index(member_id)] = self.join(member_id)
        answers = [_body(a) for a in pendings]
        generation = answers[0]["generation_id"]
        leader = answers[0]["leader"]
        syncs = {m: self.sync(m, generation) for m in ids if m != leader}
        syncs[leader] = self.sync(leader, generation, {m: m.encode() for m in ids})
        for m, answer in syncs.items():
            assert _body(answer)["error_code"] == 0
            assert _body(answer)["assignment"] == m.encode()
        assert self.state() is GroupState.STABLE
        return ids, generation


def _done(answer) -> bool:
    return not isinstance(answer, PendingResponse) or answer.body is not None


def _body(answer) -> dict:
    if isinstance(answer, PendingResponse):
        assert answer.body is not None, "still waiting"
        return answer.body
    return answer


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path)
    harness.own()
    yield harness
    harness.rm.close()


def make(tmp_path, **config) -> Harness:
    harness = Harness(tmp_path, **config)
    harness.own()
    return harness


# --- the state machine ---------------------------------------------------------------------


def test_every_transition_of_the_state_machine(h):
    # Empty -> PreparingRebalance -> CompletingRebalance (delay 0: the join completes at once)
    a, join_a = h.new_member()
    gen1 = _body(join_a)["generation_id"]
    assert gen1 == 1
    assert _body(join_a)["leader"] == a
    assert [m["member_id"] for m in _body(join_a)["members"]] == [a]
    assert h.state() is GroupState.COMPLETING_REBALANCE
    # CompletingRebalance -> Stable: the leader's assignment is stored, then handed out
    assert _body(h.sync(a, gen1, {a: b"A"}))["assignment"] == b"A"
    assert h.state() is GroupState.STABLE
    # Stable -> PreparingRebalance: a new member joins; the leader must rejoin
    b, join_b = h.new_member()
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert not _done(join_b)
    assert h.heartbeat(a, gen1) == E.REBALANCE_IN_PROGRESS
    rejoin_a = h.join(a)
    # ... -> CompletingRebalance once everyone rejoined; the follower gets no member list
    gen2 = _body(rejoin_a)["generation_id"]
    assert gen2 == 2
    assert _body(join_b)["members"] == []
    assert len(_body(rejoin_a)["members"]) == 2
    # CompletingRebalance -> PreparingRebalance: a member leaves before the sync completes
    follower_sync = h.sync(b, gen2)
    assert not _done(follower_sync)
    h.leave(b)
    assert _body(follower_sync)["error_code"] == E.UNKNOWN_MEMBER_ID
    assert h.state() is GroupState.PREPARING_REBALANCE
    # PreparingRebalance -> CompletingRebalance -> Stable with the one left
    gen3 = _body(h.join(a))["generation_id"]
    _body(h.sync(a, gen3, {a: b"A"}))
    assert h.state() is GroupState.STABLE
    # Stable -> PreparingRebalance -> Empty: the last member leaves
    assert h.leave(a)["members"] == [{"member_id": a, "group_instance_id": None, "error_code": 0}]
    assert h.state() is GroupState.EMPTY
    assert h.groups["g"].generation_id == gen3 + 1
    # Empty -> Dead: deleted
    deleted = _body(h.call(p.ApiKey.DELETE_GROUPS, {"groups_names": ["g"]}))
    assert deleted["results"] == [{"group_id": "g", "error_code": 0}]
    assert "g" not in h.groups


def test_an_empty_group_is_not_deleted_while_it_has_members(h):
    h.stable_group(1)
    deleted = _body(h.call(p.ApiKey.DELETE_GROUPS, {"groups_names": ["g", "nope"]}))
    assert deleted["results"] == [
        {"group_id": "g", "error_code": E.NON_EMPTY_GROUP},
        {"group_id": "nope", "error_code": E.GROUP_ID_NOT_FOUND},
    ]


def test_protocol_selection_takes_what_every_member_supports(h):
    a, _ = h.new_member(protocols=(("roundrobin", b"x"), ("range", b"y")))
    gen = _body(h.join(a, protocols=(("roundrobin", b"x"), ("range", b"y"))))["generation_id"]
    h.sync(a, gen, {a: b""})
    _b, join_b = h.new_member(protocols=(("range", b"z"),))
    _body(h.join(a, protocols=(("roundrobin", b"x"), ("range", b"y"))))
    assert _body(join_b)["protocol_name"] == "range"
    # a member with nothing in common is refused
    refused = h.join("", protocols=(("sticky", b""),))
    assert refused["error_code"] == E.INCONSISTENT_GROUP_PROTOCOL
    other_type = h.join("", protocol_type="connect")
    assert other_type["error_code"] == E.INCONSISTENT_GROUP_PROTOCOL


def test_a_protocol_listed_twice_is_one_vote():
    """Found by test_group_api_fuzz: counted per entry, a name a member listed twice no
    longer matched the member count, and the next generation had no protocol at all."""
    group = GroupMetadata("g", 0)
    twice = [("range", b"a"), ("range", b"b")]
    group.add(MemberMetadata("m1", "c", "h", 1000, 6000, "consumer", twice))
    group.add(MemberMetadata("m2", "c", "h", 1000, 6000, "consumer", [("range", b"")]))
    assert group.select_protocol() == "range"
    group.update(group.get("m2"), twice, 1000, 6000, None)
    assert group.supports_protocols("consumer", [("range", b"")])
    group.remove("m1")
    assert group.select_protocol() == "range"


# --- join timing -----------------------------------------------------------------------------


def test_without_initial_delay_the_first_join_completes_at_once(h):
    _, answer = h.new_member()
    assert _done(answer)
    assert _body(answer)["generation_id"] == 1


def test_initial_delay_holds_a_new_group_and_restarts_for_each_new_member(tmp_path):
    h = make(tmp_path, **{"group.initial.rebalance.delay.ms": 3000})
    _a, join_a = h.new_member()
    h.clock.advance(2000)
    _b, join_b = h.new_member()
    h.clock.advance(999)  # t=2999: the first delay has not run out
    assert not _done(join_a)
    h.clock.advance(1)  # t=3000: it has, but b arrived meanwhile: wait another 3000
    assert not _done(join_a)
    h.clock.advance(2999)
    assert not _done(join_a)
    h.clock.advance(1)  # t=6000
    assert _body(join_a)["generation_id"] == _body(join_b)["generation_id"] == 1
    assert len(_body(join_a)["members"]) == 2
    h.rm.close()


def test_initial_delay_is_bounded_by_the_rebalance_timeout(tmp_path):
    h = make(tmp_path, **{"group.initial.rebalance.delay.ms": 3000})
    _, join_a = h.new_member(rebalance=4000)
    h.clock.advance(2000)
    h.new_member(rebalance=4000)
    h.clock.advance(1000)  # t=3000: 1000 of the rebalance timeout is left
    assert not _done(join_a)
    h.clock.advance(1000)  # t=4000
    assert _body(join_a)["generation_id"] == 1
    h.rm.close()


# --- timeouts ------------------------------------------------------------------------------


def test_heartbeat_expiry_removes_the_member_and_rebalances(h):
    (a, b), gen = h.stable_group(2)
    for _ in range(SESSION // 1000 - 1):
        h.clock.advance(1000)
        assert h.heartbeat(a, gen) == E.NONE
    assert h.state() is GroupState.STABLE  # b's session (10 s) has not run out yet
    h.clock.advance(1000)
    assert b not in h.groups["g"].members
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert h.heartbeat(a, gen) == E.REBALANCE_IN_PROGRESS
    assert h.heartbeat(b, gen) == E.UNKNOWN_MEMBER_ID
    # The survivor rejoins alone: the rebalance does not wait for the expired member.
    assert _body(h.join(a))["members"] == [
        {"member_id": a, "group_instance_id": None, "metadata": b"sub"}
    ]


def test_each_heartbeat_rearms_the_session(h):
    (a,), gen = h.stable_group(1)
    for _ in range(5):
        h.clock.advance(SESSION - 1)
        assert h.heartbeat(a, gen) == E.NONE
    assert h.state() is GroupState.STABLE
    heartbeats = h.service.purgatories["heartbeat"]
    assert heartbeats.stats()["pending"] == 1  # one operation per member, not per heartbeat
    h.clock.advance(SESSION)
    # the last member gone: the rebalance has nobody to wait for and leaves the group Empty
    assert h.state() is GroupState.EMPTY
    assert not h.groups["g"].members


def test_rebalance_timeout_drops_a_member_that_did_not_rejoin(h):
    (a, b), gen = h.stable_group(2)
    c, join_c = h.new_member()
    join_a = h.join(a)
    # b keeps heartbeating (it is alive) but never rejoins
    for _ in range(REBALANCE // 1000 - 1):
        h.clock.advance(1000)
        assert h.heartbeat(b, gen) == E.REBALANCE_IN_PROGRESS
    assert not _done(join_a)
    h.clock.advance(1000)
    members = {m["member_id"] for m in _body(join_a)["members"]}
    assert members == {a, c}
    assert _body(join_c)["generation_id"] == gen + 1
    assert h.heartbeat(b, gen) == E.UNKNOWN_MEMBER_ID


def test_a_member_that_never_syncs_is_removed_after_the_rebalance_timeout(h):
    # sessions outlive the rebalance timeout here, so only the sync wait can remove b
    kw = {"session": 40_000, "rebalance": 20_000}
    a, join_a = h.new_member(**kw)
    gen = _body(join_a)["generation_id"]
    h.sync(a, gen, {a: b"A"})
    b, join_b = h.new_member(**kw)
    gen2 = _body(h.join(a, **kw))["generation_id"]
    assert _body(join_b)["generation_id"] == gen2
    leader_sync = h.sync(a, gen2, {a: b"A", b: b"B"})
    assert _body(leader_sync)["assignment"] == b"A"
    # b got its join answer but never sends SyncGroup; a heartbeats throughout
    for _ in range(19):
        h.clock.advance(1000)
        assert h.heartbeat(a, gen2) == E.NONE
    assert b in h.groups["g"].members
    h.clock.advance(1000)
    assert b not in h.groups["g"].members
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert h.heartbeat(a, gen2) == E.REBALANCE_IN_PROGRESS


def test_a_pending_member_id_that_never_joins_expires(h):
    first = h.join("")
    assert first["error_code"] == E.MEMBER_ID_REQUIRED
    assert first["member_id"] in h.groups["g"].pending_members
    h.clock.advance(SESSION)
    assert not h.groups["g"].pending_members


# --- errors --------------------------------------------------------------------------------


def test_stale_generation_is_illegal(h):
    (a, b), gen = h.stable_group(2)
    h.leave(b)
    gen2 = _body(h.join(a))["generation_id"]
    assert gen2 == gen + 1
    assert h.heartbeat(a, gen) == E.ILLEGAL_GENERATION
    assert _body(h.sync(a, gen))["error_code"] == E.ILLEGAL_GENERATION
    h.sync(a, gen2, {a: b""})
    stale_commit = h.commit(a, gen, {("t", 0): 5})
    assert stale_commit["topics"][0]["partitions"][0]["error_code"] == E.ILLEGAL_GENERATION


def test_unknown_members_are_refused(h):
    (a,), gen = h.stable_group(1)
    assert h.heartbeat("ghost", gen) == E.UNKNOWN_MEMBER_ID
    assert h.join("ghost")["error_code"] == E.UNKNOWN_MEMBER_ID
    assert _body(h.sync("ghost", gen))["error_code"] == E.UNKNOWN_MEMBER_ID
    assert h.leave("ghost")["members"] == [
        {"member_id": "ghost", "group_instance_id": None, "error_code": 25}
    ]
    commit = h.commit("ghost", gen, {("t", 0): 1})
    assert commit["topics"][0]["partitions"][0]["error_code"] == E.UNKNOWN_MEMBER_ID
    assert h.heartbeat(a, gen, group="other") == E.UNKNOWN_MEMBER_ID


def test_session_timeout_outside_the_broker_bounds_is_invalid(h):
    too_short = h.join("", session=5999)
    assert too_short["error_code"] == E.INVALID_SESSION_TIMEOUT
    too_long = h.join("", session=1_800_001)
    assert too_long["error_code"] == E.INVALID_SESSION_TIMEOUT
    # -1 too: the schema takes any int32, the coordinator's bounds decide (as Kafka's)
    assert h.join("", session=-1)["error_code"] == E.INVALID_SESSION_TIMEOUT
    assert not h.groups or not h.groups["g"].members


def test_not_coordinator_and_loading(tmp_path):
    h = Harness(tmp_path)
    assert h.join("")["error_code"] == E.NOT_COORDINATOR
    h.service.manager.loading[0] = 1
    assert h.join("")["error_code"] == E.COORDINATOR_LOAD_IN_PROGRESS
    fetched = h.call(p.ApiKey.OFFSET_FETCH, {"group_id": "g", "topics": None})
    assert fetched["error_code"] == E.COORDINATOR_LOAD_IN_PROGRESS
    assert h.join("", group="")["error_code"] == E.INVALID_GROUP_ID
    h.rm.close()


# --- offsets and the log -----------------------------------------------------------------


def test_commits_from_members_and_from_outside_the_group(h):
    # a group with no members takes commits with generation -1 (an admin's, reset-offsets)
    assert h.commit("", -1, {("t", 0): 7})["topics"][0]["partitions"][0]["error_code"] == 0
    assert h.fetch_offsets() == {("t", 0): 7}
    (a,), gen = h.stable_group(1)
    assert (
        h.commit(a, gen, {("t", 0): 9, ("t", 1): 3})["topics"][0]["partitions"][0]["error_code"]
        == 0
    )
    assert h.fetch_offsets() == {("t", 0): 9, ("t", 1): 3}
    # ... but not while it has members
    outside = h.commit("", -1, {("t", 0): 0})
    assert outside["topics"][0]["partitions"][0]["error_code"] == E.UNKNOWN_MEMBER_ID
    assert h.fetch_offsets() == {("t", 0): 9, ("t", 1): 3}


def test_a_commit_for_a_partition_that_does_not_exist_stores_nothing(h):
    """Kafka's handleOffsetCommitRequest: UNKNOWN_TOPIC_OR_PARTITION per partition of a topic
    (or a partition index) the metadata does not have; the others are committed."""
    codes = h.commit("", -1, {("nope", 0): 4, ("t", TOPIC_PARTITIONS): 4})["topics"]
    assert [t["partitions"][0]["error_code"] for t in codes] == [E.UNKNOWN_TOPIC_OR_PARTITION] * 2
    assert "g" not in h.groups  # nothing committed: not even the group exists
    mixed = h.commit("", -1, {("nope", 0): 4, ("t", 0): 2})["topics"]
    assert [t["partitions"][0]["error_code"] for t in mixed] == [E.UNKNOWN_TOPIC_OR_PARTITION, 0]
    assert h.fetch_offsets() == {("t", 0): 2}
    # a group error does not hide which partitions do not exist
    (a,), gen = h.stable_group(1)
    stale = h.commit(a, gen + 1, {("nope", 0): 4, ("t", 0): 3})["topics"]
    assert [t["partitions"][0]["error_code"] for t in stale] == [
        E.UNKNOWN_TOPIC_OR_PARTITION,
        E.ILLEGAL_GENERATION,
    ]


def commit_with_epoch(h: Harness, offset: int, epoch: int | None) -> int:
    partition = {"partition": 0, "committed_offset": offset}
    if epoch is not None:
        partition["committed_leader_epoch"] = epoch
    body = {"group_id": "g", "generation_id": -1, "member_id": "",
            "topics": [{"name": "t", "partitions": [partition]}]}  # fmt: skip
    return _body(h.call(p.ApiKey.OFFSET_COMMIT, body))["topics"][0]["partitions"][0]["error_code"]


def fetched_epoch(h: Harness) -> int:
    answer = h.call(p.ApiKey.OFFSET_FETCH, {"group_id": "g", "topics": None})
    return answer["topics"][0]["partitions"][0]["committed_leader_epoch"]


async def test_the_committed_leader_epoch_is_kept_and_loaded_back(tmp_path):
    h = make(tmp_path)
    assert commit_with_epoch(h, 7, 4) == 0
    assert fetched_epoch(h) == 4
    assert commit_with_epoch(h, 8, None) == 0  # an older client's commit: unknown
    assert fetched_epoch(h) == -1
    assert commit_with_epoch(h, 9, 5) == 0
    h.rm.close()
    async with trio.open_nursery() as nursery:
        fresh = Harness(tmp_path, tasks=nursery)
        fresh.service.manager.start_load(0, 2, fresh.service.coordinator.partition_loaded)
        with trio.fail_after(5):
            while 0 not in fresh.service.manager.owned:
                await trio.sleep(0)
    assert fresh.fetch_offsets() == {("t", 0): 9}
    assert fetched_epoch(fresh) == 5
    fresh.rm.close()


def test_offset_records_read_the_same_with_or_without_an_epoch():
    """__consumer_offsets written before epochs were kept loads as epoch -1; a record with
    one still has the three fields an older broker reads."""
    old = msgpack.packb({"offset": 3, "metadata": "m", "commit_timestamp": 10})
    contents = PartitionContents()
    contents._apply(offset_key("g", "t", 0), old, 10)
    assert contents.offsets["g"][("t", 0)] == Offset(3, "m", 10, -1)
    new = msgpack.unpackb(offset_value(Offset(3, "m", 10, 6)))
    assert new == {"offset": 3, "metadata": "m", "commit_timestamp": 10, "leader_epoch": 6}
    assert msgpack.unpackb(offset_value(Offset(3, "m", 10))) == msgpack.unpackb(old)


async def test_a_new_leader_loads_groups_and_latest_offsets_from_the_log(tmp_path):
    h = make(tmp_path)
    (a, b), gen = h.stable_group(2)
    h.commit(a, gen, {("t", 0): 1})
    h.commit(a, gen, {("t", 0): 5, ("t", 1): 2})
    h.commit("", -1, {("t", 0): 0}, group="gone")
    _body(h.call(p.ApiKey.DELETE_GROUPS, {"groups_names": ["gone"]}))
    log_end = h.rm.partitions[(OFFSETS_TOPIC, 0)].log.log_end_offset
    h.rm.close()
    async with trio.open_nursery() as nursery:
        # Another broker's coordinator over the same log (a failover, as far as it can tell).
        fresh = Harness(tmp_path, tasks=nursery)
        assert fresh.rm.partitions[(OFFSETS_TOPIC, 0)].log.log_end_offset == log_end
        fresh.service.manager.start_load(0, 2, fresh.service.coordinator.partition_loaded)
        assert fresh.join("")["error_code"] == E.COORDINATOR_LOAD_IN_PROGRESS
        with trio.fail_after(5):
            while 0 not in fresh.service.manager.owned:
                await trio.sleep(0)
    assert fresh.fetch_offsets() == {("t", 0): 5, ("t", 1): 2}  # the latest per key
    assert "gone" not in fresh.groups  # tombstoned
    group = fresh.groups["g"]
    assert group.state is GroupState.STABLE
    assert group.generation_id == gen
    assert {m: x.assignment for m, x in group.members.items()} == {a: a.encode(), b: b.encode()}
    # the restored members heartbeat on with their generation; a silent one expires
    fresh.clock.advance(SESSION - 1)
    assert fresh.heartbeat(a, gen) == E.NONE
    fresh.clock.advance(1)
    assert b not in group.members
    fresh.rm.close()


def test_describe_and_list_groups(h):
    (a, b), _gen = h.stable_group(2)
    described = h.call(p.ApiKey.DESCRIBE_GROUPS, {"groups": ["g", "none"]})["groups"]
    assert described[0]["group_state"] == "Stable"
    assert described[0]["protocol_data"] == "range"
    assert {m["member_id"]: m["member_assignment"] for m in described[0]["members"]} == {
        a: a.encode(),
        b: b.encode(),
    }
    assert described[1]["group_state"] == "Dead"
    listed = h.call(p.ApiKey.LIST_GROUPS, {})
    assert listed["groups"] == [
        {"group_id": "g", "protocol_type": "consumer", "group_state": "Stable"}
    ]
    assert h.call(p.ApiKey.LIST_GROUPS, {"states_filter": ["Empty"]})["groups"] == []
