"""Which groups this broker coordinates, and their records (Kafka's GroupMetadataManager).

A group belongs to partition ``abs(java_hash(group_id)) % offsets.topic.num.partitions``
of ``__consumer_offsets``; the leader of that partition coordinates it. Becoming leader
starts a load (the partition's log replayed, latest value per key wins; the groups answer
COORDINATOR_LOAD_IN_PROGRESS meanwhile); losing it unloads them. Every write — a commit,
a generation's assignment, a deletion — is an acks=all produce through the replica
manager and its purgatory: acknowledged only once the in-sync replicas have it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import trio

from minibroker.broker.common.tasks import Spawner
from minibroker.broker.coordinator.group import GroupMetadata
from minibroker.broker.coordinator.records import OFFSETS_TOPIC, PartitionContents, batch
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.protocol.errors import ErrorCode

LOAD_CHUNK_BYTES = 1 << 20

# What a failed append of group records means to the client (Kafka's GroupMetadataManager
# maps them so): retry against the same coordinator, find the new one, or give up.
_APPEND_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
}


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (UTF-16 code units, int32 overflow): Kafka places groups by it."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


# Every group request asks it (is this broker the group's coordinator?): Java caches a
# String's hash, we cache the answer; bounded, as clients choose the group ids.
@functools.lru_cache(maxsize=1 << 16)
def partition_for(group_id: str, partitions: int) -> int:
    # Kafka's Utils.abs: Integer.MIN_VALUE maps to 0, not to itself.
    return (java_string_hash(group_id) & 0x7FFFFFFF) % partitions


class GroupMetadataManager:
    """Groups by id, the coordinator partitions owned or loading, and appends."""

    def __init__(
        self,
        broker_id: int,
        config: Any,
        logger: Any,
        replica_manager: ReplicaManager,
        tasks: Spawner,
        now_ms: Callable[[], int],
    ) -> None:
        self.broker_id = broker_id
        self.config = config
        self.log = logger
        self.replica_manager = replica_manager
        self.tasks = tasks
        self.now_ms = now_ms
        self.groups: dict[str, GroupMetadata] = {}
        self.owned: dict[int, int] = {}  # loaded partitions -> the leader epoch loaded at
        self.loading: dict[int, int] = {}  # partitions being loaded -> leader epoch
        # The topic's real partition count once it exists (it is fixed at creation).
        self.num_partitions: int = config["offsets.topic.num.partitions"]

    # --- ownership --------------------------------------------------------------------------

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.num_partitions)

    def ownership_error(self, group_id: str) -> ErrorCode | None:
        """None when this broker serves ``group_id`` now; else why not."""
        partition = partition_for(group_id, self.num_partitions)
        if partition in self.owned:
            return None
        if partition in self.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NOT_COORDINATOR

    def groups_of(self, partition: int) -> list[GroupMetadata]:
        return [g for g in self.groups.values() if g.partition == partition]

    def start_load(
        self, partition: int, epoch: int, on_loaded: Callable[[int, PartitionContents], None]
    ) -> None:
        """This broker leads ``partition`` at ``epoch``: replay its log, then serve it."""
        if self.owned.get(partition) is not None or self.loading.get(partition) == epoch:
            return
        self.loading[partition] = epoch
        self.tasks.start_soon(self._load, partition, epoch, on_loaded)

    async def _load(
        self, partition: int, epoch: int, on_loaded: Callable[[int, PartitionContents], None]
    ) -> None:
        started = self.now_ms()
        contents = PartitionContents()
        replica = self.replica_manager.partitions.get((OFFSETS_TOPIC, partition))
        if replica is None:
            self.loading.pop(partition, None)
            return
        offset = replica.log.log_start_offset
        end = replica.log.log_end_offset  # the new leader's log is the truth: to its end
        while offset < end:
            if self.loading.get(partition) != epoch:
                return  # resigned (or a newer load) meanwhile
            data = replica.read(offset, LOAD_CHUNK_BYTES, for_follower=True)
            if not data:
                break
            next_offset = contents.replay(data)
            if next_offset <= offset:
                break
            offset = next_offset
            await trio.sleep(0)  # a big partition must not stall the broker's loop
        if self.loading.get(partition) != epoch:
            return
        del self.loading[partition]
        self.owned[partition] = epoch
        on_loaded(partition, contents)
        self.log.info(
            "coordinator_partition_loaded",
            partition=partition,
            leader_epoch=epoch,
            groups=len(self.groups_of(partition)),
            load_ms=self.now_ms() - started,
            skipped_records=contents.skipped,
        )

    def resign(self, partition: int) -> list[GroupMetadata]:
        """No longer the leader: stop serving ``partition``; returns its groups, removed."""
        self.loading.pop(partition, None)
        if self.owned.pop(partition, None) is None:
            return []
        groups = self.groups_of(partition)
        for group in groups:
            del self.groups[group.group_id]
        self.log.info("coordinator_partition_unloaded", partition=partition, groups=len(groups))
        return groups

    # --- writes -------------------------------------------------------------------------------

    def append(
        self,
        partition: int,
        entries: list[tuple[bytes, bytes | None]],
        done: Callable[[ErrorCode], None],
    ) -> None:
        """Append records with acks=all; ``done(error)`` once the in-sync replicas have them
        (or they cannot), the error already in the group APIs' terms."""
        body = {
            "acks": -1,
            "timeout_ms": self.config["offsets.commit.timeout.ms"],
            "topics": [
                {
                    "name": OFFSETS_TOPIC,
                    "partitions": [
                        {"partition": partition, "records": batch(entries, self.now_ms_wall())}
                    ],
                }
            ],
        }
        # No connection: a commit whose client went away still completes (and is cached).
        result = self.replica_manager.produce(body, None, internal_topics_allowed=True)

        def answered(response: dict) -> None:
            code = ErrorCode.parse(response["topics"][0]["partitions"][0]["error_code"])
            done(_APPEND_ERRORS.get(code, code))

        if isinstance(result, PendingResponse):
            result.add_done_callback(answered)
        elif result is not None and "topics" in result:
            answered(result)
        else:
            done(ErrorCode.parse((result or {}).get("error_code", -1)))

    @staticmethod
    def now_ms_wall() -> int:
        """Record timestamps are wall-clock (commit_timestamp), as Kafka's are."""
        return int(time.time() * 1000)
