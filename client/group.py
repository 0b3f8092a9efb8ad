"""The consumer's side of a group (Kafka's ConsumerCoordinator, classic protocol): find
the coordinator, join and sync, heartbeat, commit and fetch offsets, leave.

The Consumer drives it: joins happen inside ``poll`` (so rebalance listeners run in the
caller's task, as Kafka's do), heartbeats in a background task that also enforces
``max.poll.interval.ms`` by leaving the group, as Kafka's heartbeat thread does.

With ``group.instance.id`` the member is static (KIP-345): every request names its
instance, it never sends LeaveGroup (a restart takes its member over; only its session
timeout removes it), and FENCED_INSTANCE_ID (another process took the instance over) is
fatal, raised from the next poll, as Kafka's FencedInstanceIdException.

When every assignor it offers is cooperative (KIP-429) the member keeps its partitions
through a join: its subscription says what it owns and since which generation, and the
Consumer revokes only what the new assignment takes away. A member that lost its
generation (kicked out, fenced, left for max.poll.interval.ms) has ``lost`` set: its
partitions may be someone else's already, so they are lost, not revoked (no commit).

An answer can outlive the generation it was asked in: a heartbeat for generation N is
answered ILLEGAL_GENERATION after this member's own JoinGroup completed N+1. Such an
answer says nothing about the member now, so heartbeat, SyncGroup and OffsetCommit
answers are judged only if no join started or finished and the generation did not change
while they were in flight (Kafka's ``generationUnchanged()``); otherwise they are ignored.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import trio

from minibroker.client.assignors import (
    ASSIGNORS,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    is_cooperative,
)
from minibroker.client.cluster import Cluster
from minibroker.client.coordinator import COORDINATOR_ERRORS, GROUP, CoordinatorRoute
from minibroker.client.fetcher import isolation_level
from minibroker.client.records import TopicPartition
from minibroker.protocol import ApiKey, api_name
from minibroker.protocol.errors import (
    ErrorCode,
    KafkaError,
    RebalanceInProgress,
    UnstableOffsetCommit,
    UnsupportedVersion,
    error_class,
)

# This member's id or generation is no longer the group's: join afresh.
MEMBERSHIP_ERRORS = frozenset(
    {ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION, ErrorCode.REBALANCE_IN_PROGRESS}
)


class CommitFailed(KafkaError):
    """Kafka's CommitFailedException: the group rebalanced, so this member's commit was
    refused (its partitions may now be someone else's)."""

    code = ErrorCode.REBALANCE_IN_PROGRESS


class GroupMembership(CoordinatorRoute):
    """One member of one group, over a client's Cluster."""

    def __init__(self, cluster: Cluster, config: Mapping[str, Any], log: Callable[..., None]):
        super().__init__(cluster, config["group.id"], GROUP, config)
        self.group_id: str = config["group.id"]
        self.instance_id: str | None = config.get("group.instance.id") or None
        self.fatal: KafkaError | None = None  # raised by the next poll (fenced)
        self.log = log
        self.member_id = ""
        self.generation = -1
        self.protocol: str | None = None
        self.rejoin_needed = True
        # (an Admin's outsider membership offers no strategies: never cooperative)
        self.cooperative = is_cooperative(config.get("partition.assignment.strategy", ()))
        self.joining = False  # a JoinGroup/SyncGroup round is in flight
        self.rounds = 0  # joins started plus joins finished (see stamp())
        self.lost = False  # the generation was lost while owning partitions (see above)
        self.last_poll = time.monotonic()
        self.join_started = 0.0  # monotonic time the latest join began (benchmarks read it)
        # The leader's partition counts behind its last assignment (Kafka's
        # assignmentSnapshot): when the metadata shows others (CreatePartitions), it rejoins
        # so the new partitions get members. None on the other members.
        self.assigned_counts: dict[str, int] | None = None

    # --- coordinator (CoordinatorRoute: find it, follow it when it moves) -----------------

    async def call(self, api_key: int, body: dict, timeout: float | None = None) -> dict:
        """A JoinGroup waits at the coordinator until every member rejoined, up to the
        rebalance timeout (max.poll.interval.ms), so it is given that plus 5 s when that
        is longer than request.timeout.ms (Kafka's JOIN_GROUP_TIMEOUT_LAPSE): timed out
        sooner, it would be sent again and again while the group waits for a slow member."""
        if api_key == ApiKey.JOIN_GROUP and timeout is None:
            timeout = max(
                self.config["request.timeout.ms"] / 1000,
                self.config["max.poll.interval.ms"] / 1000 + 5,
            )
        return await super().call(api_key, body, timeout)

    def _in_version(self, api_key: int, version: int, body: dict) -> dict:
        """``body`` as ``version`` of ``api_key`` has it: version 0 of the group APIs
        predates static membership (no group_instance_id), so a static member cannot use
        it (Kafka's clients refuse the same way)."""
        if version >= 1 or "group_instance_id" not in body:
            return body
        if self.instance_id is not None:
            raise UnsupportedVersion(
                f"group.instance.id needs a broker with static membership ({api_name(api_key)} "
                f"v1); the coordinator of group {self.group_id} speaks only v0"
            )
        return {k: v for k, v in body.items() if k != "group_instance_id"}

    # --- join and sync ----------------------------------------------------------------------

    def stamp(self) -> tuple[int, int, str]:
        """What an answer's request was sent under: an answer is judged only if the stamp
        is the same when it arrives (no join started or finished, the generation and member
        id unchanged), else it belongs to a generation that is no longer current."""
        return (self.rounds, self.generation, self.member_id)

    def _stale(self, sent: tuple[int, int, str], api: str, code: ErrorCode) -> bool:
        if sent == self.stamp():
            return False
        self.log(
            "stale_group_answer_ignored",
            group=self.group_id,
            api=api,
            error=code.name,
            sent_generation=sent[1],
            generation=self.generation,
        )
        return True

    def reset(self) -> None:
        self._lose_generation()
        self.rejoin_needed = True

    def _lose_generation(self) -> None:
        """This member's id or generation is no longer the group's (Kafka's
        resetGenerationOnResponseError): whatever it owned is lost."""
        if self.generation >= 0:
            self.lost = True
        self.member_id = ""
        self.generation = -1

    async def join(
        self, topics: Iterable[str], owned: Callable[[], Iterable[TopicPartition]] = tuple
    ) -> list[TopicPartition]:
        """Join (again) until a generation's SyncGroup hands this member its partitions.
        ``owned`` says what the member holds as each JoinGroup is sent (nothing once lost)."""
        self.join_started = time.monotonic()
        self.joining = True
        self.rounds += 1
        try:
            return await self._join(sorted(topics), owned)
        finally:
            self.joining = False
            self.rounds += 1

    async def _join(
        self, topics: list[str], owned: Callable[[], Iterable[TopicPartition]]
    ) -> list[TopicPartition]:
        strategies = self.config["partition.assignment.strategy"]
        while True:
            holding = () if self.lost else owned()
            subscription = encode_subscription(topics, holding, self.generation)
            joined = await self.call(
                ApiKey.JOIN_GROUP,
                {
                    "group_id": self.group_id,
                    "session_timeout_ms": self.config["session.timeout.ms"],
                    "rebalance_timeout_ms": self.config["max.poll.interval.ms"],
                    "member_id": self.member_id,
                    "group_instance_id": self.instance_id,
                    "protocol_type": "consumer",
                    "protocols": [{"name": s, "metadata": subscription} for s in strategies],
                },
            )
            code = ErrorCode.parse(joined["error_code"])
            if code is ErrorCode.MEMBER_ID_REQUIRED:
                self.member_id = joined["member_id"]
                continue
            if code in MEMBERSHIP_ERRORS:
                if code is not ErrorCode.REBALANCE_IN_PROGRESS:
                    self._lose_generation()
                continue
            if code is not ErrorCode.NONE:
                raise error_class(code)(joined.get("error_message") or f"joining {self.group_id}")
            self.member_id = joined["member_id"]
            self.generation = joined["generation_id"]
            self.protocol = joined["protocol_name"]
            sent = self.stamp()  # this generation's, as SyncGroup is asked
            assignments = []
            self.assigned_counts = None
            if joined["leader"] == self.member_id:
                assignments = await self._assign(joined["members"])
            synced = await self.call(
                ApiKey.SYNC_GROUP,
                {
                    "group_id": self.group_id,
                    "generation_id": self.generation,
                    "member_id": self.member_id,
                    "group_instance_id": self.instance_id,
                    "assignments": assignments,
                    "protocol_type": "consumer",
                    "protocol_name": self.protocol,
                },
            )
            code = ErrorCode.parse(synced["error_code"])
            if self._stale(sent, "SyncGroup", code):
                # The generation was reset while SyncGroup was in flight (Kafka's "rejoin
                # due to generation reset"): its assignment is nobody's now; join again.
                continue
            if code in MEMBERSHIP_ERRORS:
                if code is not ErrorCode.REBALANCE_IN_PROGRESS:
                    self._lose_generation()
                continue
            if code is not ErrorCode.NONE:
                raise error_class(code)(synced.get("error_message") or f"syncing {self.group_id}")
            self.rejoin_needed = False
            self.log(
                "group_joined",
                group=self.group_id,
                member=self.member_id,
                generation=self.generation,
                leader=joined["leader"] == self.member_id,
            )
            return decode_assignment(synced["assignment"])

    async def _assign(self, members: list[dict]) -> list[dict]:
        """The leader's job: run the agreed assignor over every member's subscription."""
        subscriptions = {m["member_id"]: decode_subscription(m["metadata"]) for m in members}
        topics = sorted({t for s in subscriptions.values() for t in s.topics})
        await self.cluster.refresh(topics)
        counts = {t: self.cluster.partition_count(t) or 0 for t in topics}
        self.assigned_counts = counts
        plan = ASSIGNORS[self.protocol or "range"](subscriptions, counts)
        return [{"member_id": m, "assignment": encode_assignment(tps)} for m, tps in plan.items()]

    def partitions_changed(self) -> bool:
        """Whether this member led the last assignment and a topic's partition count has
        changed since (the metadata refresh of metadata.max.age.ms shows it)."""
        counts = self.assigned_counts
        return counts is not None and any(
            (self.cluster.partition_count(t) or 0) != n for t, n in counts.items()
        )

    # --- heartbeat ------------------------------------------------------------------------

    async def heartbeat_loop(self, wake: Callable[[], None]) -> None:
        """Heartbeat every heartbeat.interval.ms while a member; leave the group when the
        application has not polled within max.poll.interval.ms (Kafka's heartbeat thread)."""
        interval = self.config["heartbeat.interval.ms"] / 1000
        max_poll = self.config["max.poll.interval.ms"] / 1000
        while True:
            await trio.sleep(interval)
            # Heartbeats go on while a rejoin waits for the next poll (they keep the session),
            # not during the join itself (the coordinator counts the JoinGroup as one).
            if self.generation < 0 or self.joining:
                continue
            if time.monotonic() - self.last_poll > max_poll:
                self.log("poll_interval_exceeded", group=self.group_id, member=self.member_id)
                await self.leave()
                wake()
                continue
            sent = self.stamp()
            try:
                answer = await self.call(
                    ApiKey.HEARTBEAT,
                    {
                        "group_id": self.group_id,
                        "generation_id": self.generation,
                        "member_id": self.member_id,
                        "group_instance_id": self.instance_id,
                    },
                )
            except KafkaError:
                continue  # the next one retries; the session allows several misses
            code = ErrorCode.parse(answer["error_code"])
            if code is not ErrorCode.NONE and self._stale(sent, "Heartbeat", code):
                continue  # asked for a generation a join has since replaced
            if code is ErrorCode.FENCED_INSTANCE_ID:
                self.log("group_instance_fenced", group=self.group_id, instance=self.instance_id)
                self.fatal = error_class(code)(
                    f"group.instance.id {self.instance_id} of group {self.group_id} was taken "
                    "over by another consumer (a second process with the same instance id?)"
                )
                self.reset()
                wake()
                continue
            if code in MEMBERSHIP_ERRORS:
                if code is not ErrorCode.REBALANCE_IN_PROGRESS:
                    self._lose_generation()
                self.rejoin_needed = True
                wake()

    async def leave(self) -> None:
        """LeaveGroup (best effort): the group rebalances now, not after a session timeout.
        A static member only forgets its member id (Kafka's maybeLeaveGroup): its next
        join takes its member over, and until then the session timeout decides."""
        member_id = self.member_id
        self.reset()
        if not member_id or self.coordinator is None or self.instance_id is not None:
            return
        try:
            with trio.move_on_after(self.config["request.timeout.ms"] / 1000):
                await self.cluster.request(
                    self.coordinator,
                    ApiKey.LEAVE_GROUP,
                    {"group_id": self.group_id, "members": [{"member_id": member_id}]},
                )
        except KafkaError as exc:
            self.log("leave_group_failed", group=self.group_id, error=str(exc))

    # --- offsets ----------------------------------------------------------------------------

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        if not offsets:
            return
        if self.joining:
            # Kafka's generationIfStable: mid-join the generation is in flux (a commit with
            # the new one before SyncGroup is refused and would ask for yet another rejoin).
            raise RebalanceInProgress(f"group {self.group_id} is rebalancing: poll(), then commit")
        sent = self.stamp()
        generation = self.generation
        topics: dict[str, list] = {}
        for tp, offset in offsets.items():
            topics.setdefault(tp.topic, []).append(
                {"partition": tp.partition, "committed_offset": offset}
            )
        body = {
            "group_id": self.group_id,
            "generation_id": generation,
            "member_id": self.member_id,
            "group_instance_id": self.instance_id,
            "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
        }
        deadline = time.monotonic() + self.config["request.timeout.ms"] / 1000
        while True:
            answer = await self.call(ApiKey.OFFSET_COMMIT, body)
            codes = [
                (t["name"], p["partition"], ErrorCode.parse(p["error_code"]))
                for t in answer["topics"]
                for p in t["partitions"]
            ]
            # Its coordinator moved or is loading (per partition here): find it, commit again.
            if any(c in COORDINATOR_ERRORS for _, _, c in codes) and time.monotonic() < deadline:
                self.coordinator = None
                await trio.sleep(self.backoff)
                continue
            break
        for topic, partition, code in codes:
            if code in MEMBERSHIP_ERRORS:
                if self._stale(sent, "OffsetCommit", code):
                    # A rebalance overtook the commit: its refusal says nothing about the
                    # generation now (Kafka raises RebalanceInProgressException, retriable).
                    raise RebalanceInProgress(
                        f"commit of {topic}-{partition} for generation {generation} refused "
                        f"({code.name}) after group {self.group_id} rebalanced; poll(), then "
                        "commit again"
                    )
                self.rejoin_needed = True
                raise CommitFailed(
                    f"commit of {topic}-{partition} refused ({code.name}): the "
                    "group rebalanced; poll() again to rejoin"
                )
            if code is not ErrorCode.NONE:
                raise error_class(code)(f"commit of {topic}-{partition}")

    async def committed(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        """Committed offsets (-1: none) of ``partitions``.

        Under ``isolation.level=read_committed`` the fetch asks ``require_stable``, as
        Kafka's consumer does (KIP-447): a partition whose offsets an undecided transaction
        holds answers UNSTABLE_OFFSET_COMMIT rather than the offset the transaction may be
        about to replace, and the fetch is asked again every retry.backoff.ms until the
        transaction ends, for up to ``timeout`` s (default request.timeout.ms; then
        UnstableOffsetCommit, retriable)."""
        wanted: dict[str, list[int]] = {}
        for tp in partitions:
            wanted.setdefault(tp.topic, []).append(tp.partition)
        body = {
            "group_id": self.group_id,
            "topics": [{"name": t, "partition_indexes": ps} for t, ps in wanted.items()],
        }
        if isolation_level(self.config):
            body["require_stable"] = True
        if timeout is None:
            timeout = self.config["request.timeout.ms"] / 1000
        deadline = trio.current_time() + timeout  # trio's clock: the tests' manual one
        while True:
            answer = await self.call(ApiKey.OFFSET_FETCH, body)
            code = ErrorCode.parse(answer["error_code"])
            if code is not ErrorCode.NONE:
                raise error_class(code)(f"fetching the offsets of group {self.group_id}")
            unstable = [
                f"{t['name']}-{p['partition']}"
                for t in answer["topics"]
                for p in t["partitions"]
                if p["error_code"] == ErrorCode.UNSTABLE_OFFSET_COMMIT
            ]
            if not unstable:
                return {
                    TopicPartition(t["name"], p["partition"]): p["committed_offset"]
                    for t in answer["topics"]
                    for p in t["partitions"]
                }
            if trio.current_time() + self.backoff > deadline:
                raise UnstableOffsetCommit(
                    f"the offsets of {', '.join(unstable)} in group {self.group_id} are held by "
                    "a transaction not decided yet; ask again once it commits or aborts"
                )
            self.log("offsets_unstable", group=self.group_id, partitions=unstable)
            await trio.sleep(self.backoff)
