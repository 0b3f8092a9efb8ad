"""A coordinator's internal topic, as both coordinators use it: ownership by leadership,
loading by replay, writing with acks=all (the part Kafka's GroupMetadataManager and
TransactionStateManager share through CoordinatorRuntime-like plumbing).

The group coordinator (``__consumer_offsets``) and the transaction coordinator
(``__transaction_state``) each serve the keys of the partitions of their topic that this
broker leads. Becoming leader starts a load: the partition's log replayed to its end into
a ``Replay`` (latest value per key wins), requests answering COORDINATOR_LOAD_IN_PROGRESS
meanwhile; losing leadership (or regaining it at a new epoch) unloads. Every write is an
acks=all produce through the replica manager and its purgatory.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import trio

from minibroker.broker.common.tasks import Spawner
from minibroker.broker.metadata.image import ClusterMetadata
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.protocol.errors import ErrorCode

LOAD_CHUNK_BYTES = 1 << 20

# What a failed append means to a coordinator's client (Kafka's managers map them so):
# retry against the same coordinator, find the new one, or give up.
APPEND_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
}


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (UTF-16 code units, int32 overflow): Kafka places group and
    transactional ids by it."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


# Every coordinator request asks it (is this broker the key's coordinator?): Java caches a
# String's hash, we cache the answer; bounded, as clients choose the ids.
@functools.lru_cache(maxsize=1 << 16)
def partition_for(key: str, partitions: int) -> int:
    """The partition of a coordinator topic that ``key`` (a group or transactional id)
    belongs to: Kafka's ``Utils.abs(key.hashCode) % partitions`` (Integer.MIN_VALUE maps
    to 0, not to itself)."""
    return (java_string_hash(key) & 0x7FFFFFFF) % partitions


class Replay(Protocol):
    """A partition's contents being rebuilt: ``replay`` takes whole batches, returns the
    next offset."""

    def replay(self, data: bytes) -> int: ...


class CoordinatorPartitions:
    """Which partitions of ``topic`` this broker coordinates, their loads and appends."""

    def __init__(
        self,
        topic: str,
        broker_id: int,
        logger: Any,
        replica_manager: ReplicaManager,
        tasks: Spawner,
        now_ms: Callable[[], int],
        num_partitions: int,
        append_errors: dict[ErrorCode, ErrorCode] | None = None,
    ) -> None:
        self.topic = topic
        self.broker_id = broker_id
        self.log = logger
        self.replica_manager = replica_manager
        self.tasks = tasks
        self.now_ms = now_ms
        self.owned: dict[int, int] = {}  # loaded partitions -> the leader epoch loaded at
        self.loading: dict[int, int] = {}  # partitions being loaded -> leader epoch
        # The topic's real partition count once it exists (it is fixed at creation).
        self.num_partitions = num_partitions
        self.append_errors = append_errors if append_errors is not None else APPEND_ERRORS

    def partition_error(self, partition: int) -> ErrorCode | None:
        """None when this broker serves ``partition`` now; else why not."""
        if partition in self.owned:
            return None
        if partition in self.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NOT_COORDINATOR

    # --- leadership ------------------------------------------------------------------------

    def leadership_changed(
        self,
        md: ClusterMetadata,
        unload: Callable[[int], None],
        load: Callable[[int, int], None],
    ) -> None:
        """For each partition of the topic: ``unload(p)`` what this broker lost (or lost and
        regained: what it holds may be stale), ``load(p, epoch)`` what it leads now."""
        topic = md.topics.get(self.topic)
        if topic is None:
            return
        self.num_partitions = len(topic.partitions)
        replicas = self.replica_manager.partitions
        for index, state in enumerate(topic.partitions):
            replica = replicas.get((self.topic, index))
            leads = state.leader == self.broker_id and replica is not None and replica.is_leader
            loaded_at = self.owned.get(index, self.loading.get(index))
            if loaded_at is not None and (not leads or loaded_at != state.leader_epoch):
                unload(index)
            if leads:
                load(index, state.leader_epoch)

    def start_load(
        self,
        partition: int,
        epoch: int,
        contents: Replay,
        on_loaded: Callable[[int, Any], None],
    ) -> None:
        """This broker leads ``partition`` at ``epoch``: replay its log, then serve it."""
        if self.owned.get(partition) is not None or self.loading.get(partition) == epoch:
            return
        self.loading[partition] = epoch
        self.tasks.start_soon(self._load, partition, epoch, contents, on_loaded)

    async def _load(
        self, partition: int, epoch: int, contents: Replay, on_loaded: Callable[[int, Any], None]
    ) -> None:
        started = self.now_ms()
        replica = self.replica_manager.partitions.get((self.topic, partition))
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
            topic=self.topic,
            partition=partition,
            leader_epoch=epoch,
            load_ms=self.now_ms() - started,
        )

    def resign_partition(self, partition: int) -> bool:
        """No longer the leader: stop serving ``partition``; True if it was loaded."""
        self.loading.pop(partition, None)
        return self.owned.pop(partition, None) is not None

    # --- writes ------------------------------------------------------------------------------

    def append(
        self, partition: int, records: bytes, timeout_ms: int, done: Callable[[ErrorCode], None]
    ) -> None:
        """Append a batch with acks=all; ``done(error)`` once the in-sync replicas have it
        (or it cannot be), the error already in the coordinator APIs' terms."""
        body = {
            "acks": -1,
            "timeout_ms": timeout_ms,
            "topics": [
                {"name": self.topic, "partitions": [{"partition": partition, "records": records}]}
            ],
        }
        # No connection: a write whose client went away still completes.
        result = self.replica_manager.produce(body, None, internal_topics_allowed=True)

        def answered(response: dict) -> None:
            code = ErrorCode.parse(response["topics"][0]["partitions"][0]["error_code"])
            done(self.append_errors.get(code, code))

        if isinstance(result, PendingResponse):
            result.add_done_callback(answered)
        elif result is not None and "topics" in result:
            answered(result)
        else:
            done(ErrorCode.parse((result or {}).get("error_code", -1)))


def coordinator_answer(md: ClusterMetadata, topic_name: str, partition: int) -> dict:
    """FindCoordinator's answer: the leader of ``partition`` of ``topic_name`` (native
    listener), or COORDINATOR_NOT_AVAILABLE while there is none."""
    topic = md.topics.get(topic_name)
    if topic is None or partition >= len(topic.partitions):
        return no_coordinator(None)
    leader = topic.partitions[partition].leader
    broker = md.brokers.get(leader)
    if broker is None:
        return no_coordinator(f"{topic_name}-{partition} has no leader")
    return {
        "error_code": 0,
        "node_id": broker.node_id,
        "host": broker.host,
        "port": broker.port,
        "error_message": None,
        "throttle_time_ms": 0,
    }


def no_coordinator(
    message: str | None, code: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE
) -> dict:
    return {
        "error_code": int(code),
        "node_id": -1,
        "host": "",
        "port": -1,
        "error_message": message,
        "throttle_time_ms": 0,
    }
