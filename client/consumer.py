"""The trio-native consumer: assign, seek, poll.

Fetches are long polls (``fetch.min.bytes`` / ``fetch.max.wait.ms``), one in flight
per broker, and the next one is sent as soon as an answer is decoded, so while the
caller works through one response the following one is already on its way. Poll
waits on an Event set by arriving data: no busy loop.
"""

from __future__ import annotations

import inspect
import math
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import trio

from minibroker.client.background import ClusterClient
from minibroker.client.cluster import Cluster
from minibroker.client.fetcher import PartitionState, apply_partition_result, fetch_body
from minibroker.client.group import GroupMembership
from minibroker.client.offsets import (
    OffsetAndTimestamp,
    list_offsets,
    lookup_retries,
)
from minibroker.client.records import ConsumerRecord, TopicPartition
from minibroker.client.transactions import ConsumerGroupMetadata
from minibroker.protocol import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, ApiKey
from minibroker.protocol.errors import KafkaError, OffsetOutOfRange


class RebalanceListener(Protocol):
    """Kafka's ConsumerRebalanceListener; any method may be a coroutine function.

    ``on_partitions_revoked``: partitions taken away while this member still belonged to
    the group (commit their progress here); ``on_partitions_assigned``: the partitions this
    rebalance added (under cooperative-sticky possibly none: it runs after every rebalance,
    as Kafka's). ``on_partitions_lost`` (optional; Kafka's default calls
    on_partitions_revoked): the member had already lost its generation, so the partitions
    may be someone else's and committing them would fail.
    """

    def on_partitions_revoked(self, partitions: set[TopicPartition]) -> Any: ...
    def on_partitions_assigned(self, partitions: set[TopicPartition]) -> Any: ...


class Consumer(ClusterClient):
    """``async with Consumer("127.0.0.1:9092") as c: c.assign([("t", 0)]); await c.poll(1000)``.

    In a group: ``Consumer(bootstrap, group_id="g")``, ``subscribe(["t"])``, then ``poll``:
    partitions come from the group's rebalances, positions from its committed offsets.
    With ``group_instance_id="i"`` (group.instance.id) it is a static member: a restart
    within session.timeout.ms gets its partitions back without a rebalance.
    """

    ROLE = "consumer"

    def __init__(
        self,
        bootstrap: str | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        group_id: str | None = None,
        group_instance_id: str | None = None,
        **settings: Any,
    ) -> None:
        if group_id is not None:
            settings["group.id"] = group_id
        if group_instance_id is not None:
            settings["group.instance.id"] = group_instance_id
        super().__init__(bootstrap, config, **settings)
        # Group mode (subscribe): the membership, the topics, the listener, auto-commit.
        self._group: GroupMembership | None = None
        self._subscription: list[str] | None = None
        self._listener: RebalanceListener | None = None
        self._next_auto_commit = 0.0
        self._join: _Join | None = None  # a join poll() started and has not seen end
        self.group_events: deque[tuple[str, dict]] = deque(maxlen=100)
        self._states: dict[TopicPartition, PartitionState] = {}
        self._data = trio.Event()
        self._errors: list[BaseException] = []
        self._fetching_nodes: set[int] = set()
        self._metadata_running = False
        self._metadata_at = 0.0
        self._backoff = self.config["retry.backoff.ms"] / 1000
        self._lookup_retries = lookup_retries(self.config)

    def _open(self) -> Cluster:
        if self._cluster is None or self._background.nursery is None:
            raise RuntimeError("the consumer is not open: use 'async with Consumer(...) as c'")
        return self._cluster

    # --- assignment and positions --------------------------------------------------------

    def assign(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Consume exactly these partitions (replacing any earlier assignment)."""
        wanted = [TopicPartition(t, p) for t, p in partitions]
        max_bytes = self.config["max.partition.fetch.bytes"]
        self._states = {tp: self._states.get(tp) or PartitionState(tp, max_bytes) for tp in wanted}
        if self._cluster is not None:
            self._cluster.wanted.update(tp.topic for tp in wanted)

    def assignment(self) -> set[TopicPartition]:
        return set(self._states)

    def _state(self, tp: tuple[str, int]) -> PartitionState:
        try:
            return self._states[TopicPartition(*tp)]
        except KeyError:
            raise ValueError(f"{tp[0]}-{tp[1]} is not assigned to this consumer") from None

    def seek(self, tp: tuple[str, int], offset: int) -> None:
        """Read ``tp`` from ``offset`` at the next poll (an offset out of range is reset)."""
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        self._state(tp).seek(offset)

    def seek_to_beginning(self, *partitions: tuple[str, int]) -> None:
        """Lazily: the earliest offset is looked up at the next poll or position()."""
        for tp in partitions or list(self._states):
            self._state(tp).seek(None, "earliest")

    def seek_to_end(self, *partitions: tuple[str, int]) -> None:
        for tp in partitions or list(self._states):
            self._state(tp).seek(None, "latest")

    async def position(self, tp: tuple[str, int]) -> int:
        """The offset of the next record poll() returns for ``tp``."""
        st = self._state(tp)
        if st.position is None:
            await self._resolve_positions()
        return st.position

    def highwater(self, tp: tuple[str, int]) -> int:
        """The partition's high watermark from the latest fetch (-1 before any)."""
        return self._state(tp).high_watermark

    async def _resolve_positions(self) -> None:
        pending = [st for st in self._states.values() if st.position is None]
        if not pending:
            return
        wanted = {}
        for st in pending:
            strategy = st.reset or self.config["auto.offset.reset"]
            if strategy == "none":
                raise OffsetOutOfRange(
                    f"no position for {st.tp.topic}-{st.tp.partition} and auto.offset.reset is none:"
                    " seek() first"
                )
            wanted[st.tp] = EARLIEST_TIMESTAMP if strategy == "earliest" else LATEST_TIMESTAMP
        epochs = {st.tp: st.epoch for st in pending}
        found = await list_offsets(self._open(), wanted, **self._lookup_retries)
        for tp, (offset, _) in found.items():
            st = self._states.get(tp)
            if st is not None and st.epoch == epochs[tp] and st.position is None:
                st.seek(offset)

    # --- offsets lookups -------------------------------------------------------------------

    async def list_offsets(
        self, timestamps: Mapping[tuple[str, int], int]
    ) -> dict[TopicPartition, OffsetAndTimestamp]:
        """``{tp: timestamp}`` (-2 earliest, -1 latest) -> ``{tp: (offset, timestamp)}``."""
        wanted = {TopicPartition(*tp): ts for tp, ts in timestamps.items()}
        return await list_offsets(self._open(), wanted, **self._lookup_retries)

    async def beginning_offsets(
        self, partitions: Iterable[tuple[str, int]]
    ) -> dict[TopicPartition, int]:
        found = await self.list_offsets({tp: EARLIEST_TIMESTAMP for tp in partitions})
        return {tp: r.offset for tp, r in found.items()}

    async def end_offsets(self, partitions: Iterable[tuple[str, int]]) -> dict[TopicPartition, int]:
        found = await self.list_offsets({tp: LATEST_TIMESTAMP for tp in partitions})
        return {tp: r.offset for tp, r in found.items()}

    async def offsets_for_times(
        self, timestamps: Mapping[tuple[str, int], int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Earliest offset whose timestamp is >= the given one (None: no such record)."""
        wanted = {TopicPartition(*tp): ts for tp, ts in timestamps.items()}
        # The broker answers at record granularity (its time index, as Kafka's).
        found = await self.list_offsets(wanted)
        return {tp: None if r.offset < 0 else r for tp, r in found.items()}

    async def partitions_for(self, topic: str) -> int | None:
        cluster = self._open()
        await cluster.refresh([topic])
        return cluster.partition_count(topic)

    # --- polling -----------------------------------------------------------------------------

    async def poll(
        self, timeout_ms: int = 1000, max_records: int | None = None
    ) -> list[ConsumerRecord]:
        """Records after each partition's position: at most ``max.poll.records``, possibly none.

        Returns as soon as any record is there, or after ``timeout_ms`` with an empty list.
        In a group, a rebalance that outlasts ``timeout_ms`` goes on in the background and
        this returns empty; the next poll picks it up where it is (Kafka's poll(timeout)).
        """
        self._open()
        limit = max_records or self.config["max.poll.records"]
        deadline = trio.current_time() + max(timeout_ms, 0) / 1000
        await self._poll_group(deadline)
        records = self._drain(limit)
        while not records and trio.current_time() < deadline:
            self._raise_errors()
            if self._group_needs_poll():
                await self._poll_group(deadline)
                records = self._drain(limit)
                # auto.commit.interval.ms=0 is due again at once: let the commit run
                await trio.lowlevel.checkpoint()
                continue
            with trio.move_on_at(deadline):
                data = self._data  # before any wait: a signal meanwhile must wake this poll
                await self._resolve_positions()
                self._start_fetches()
                records = self._drain(limit)
                if not records:
                    # Only the wait for data ends when the group's work is due: a positions
                    # lookup cut short there would start over every heartbeat interval.
                    with trio.move_on_after(max(self._time_to_group_poll(), 0.0)):
                        await data.wait()
                    records = self._drain(limit)
        self._raise_errors()
        self._start_fetches()  # prefetch while the caller works on these
        return records

    def _raise_errors(self) -> None:
        if self._errors:
            error = self._errors.pop(0)
            raise error

    def _drain(self, limit: int) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        for tp in [tp for tp, st in self._states.items() if st.chunks]:
            st = self._states[tp]
            while st.chunks and len(out) < limit:
                chunk = st.chunks[0]
                room = limit - len(out)
                if len(chunk) <= room:
                    out += chunk
                    st.chunks.popleft()
                    st.position = chunk[-1].offset + 1
                else:
                    out += chunk[:room]
                    st.chunks[0] = chunk[room:]
                    st.position = chunk[room - 1].offset + 1
            if not st.chunks and st.fetch_offset is not None and st.fetch_offset > st.position:
                # Everything fetched is handed out: what remains before the fetch offset is
                # markers and aborted records, which the position passes as Kafka's does.
                st.position = st.fetch_offset
            # Move this partition to the back so others get their turn next poll.
            self._states[tp] = self._states.pop(tp)
            if len(out) >= limit:
                break
        return out

    def _signal(self) -> None:
        data, self._data = self._data, trio.Event()
        data.set()

    def _start_fetches(self) -> None:
        nursery = self._background.nursery
        if nursery is None:
            return  # closing: a fetch that finished as close() began must not start another
        by_node: dict[int, list[PartitionState]] = defaultdict(list)
        cluster = self._cluster
        missing = False
        for st in self._states.values():
            if st.fetchable:
                leader = cluster.leader(*st.tp)
                if leader is None:
                    missing = True
                elif leader not in self._fetching_nodes:
                    by_node[leader].append(st)
        for node, states in by_node.items():
            self._fetching_nodes.add(node)
            for st in states:
                st.fetching = True
            # Snapshot offsets now: a seek before the task runs must not leak into the request.
            sent = [(st, st.epoch, st.fetch_offset) for st in states]
            nursery.start_soon(self._fetch, node, sent, fetch_body(states, self.config))
        if missing or cluster.stale:
            self._refresh_metadata_soon()

    async def _fetch(
        self, node: int, sent: list[tuple[PartitionState, int, int]], body: dict
    ) -> None:
        timeout = (self.config["request.timeout.ms"] + self.config["fetch.max.wait.ms"]) / 1000
        try:
            response = await self._cluster.request(node, ApiKey.FETCH, body, timeout=timeout)
        except KafkaError as exc:
            if not exc.retriable:
                self._errors.append(exc)
            self._refresh_metadata_soon()
            await trio.sleep(self._backoff)
            return
        finally:
            self._fetching_nodes.discard(node)
            for st, _, _ in sent:
                st.fetching = False
        self._apply(response, sent)
        self._signal()
        self._start_fetches()

    def _apply(self, response: dict, sent: list[tuple[PartitionState, int, int]]) -> None:
        results = {
            (t["name"], p["partition"]): p for t in response["topics"] for p in t["partitions"]
        }
        limit = self.config["fetch.max.bytes"]
        for st, epoch, offset in sent:
            result = results.get(st.tp)
            if result is None or st.epoch != epoch or self._states.get(st.tp) is not st:
                continue
            outcome = apply_partition_result(st, result, offset, limit)
            if outcome.out_of_range:
                strategy = self.config["auto.offset.reset"]
                if strategy != "none":
                    st.seek(None, strategy)
                else:
                    st.fetch_offset = None  # stop fetching until the user seeks
                    self._errors.append(
                        OffsetOutOfRange(
                            f"offset {offset} is out of range for {st.tp.topic}-{st.tp.partition}"
                            " and auto.offset.reset is none: seek() to a valid offset"
                        )
                    )
            if outcome.needs_metadata:
                self._refresh_metadata_soon()
            if outcome.error is not None:
                self._errors.append(outcome.error)

    def _refresh_metadata_soon(self) -> None:
        if not self._metadata_running and self._background.nursery is not None:
            self._metadata_running = True
            self._background.nursery.start_soon(self._refresh_metadata)

    async def _refresh_metadata(self) -> None:
        try:
            await trio.sleep(max(0.0, self._metadata_at + self._backoff - time.monotonic()))
            self._metadata_at = time.monotonic()
            await self._cluster.refresh({tp.topic for tp in self._states})
        except KafkaError:
            pass
        finally:
            self._metadata_running = False
            self._signal()

    # --- consumer groups ---------------------------------------------------------------------

    async def _started(self, nursery: trio.Nursery) -> None:
        if self.config["group.id"]:
            self._group = GroupMembership(self._cluster, self.config, self._log_event)
            nursery.start_soon(self._group.heartbeat_loop, self._signal)

    def _log_event(self, event: str, **fields: Any) -> None:
        """Group events (joined, left for exceeding max.poll.interval.ms) for the caller's
        logging: the client library itself stays silent, as before."""
        self.group_events.append((event, fields))

    def _member(self) -> GroupMembership:
        self._open()
        if self._group is None:
            raise ValueError("this consumer has no group.id: pass group_id= to use a group")
        return self._group

    def group_metadata(self) -> ConsumerGroupMetadata:
        """Kafka's groupMetadata(): group id, generation, member id and group instance id as
        this member holds them now (generation -1 and no member id while it is not in a
        generation); a transactional producer's send_offsets_to_transaction takes it."""
        group = self._member()
        return ConsumerGroupMetadata(
            group.group_id, group.generation, group.member_id, group.instance_id
        )

    def subscribe(self, topics: Iterable[str], listener: RebalanceListener | None = None) -> None:
        """Consume ``topics`` as a member of the group: its rebalances assign the partitions
        (at the next poll); ``listener`` hears of partitions revoked and assigned."""
        if not self.config["group.id"]:
            raise ValueError("subscribe() needs a group: pass group_id= (group.id)")
        self._subscription = sorted(set(topics))
        self._listener = listener
        if self._group is not None:
            self._group.rejoin_needed = True

    def subscription(self) -> list[str]:
        return list(self._subscription or [])

    def _group_needs_poll(self) -> bool:
        group = self._group
        if group is None or self._subscription is None:
            return False
        if self._time_to_group_poll() <= 0:
            return True
        if group.lost and self._states:
            return True
        if self._join is None:
            return group.rejoin_needed
        # Cooperative: a join in flight needs this poll only once it is done (it wakes the
        # poll); the partitions kept meanwhile are fetched as usual.
        return not group.cooperative or self._join.done.is_set()

    def _time_to_group_poll(self) -> float:
        """Kafka's timeToNextPoll: how long a poll may wait for records before the group's
        own work is due: the next auto-commit, and a heartbeat interval after the last
        group poll. A poll that waits longer than this wakes and runs ``_poll_group``, so a
        member that has read everything still commits its positions while it waits for more,
        and one waiting inside poll() is polling (max.poll.interval.ms), as Kafka's."""
        group = self._group
        if group is None or self._subscription is None:
            return math.inf
        due = group.last_poll + self.config["heartbeat.interval.ms"] / 1000
        if self.config["enable.auto.commit"]:
            due = min(due, self._next_auto_commit)
        return due - time.monotonic()

    async def _poll_group(self, deadline: float) -> None:
        """What Kafka's poll does for the group first: rejoin if needed, auto-commit."""
        group = self._group
        if group is None or self._subscription is None:
            return
        if group.fatal is not None:
            raise group.fatal
        group.last_poll = time.monotonic()
        if group.lost:
            await self._lose_partitions(group)
        if group.partitions_changed() and self._join is None:
            group.rejoin_needed = True
            group.assigned_counts = None  # one rejoin per change
        if group.rejoin_needed or self._join is not None:
            await self._rejoin(group, deadline)
        if self.config["enable.auto.commit"] and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = (
                time.monotonic() + self.config["auto.commit.interval.ms"] / 1000
            )
            self.commit_async()

    async def _rejoin(self, group: GroupMembership, deadline: float) -> None:
        """Revoke, join in the background, and once joined assign: the listeners run here,
        in the caller's task, and only the wait for the join is cut short by ``deadline``.
        A join that is not done by then stays in flight (its JoinGroup is parked at the
        coordinator until the whole group has joined) for the next poll to wait on, as
        Kafka's does: several consumers polled one after another from one task can all
        get through a rebalance that needs every one of them.

        Eager (range, roundrobin) revokes everything before joining. Cooperative revokes only
        the partitions of topics no longer subscribed, keeps consuming the rest while the
        join runs, and does not wait for it: the join wakes the poll when it is done."""
        if self._join is None:
            topics = list(self._subscription or [])
            if group.cooperative:
                revoked = {tp for tp in self._states if tp.topic not in topics}
            else:
                revoked = set(self._states)
            await self._revoke(group, revoked)
            self._join = _Join(topics, self._signal)
            self._background.nursery.start_soon(self._join.run, group, self.assignment)
        join = self._join
        if not group.cooperative:
            with trio.move_on_at(deadline):
                await join.done.wait()
        if not join.done.is_set():
            return
        self._join = None
        if join.error is not None:
            raise join.error
        if group.lost:  # lost mid-join: what was held is not this generation's to revoke
            await self._lose_partitions(group)
        assigned = set(join.assigned)
        revoked = self.assignment() - assigned
        if revoked and group.cooperative:
            # KIP-429: these go to their new owners in the next generation, which this
            # member's rejoin (its subscription no longer claims them) starts.
            group.rejoin_needed = True
        await self._revoke(group, revoked)
        added = assigned - self.assignment()
        self.assign(sorted(self.assignment() | added))
        for tp in added:
            offset = join.committed.get(tp, -1)
            if offset >= 0:
                self._states[tp].seek(offset)
        if join.topics != self._subscription:
            group.rejoin_needed = True  # subscribe() changed the topics meanwhile
        await self._notify("on_partitions_assigned", added)

    async def _revoke(self, group: GroupMembership, revoked: set[TopicPartition]) -> None:
        """Kafka's onPartitionsRevoked: commit their progress (enable.auto.commit), tell
        the listener, stop fetching them."""
        if not revoked:
            return
        if self.config["enable.auto.commit"] and group.generation >= 0:
            positions = self._positions()
            try:
                await group.commit({tp: positions[tp] for tp in revoked if tp in positions})
            except KafkaError:
                pass  # the group moved on: the next owner starts from the last commit
        await self._notify("on_partitions_revoked", revoked)
        self.assign(tp for tp in self._states if tp not in revoked)

    async def _lose_partitions(self, group: GroupMembership) -> None:
        """Kafka's onPartitionsLost: no commit (it would be refused, or worse, land on
        partitions that already have new owners), the listener told, nothing kept."""
        group.lost = False
        lost = self.assignment()
        if not lost:
            return
        self.assign([])
        if self._listener is not None and hasattr(self._listener, "on_partitions_lost"):
            await self._notify("on_partitions_lost", lost)
        else:
            await self._notify("on_partitions_revoked", lost)

    async def _notify(self, method: str, partitions: set[TopicPartition]) -> None:
        if self._listener is None:
            return
        result = getattr(self._listener, method)(partitions)
        if inspect.isawaitable(result):
            await result

    def _positions(self) -> dict[TopicPartition, int]:
        return {tp: st.position for tp, st in self._states.items() if st.position is not None}

    async def commit(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        """Commit ``offsets`` (next offset to read, per partition; default: the positions
        poll() has reached) and wait until the group's coordinator has them replicated."""
        group = self._member()
        wanted = self._positions() if offsets is None else offsets
        await group.commit({TopicPartition(*tp): o for tp, o in wanted.items()})

    def commit_async(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        """Commit in the background; a failure is dropped (the next commit supersedes it)."""
        group = self._member()
        wanted = self._positions() if offsets is None else dict(offsets)
        if not wanted:
            return

        async def commit() -> None:
            try:
                await group.commit({TopicPartition(*tp): o for tp, o in wanted.items()})
            except KafkaError:
                pass

        self._background.nursery.start_soon(commit)

    async def committed(
        self, partitions: Iterable[tuple[str, int]]
    ) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None where nothing is committed)."""
        found = await self._member().committed([TopicPartition(*tp) for tp in partitions])
        return {tp: (o if o >= 0 else None) for tp, o in found.items()}

    async def aclose(self) -> None:
        """A member commits (with enable.auto.commit) and leaves its group before closing, so
        the others take its partitions at once rather than after session.timeout.ms; a
        static member does not leave (its restart takes its partitions back), as Kafka's.
        Cancelled meanwhile, it still closes: the background nursery must be exited, or
        trio ends the run in "Nursery stack corrupted"."""
        group = self._group
        if self._join is not None:
            self._join.cancel_scope.cancel()  # never rejoin while leaving
            self._join = None
        try:
            if group is not None and self._cluster is not None and group.member_id:
                with trio.move_on_after(self.config["request.timeout.ms"] / 1000):
                    if self.config["enable.auto.commit"] and self._states:
                        try:
                            await group.commit(self._positions())
                        except KafkaError:
                            pass
                    await group.leave()
        finally:
            await super().aclose()


class _Join:
    """One rebalance from this member's side, run in the consumer's background: JoinGroup,
    SyncGroup, then the committed offsets of what it was given."""

    def __init__(self, topics: list[str], wake: Callable[[], None]) -> None:
        self.topics = topics
        self.wake = wake  # a poll waiting for records learns the join is done
        self.done = trio.Event()
        self.cancel_scope = trio.CancelScope()
        self.assigned: list[TopicPartition] = []
        self.committed: dict[TopicPartition, int] = {}
        self.error: BaseException | None = None

    async def run(self, group: GroupMembership, owned: Callable[[], set[TopicPartition]]) -> None:
        """``owned``: the partitions the consumer holds (cooperative: kept through the join,
        so only the others need their committed offsets)."""
        with self.cancel_scope:
            try:
                self.assigned = await group.join(self.topics, owned)
                held = set() if group.lost else owned()  # lost: all of it comes anew
                added = [tp for tp in self.assigned if tp not in held]
                if added:
                    # Under read_committed, offsets a transaction holds are waited for
                    # as long as it takes, as Kafka's poll asks again each time.
                    self.committed = await group.committed(added, timeout=math.inf)
            except Exception as exc:  # handed to the poll that waits for it
                self.error = exc
            self.done.set()
            self.wake()
