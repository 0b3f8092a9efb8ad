"""Partitions hosted by this broker, their roles, and the produce and fetch paths over them.

Mirrors Kafka's ReplicaManager: appends, reads bounded by HW or LEO, the two
purgatories, and "which triggers complete which purgatories" (kafka-semantics §5):
an append checks the fetch purgatory; an HW increase checks produce and fetch.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.common.file_region import FileRegion, RegionBody
from minibroker.broker.common.topic_config import log_config_values
from minibroker.broker.metadata.check import topic_name_error
from minibroker.broker.metadata.image import PartitionState, TopicState
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.network.session import ConnectionSession
from minibroker.broker.purgatory import DelayedOperation, Purgatory
from minibroker.broker.quota import ReplicationQuota
from minibroker.broker.replication.delayed import (
    DelayedFetch,
    DelayedProduce,
    ProducePartitionStatus,
    produce_response,
)
from minibroker.broker.replication.delete_records import DelayedDeleteRecords, delete_records
from minibroker.broker.replication.fetch_request import FetchRequest
from minibroker.broker.replication.fetch_sessions import ReplicaFetchSessions
from minibroker.broker.replication.offset_queries import list_offsets, offsets_for_leader_epoch
from minibroker.broker.replication.partition import Partition
from minibroker.broker.replication.txn_markers import write_txn_markers
from minibroker.broker.storage import Log, LogConfig
from minibroker.broker.storage.epoch_cache import LeaderEpochCache
from minibroker.broker.storage.offset_checkpoint import (
    RECOVERY_POINT_FILE,
    CorruptCheckpoint,
    read_checkpoint,
    write_checkpoint,
)
from minibroker.broker.storage.partition_metadata import claim_partition_dir, read_topic_id
from minibroker.broker.storage.results import ReadResult
from minibroker.protocol import GROUP_METADATA_TOPIC, INTERNAL_TOPICS
from minibroker.protocol.errors import ErrorCode, InvalidRequest, KafkaError

Key = tuple[str, int]

# Shared consumer answers kept at once (see ReplicaManager._consumer_read): a
# burst of identical long polls needs one; the bounds keep a varied load from holding
# records for long.
SHARED_ANSWERS = 256
SHARED_ANSWER_BYTES = 8 << 20


def duplicate_partition(topics: list[dict]) -> str | None:
    """The first topic-partition named twice in a request's topics, or None.

    Kafka refuses these (INVALID_REQUEST): a produce naming one partition three times
    stored three batches and answered once; a fetch would read it twice.
    """
    seen: set[Key] = set()
    for t in topics:
        for p in t["partitions"]:
            key = (t["name"], p["partition"])
            if key in seen:
                name = t["name"] if len(t["name"]) <= 100 else t["name"][:100] + "..."
                return f"{name}-{p['partition']}"
            seen.add(key)
    return None


def _topic_refusal(topic: str, internal_topics_allowed: bool) -> str | None:
    """Why a produce to ``topic`` is refused with INVALID_TOPIC_EXCEPTION, or None.

    An internal topic: Kafka's appendToLocalLog check and message. An illegal name
    (``bad$#!``, ``..``, too long) can never exist: refused at once, not answered
    UNKNOWN_TOPIC_OR_PARTITION, which a producer would retry until its delivery timeout.
    """
    if topic in INTERNAL_TOPICS and not internal_topics_allowed:
        return f"Cannot append to internal topic {topic}"
    return topic_name_error(topic)


def _invalid_request(message: str) -> dict:
    return {"error_code": int(ErrorCode.INVALID_REQUEST), "error_message": message}


def log_config_from(config: BrokerConfig, overrides: dict[str, str] | None = None) -> LogConfig:
    """Broker defaults with per-topic overrides (Kafka's topic-level names)."""
    return LogConfig(
        **log_config_values(config, overrides),
        max_decompressed_bytes=config["message.max.decompressed.bytes"],
    )


class ReplicaManager:
    def __init__(
        self,
        broker_id: int,
        data_dir: Path,
        config: BrokerConfig,
        logger: Any,
        fetch_purgatory: Purgatory,
        produce_purgatory: Purgatory,
        now_ms: Callable[[], int],
    ) -> None:
        self.broker_id = broker_id
        self.data_dir = data_dir
        self.config = config
        self.logger = logger
        self.fetch_purgatory = fetch_purgatory
        self.produce_purgatory = produce_purgatory
        self.now_ms = now_ms
        self.partitions: dict[Key, Partition] = {}
        # What delayed operations get instead of this manager: bound once, shared by all.
        self._lookup = self.partitions.get
        self._read_for_purgatory = self._read_completed_fetch
        # Answers to identical consumer fetches (see _consumer_read). The key holds
        # the partitions it read, so an id is never reused while its answer is kept.
        self._shared_answers: dict[tuple, tuple[dict, int, bool]] = {}
        self._shared_bytes = 0  # records held by those answers
        self.fetch_max_bytes: int = config["fetch.max.bytes"]
        self.fetch_sessions = ReplicaFetchSessions(self._follows_here)
        # Parked operations by the connection that asked: they die with it.
        self._parked: dict[ConnectionSession, set[DelayedOperation]] = {}
        self.topic_configs: dict[str, dict[str, str]] = {}
        # None: the last shutdown was clean (logs trust their sealed segments). After an
        # unclean one, the checkpointed recovery points logs recover from (see
        # load_recovery_points).
        self.recovery_points: dict[Key, int] | None = None
        # The checkpoint is written from the loop (a truncation, shutdown) and from a
        # worker thread (the periodic task): one write at a time, never an older set of
        # recovery points over a newer one (numbered as they are taken).
        self._checkpoint_lock = threading.Lock()
        self._checkpoints_taken = 0
        self._checkpoint_written = 0
        self.cleaner: Any = None  # the LogCleanerManager housekeeping runs, if enabled
        # The topic id each hosted topic's replicas were made for: a namesake created after
        # a DeleteTopics has another, and the old replicas go (drop_deleted).
        self.topic_ids: dict[str, str] = {}
        self._strays_checked = False
        # Sends a Partition's proposed ISR to the controller (cluster mode; set by the server).
        self.on_isr_change: Callable[[Partition, list[int]], None] | None = None
        # A write to the data dir failed (disk full, I/O error, read-only): the server
        # takes the log dir offline (Kafka's LogDirFailureChannel). Set by the server.
        self.on_storage_error: Callable[[OSError, str], None] | None = None
        # Why the log dir is offline, once it is: appends answer KAFKA_STORAGE_ERROR.
        self.offline_reason: str | None = None
        # Told of every replicated transaction marker on a __consumer_offsets partition:
        # listener(topic, partition, producer_id, commit). The group coordinator registers.
        self.txn_marker_listeners: list[Callable[[str, int, int, bool], None]] = []
        # Bound by leader.replication.throttled.rate, live (broker/quota/replication.py).
        self.leader_quota: ReplicationQuota | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def partition_dir(self, topic: str, index: int) -> Path:
        # Names reach here from the wire: never let one leave the data dir or alias
        # another partition's directory, whatever check upstream was missed.
        if topic_name_error(topic) is not None or type(index) is not int or index < 0:
            raise ValueError(f"refusing partition directory for {topic[:64]!r}-{index!r}")
        return self.data_dir / f"{topic}-{index}"

    def open_replica(
        self, topic: str, index: int, state: PartitionState, topic_id: str = ""
    ) -> Partition:
        """Open (or create) a replica's files, not yet hosted: only file work and new
        objects, so it may run in a worker thread (creating a partition is ~10 ms of
        fsyncs; MetadataPublisher opens many at once off the loop). A leader's epoch is
        checkpointed here, so ``make_leader`` finds it done and writes nothing."""
        directory = self.partition_dir(topic, index)
        # A directory left by a deleted topic of the same name is removed first.
        if claim_partition_dir(directory, topic_id):
            self.logger.info(
                "stale_replica_removed", topic=topic, partition=index, topic_id=topic_id
            )
        points = self.recovery_points
        log = Log.open(
            directory,
            self.log_config_for(topic),
            now_ms=lambda: int(time.time() * 1000),
            logger=self.logger.bind(topic=topic, partition=index),
            recovery_point=None if points is None else points.get((topic, index), 0),
        )
        cache = LeaderEpochCache(directory)
        if state.leader == self.broker_id:
            cache.assign(state.leader_epoch, log.log_end_offset)
        partition = Partition(topic, index, log, self.broker_id, cache, self._propose_isr)
        partition.on_truncated = self.checkpoint_recovery_points
        return partition

    def log_config_for(self, topic: str) -> LogConfig:
        """The topic's LogConfig: its overrides over this broker's (dynamic) settings."""
        overrides = self.topic_configs.get(topic)
        if topic == GROUP_METADATA_TOPIC and "cleanup.policy" not in (overrides or {}):
            # Created before it was created compacted: Kafka's is always compacted, and a
            # time retention would delete live groups' offsets.
            overrides = {**(overrides or {}), "cleanup.policy": "compact"}
        return log_config_from(self.config, overrides)

    def reconfigure_logs(self, topics: set[str] | None) -> None:
        """Configs changed (IncrementalAlterConfigs committed): every hosted log of
        ``topics`` (None: all, a broker default changed) takes its new LogConfig, live, as
        Kafka's log.updateConfig: the next append, roll, retention pass or cleaning uses it."""
        built: dict[str, LogConfig] = {}
        for (topic, index), partition in self.partitions.items():
            if topics is not None and topic not in topics:
                continue
            config = built.get(topic)
            if config is None:
                config = built[topic] = self.log_config_for(topic)
            if partition.log.config != config:
                partition.log.config = config
                self.logger.info("log_config_updated", topic=topic, partition=index)

    def adopt(self, partition: Partition, topic_id: str = "") -> None:
        """Host a replica ``open_replica`` made, with no role until ``host_partition``
        gives it one (produce and fetch answer NOT_LEADER_OR_FOLLOWER until then)."""
        self.topic_ids[partition.topic] = topic_id
        self.partitions.setdefault(partition.key, partition)

    def host_partition(
        self, topic: str, index: int, state: PartitionState, topic_id: str = ""
    ) -> Partition:
        """Open (or create) the local replica and take the role the metadata gives it."""
        key = (topic, index)
        partition = self.partitions.get(key)
        if partition is None:
            partition = self.partitions[key] = self.open_replica(topic, index, state, topic_id)
        self.topic_ids[topic] = topic_id
        partition.min_insync_replicas = self.min_insync_replicas(topic)
        if state.leader == self.broker_id:
            if partition.make_leader(state, self.now_ms()):
                self._hw_increased(key)
        elif partition.make_follower(state):
            # Leadership lost: pending acks=all produces and fetches now answer
            # NOT_LEADER_OR_FOLLOWER (Kafka's completeDelayedOperationsWhenNotPartitionLeader).
            self._hw_increased(key)
        return partition

    def drop_deleted(self, topics: Mapping[str, TopicState], *, caught_up: bool) -> None:
        """Remove the replicas, files and all, of topics the metadata no longer has (or has
        under another topic id: deleted and created again). Parked produces and fetches on
        them answer UNKNOWN_TOPIC_OR_PARTITION now; the caller stops their fetchers.

        ``caught_up``: the metadata has reached the quorum's commit point since this broker
        started, so a partition directory whose topic it lacks was deleted while this broker
        was down; removed once (before that, a topic may just not be read back yet).
        """
        for key in [
            k
            for k in self.partitions
            if k[0] not in topics or topics[k[0]].topic_id != self.topic_ids.get(k[0])
        ]:
            self._remove_partition(key)
        for name in [n for n in self.topic_ids if n not in topics]:
            del self.topic_ids[name]
            self.topic_configs.pop(name, None)
        if caught_up and not self._strays_checked:
            self._strays_checked = True
            self._remove_strays(topics)

    def _remove_partition(self, key: Key) -> None:
        partition = self.partitions.pop(key)
        try:
            partition.log.close()
        except Exception:
            self.logger.exception("log_close_failed", topic=key[0], partition=key[1])
        shutil.rmtree(self.partition_dir(*key), ignore_errors=True)
        self._shared_answers.clear()  # none may answer for the removed replica
        self._shared_bytes = 0
        self._hw_increased(key)  # its parked operations find no partition and answer
        self.logger.info("partition_deleted", topic=key[0], partition=key[1])

    def _remove_strays(self, topics: Mapping[str, TopicState]) -> None:
        """Directories of topic ids the metadata does not have: deleted while we were down."""
        try:
            entries = list(self.data_dir.iterdir())
        except OSError:
            return
        for directory in entries:
            topic, _, index = directory.name.rpartition("-")
            if not index.isdigit() or (topic, int(index)) in self.partitions:
                continue
            topic_id = read_topic_id(directory)
            known = topics.get(topic)
            if topic_id and (known is None or known.topic_id != topic_id):
                shutil.rmtree(directory, ignore_errors=True)
                self.logger.info("stray_replica_removed", directory=directory.name)

    def min_insync_replicas(self, topic: str) -> int:
        value = self.topic_configs.get(topic, {}).get("min.insync.replicas")
        return int(value) if value is not None else self.config["min.insync.replicas"]

    def close(self) -> None:
        """Close every log (each flushed to its end), then checkpoint their recovery points:
        at the next start nothing needs recovering (Kafka's LogManager.shutdown)."""
        for partition in self.partitions.values():
            try:
                partition.log.close()
            except Exception:
                self.logger.exception(
                    "log_close_failed", topic=partition.topic, partition=partition.index
                )
        try:
            self.take_recovery_checkpoint()()
        except OSError as exc:
            self.logger.error("recovery_point_checkpoint_failed", error=str(exc))

    # --- recovery points --------------------------------------------------------------------

    def load_recovery_points(self, clean_shutdown: bool) -> None:
        """Before any log opens: after an unclean shutdown, read the recovery points its
        logs recover from; one that cannot be read means recovering everything (Kafka
        resets them to 0 with a warning)."""
        if clean_shutdown:
            self.recovery_points = None
            return
        path = self.data_dir / RECOVERY_POINT_FILE
        try:
            self.recovery_points = read_checkpoint(path)
        except CorruptCheckpoint as exc:
            self.logger.warning("recovery_point_checkpoint_unreadable", error=str(exc))
            self.recovery_points = {}
        self.logger.info("recovery_points_loaded", partitions=len(self.recovery_points))

    def checkpoint_recovery_points(self) -> None:
        """Write the checkpoint now: a truncation moved a recovery point back, and a crash
        before the next periodic write must not trust what is appended after it."""
        try:
            self.take_recovery_checkpoint()()
        except OSError as exc:
            self.storage_failed(exc, "checkpointing recovery points after a truncation")

    def take_recovery_checkpoint(self) -> Callable[[], None]:
        """Every hosted log's recovery point as of now (on the loop), and the write of them
        to run here or in a worker thread, a no-op if a later set was written first. A
        rolled segment's failed flush raises its OSError here (the log dir is failing)."""
        points = {key: p.log.recovery_point for key, p in self.partitions.items()}
        self._checkpoints_taken += 1
        taken = self._checkpoints_taken
        path = self.data_dir / RECOVERY_POINT_FILE

        def write() -> None:
            with self._checkpoint_lock:
                if taken > self._checkpoint_written:
                    write_checkpoint(path, points)
                    self._checkpoint_written = taken

        return write

    def remove_expired_producers(self, now_ms: int) -> int:
        """Kafka's producer-id expiration task, over every partition."""
        expiration = self.config["producer.id.expiration.ms"]
        return sum(
            p.log.producers.remove_expired(now_ms, expiration) for p in self.partitions.values()
        )

    def delete_old_segments(self) -> int:
        return sum(p.log.delete_old_segments(p.high_watermark) for p in self.partitions.values())

    # --- purgatory triggers ---------------------------------------------------------------

    def storage_failed(self, exc: OSError, during: str) -> None:
        """Report a failed write to the data dir (see on_storage_error)."""
        if self.on_storage_error is not None:
            self.on_storage_error(exc, during)

    def _hw_increased(self, key: Key) -> None:
        self.produce_purgatory.check_and_complete(key)
        self.fetch_purgatory.check_and_complete(key)

    # --- parked operations and their connections --------------------------------------

    def _park(
        self,
        purgatory: Purgatory,
        op: DelayedFetch | DelayedProduce | DelayedDeleteRecords,
        keys: list[Key],
        session: ConnectionSession | None,
    ) -> dict | PendingResponse:
        pending = op.response
        purgatory.try_complete_else_watch(op, keys)
        if pending.body is not None:
            return pending.body
        if session is not None:
            parked = self._parked.get(session)
            if parked is None:
                parked = self._parked[session] = set()
                session.on_close(lambda: self._connection_closed(session))
            parked.add(op)
            op.parked_in = parked  # the op leaves this set when it completes
        return pending

    def _connection_closed(self, session: ConnectionSession) -> None:
        """Nobody is left to answer: complete its parked ops now, leave the timer, free them.

        Completed ops are skipped by triggers and dropped by the purgatory's purge. A
        produce's records stay appended (they were written); only the waiting stops.
        """
        parked = self._parked.pop(session, None)
        if not parked:
            return
        ops = list(parked)
        for op in ops:
            op.abandon()
        self.logger.debug("parked_requests_abandoned", peer=session.peer, count=len(ops))

    # --- produce --------------------------------------------------------------------------

    def produce(
        self,
        body: dict,
        session: ConnectionSession | None = None,
        internal_topics_allowed: bool = False,
    ) -> dict | PendingResponse | None:
        """Kafka's appendRecords; an internal topic (INTERNAL_TOPICS) takes appends only
        from a caller that says ``internal_topics_allowed`` (its own coordinator, the admin
        client id), and an illegal topic name none (see _topic_refusal)."""
        duplicate = duplicate_partition(body["topics"])
        if duplicate is not None:
            # Before anything is appended. acks=0 expects no answer: log it instead.
            message = f"partition {duplicate} appears more than once in one produce request"
            if body["acks"] == 0:
                self.logger.info("produce_refused", error="INVALID_REQUEST", reason=message)
                return None
            return _invalid_request(message)
        acks = body["acks"]
        statuses: dict[Key, ProducePartitionStatus] = {}
        if acks not in (-1, 0, 1):
            for t in body["topics"]:
                for p in t["partitions"]:
                    statuses[(t["name"], p["partition"])] = ProducePartitionStatus(
                        ErrorCode.INVALID_REQUIRED_ACKS, -1, -1
                    )
            return produce_response(statuses)
        appended = []
        for t in body["topics"]:
            topic = t["name"]
            refused = _topic_refusal(topic, internal_topics_allowed)
            for p in t["partitions"]:
                key = (topic, p["partition"])
                if refused is not None:
                    statuses[key] = ProducePartitionStatus(
                        ErrorCode.INVALID_TOPIC_EXCEPTION, -1, -1, refused
                    )
                    continue
                statuses[key] = self._append(key, p["records"], acks)
                if statuses[key].acks_pending:
                    appended.append(key)
        if acks == 0:
            return None  # Kafka sends no response to acks=0
        if acks == 1 or not appended:
            for status in statuses.values():
                if status.acks_pending:
                    status.acks_pending = False
                    status.error = ErrorCode.NONE
            return produce_response(statuses)
        op = DelayedProduce(body["timeout_ms"], statuses, self._lookup)
        return self._park(self.produce_purgatory, op, appended, session)

    def _append(self, key: Key, records: bytes, acks: int) -> ProducePartitionStatus:
        partition = self.partitions.get(key)
        if partition is None:
            return ProducePartitionStatus(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)
        if self.offline_reason is not None:
            return ProducePartitionStatus(
                ErrorCode.KAFKA_STORAGE_ERROR, -1, -1, self.offline_reason
            )
        try:
            hw_before = partition.high_watermark
            info = partition.append_records_to_leader(records, acks)
        except KafkaError as exc:
            return ProducePartitionStatus(
                exc.code, -1, -1, exc.message or None, getattr(exc, "record_errors", None)
            )
        except OSError as exc:
            self.storage_failed(exc, f"appending to {key[0]}-{key[1]}")
            return ProducePartitionStatus(
                ErrorCode.KAFKA_STORAGE_ERROR, -1, -1, self.offline_reason
            )
        except Exception:
            self.logger.exception("append_failed", topic=key[0], partition=key[1])
            return ProducePartitionStatus(ErrorCode.KAFKA_STORAGE_ERROR, -1, -1)
        self.appended(key, partition, hw_before)
        return ProducePartitionStatus(ErrorCode.NONE, info.first_offset, info.last_offset + 1)

    def appended(self, key: Key, partition: Partition, hw_before: int) -> None:
        """After an append: the purgatories that it may complete."""
        if partition.high_watermark > hw_before:
            self._hw_increased(key)
        else:
            # Followers long-poll on the LEO: new data may complete their fetches.
            self.fetch_purgatory.check_and_complete(key)

    def park_produce(
        self, op: DelayedProduce, keys: list[Key], session: ConnectionSession | None
    ) -> dict | PendingResponse:
        """Wait for the ISR as an acks=all produce does (WriteTxnMarkers' markers)."""
        return self._park(self.produce_purgatory, op, keys, session)

    def write_txn_markers(
        self, body: dict, session: ConnectionSession | None = None
    ) -> dict | PendingResponse:
        """WriteTxnMarkers: broker/replication/txn_markers.py."""
        return write_txn_markers(self, body, session)

    # --- fetch ----------------------------------------------------------------------------

    def fetch_request(self, body: dict, version: int = 0) -> FetchRequest:
        """A validated Fetch body as the read path takes it; InvalidRequest if it names a
        partition twice.

        The network layer prepares each distinct Fetch body once and hands every sender
        of the same bytes the same FetchRequest (thousands of consumers long-polling one
        partition send the same bytes over and over); it is never changed once made.
        """
        duplicate = duplicate_partition(body["topics"])
        if duplicate is not None:
            raise InvalidRequest(
                f"partition {duplicate} appears more than once in one fetch request"
            )
        # Version 2: a follower's session fills in the partitions it did not name
        # (broker/replication/fetch_sessions.py); such a Fetch is its session's, never shared.
        session_id = self.fetch_sessions.resolve(body) if version >= 2 else 0
        fetch = FetchRequest(body, self.fetch_max_bytes, version)
        fetch.session_id = session_id
        return fetch

    def _follows_here(self, replica_id: int) -> bool:
        """Whether ``replica_id`` follows a partition this broker leads (fetch sessions)."""
        return any(
            p.is_leader and replica_id in p.replicas and replica_id != self.broker_id
            for p in self.partitions.values()
        )

    def fetch(
        self, fetch: FetchRequest, session: ConnectionSession | None = None
    ) -> dict | PendingResponse:
        if fetch.for_follower:
            response, total, stop_now = self._read(fetch, update_follower_state=True)
        else:
            response, total, stop_now = self._consumer_read(fetch)
        max_wait = fetch.max_wait_ms
        if max_wait <= 0 or stop_now or total >= fetch.min_bytes or not fetch.targets:
            return response
        op = DelayedFetch(max_wait, fetch, self._lookup, self._read_for_purgatory)
        return self._park(self.fetch_purgatory, op, [key for key, _, _ in fetch.targets], session)

    def _read_completed_fetch(self, fetch: FetchRequest) -> dict:
        """A DelayedFetch's answer: read again, not a follower fetch (readFromPurgatory)."""
        if fetch.for_follower:
            return self._read(fetch, update_follower_state=False)[0]
        return self._consumer_read(fetch)[0]

    def _consumer_read(self, fetch: FetchRequest) -> tuple[dict, int, bool]:
        """``_read`` for a consumer, shared by identical fetches.

        Consumers long-polling the same offsets read the same answer: thousands at the
        log end (empty), expiring in one tick, or woken by one append (the same records).
        A consumer reads below the HW, which never changes under a partition's leader
        epoch, so an answer is shared while every partition it read is the same object
        with the same role, epoch, HW, log start and end: read once, and packed once
        (broker/network/socket_server.py), not per fetch (bench longpoll). Answers are never changed
        once made.
        """
        lookup = self.partitions.get
        state = []
        for key, _, _ in fetch.targets:
            partition = lookup(key)
            if partition is None:
                state.append(None)
                continue
            log = partition.log
            state.append(
                (
                    partition,
                    partition.is_leader,
                    partition.leader_epoch,
                    partition.high_watermark,
                    log.log_start_offset,
                    log.log_end_offset,
                    # the LSO's inputs besides the HW: transactions opening and closing
                    log.producers.first_ongoing,
                    len(log.txn_index),
                )
            )
        shared = self._shared_answers
        key = (fetch.shape, tuple(state))
        answer = shared.get(key)
        if answer is None:
            answer = self._read(fetch, update_follower_state=False)
            size = answer[1]
            self._shared_bytes += size
            if len(shared) >= SHARED_ANSWERS or self._shared_bytes > SHARED_ANSWER_BYTES:
                shared.clear()
                self._shared_bytes = size
            shared[key] = answer
        return answer

    def _read(self, fetch: FetchRequest, *, update_follower_state: bool) -> tuple[dict, int, bool]:
        """Read every partition; returns (response body, bytes, whether to answer at once)."""
        topics: dict[str, list] = {}
        budget = fetch.max_bytes
        total = 0
        stop_now = False
        regions = False
        known_hw = fetch.known_hw
        count_fetches = fetch.for_follower and update_follower_state
        now_ms = self.now_ms()  # one read: a follower's fetch may name hundreds of partitions
        for key, offset, max_bytes in fetch.targets:
            partition = self.partitions.get(key)
            counted = not count_fetches
            if (
                known_hw
                and partition is not None
                and partition.high_watermark == known_hw.get(key)
                # (a follower that names no start: as before starts were sent)
                and fetch.known_start.get(key, partition.log.log_start_offset)
                >= partition.log.log_start_offset
                and offset == partition.log.log_end_offset
                and partition.is_leader
                and fetch.epochs[key] in (-1, partition.leader_epoch)
                and fetch.replica_id in partition.replicas
            ):
                # The follower has all of it, HW included: nothing to answer (see
                # FetchRequest.known_hw). The fetch still counts as the follower's; if it
                # moved the HW, the answer carries the new one.
                if partition.note_follower_start(fetch.replica_id, fetch.known_start.get(key, -1)):
                    self.produce_purgatory.check_and_complete(key)  # a DeleteRecords waits
                if counted or not partition.update_follower_fetch_state(
                    fetch.replica_id, offset, now_ms
                ):
                    continue
                self._hw_increased(key)
                counted = True
            entry = {"partition": key[1], "error_code": 0, "high_watermark": -1, "records": b""}
            topics.setdefault(key[0], []).append(entry)
            if partition is None:
                entry["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                stop_now = True
                continue
            if not partition.is_leader:
                entry["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER
                stop_now = True
                continue
            epoch = fetch.epochs[key]
            if epoch >= 0 and epoch != partition.leader_epoch:
                # A fetch for another epoch: an old leader's follower, or metadata we lack yet.
                code = (
                    ErrorCode.FENCED_LEADER_EPOCH
                    if epoch < partition.leader_epoch
                    else ErrorCode.UNKNOWN_LEADER_EPOCH
                )
                entry["error_code"] = int(code)
                stop_now = True
                continue
            if fetch.for_follower and fetch.replica_id not in partition.replicas:
                # An authenticated broker, but not a replica of this partition.
                entry["error_code"] = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
                entry["error_message"] = (
                    f"broker {fetch.replica_id} is not a replica of {key[0]}-{key[1]}"
                )
                stop_now = True
                continue
            log = partition.log
            entry["high_watermark"] = partition.high_watermark
            entry["log_start_offset"] = log.log_start_offset
            entry["log_end_offset"] = log.log_end_offset
            if fetch.transactions:
                entry["last_stable_offset"] = partition.last_stable_offset
            quota = self.leader_quota
            throttled = (
                quota is not None
                and fetch.for_follower
                and quota.throttles(self.topic_configs.get(key[0]), key[1])
            )
            try:
                if throttled and quota.exceeded():
                    # Kafka's shouldLeaderThrottle: no records for this replica until the
                    # leader's replication rate is back under its bound.
                    result = ReadResult(b"", offset, offset)
                else:
                    result = partition.read_result(
                        offset,
                        min(max_bytes, budget),
                        for_follower=fetch.for_follower,
                        min_one_batch=total == 0,
                        committed=fetch.committed,
                        region=fetch.for_follower,
                    )
                    if throttled:
                        quota.record(len(result.data))
            except KafkaError as exc:
                entry["error_code"] = int(exc.code)
                entry["error_message"] = str(exc)
                stop_now = True
                continue
            data = result.data
            entry["records"] = data
            if type(data) is FileRegion:
                regions = True
            if fetch.committed and fetch.transactions:
                # Kafka's: the aborted transactions with records in what is returned.
                entry["aborted_transactions"] = (
                    [
                        {"producer_id": pid, "first_offset": first}
                        for pid, first in log.collect_aborted(offset, result.next_offset)
                    ]
                    if data
                    else []
                )
            total += len(data)
            budget = max(0, budget - len(data))
            if not counted and partition.update_follower_fetch_state(
                fetch.replica_id, offset, now_ms
            ):
                self._hw_increased(key)
            if fetch.for_follower and partition.note_follower_start(
                fetch.replica_id, fetch.known_start.get(key, -1)
            ):
                self.produce_purgatory.check_and_complete(key)  # a DeleteRecords may wait
        body = {"topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}
        if fetch.session_id:
            body["session_id"] = fetch.session_id
        if regions:  # sent from the segment files (broker/network/parts.py)
            body = RegionBody(body)
        return body, total, stop_now

    # --- ISR changes -----------------------------------------------------------------------

    def _propose_isr(self, partition: Partition, new_isr: list[int]) -> None:
        """Partitions propose ISR changes here; the server sends them (AlterPartition)."""
        if self.on_isr_change is not None:
            self.on_isr_change(partition, new_isr)

    def isr_update_accepted(
        self, partition: Partition, leader_epoch: int, isr: list[int], partition_epoch: int
    ) -> None:
        """The controller accepted this leader's ISR proposal (AlterPartition answer)."""
        # A shrink can let the HW move, and with it pending acks=all produces.
        if partition.apply_isr_update(leader_epoch, isr, partition_epoch):
            self._hw_increased(partition.key)

    def isr_proposal_ended(self, partition: Partition) -> None:
        """This leader's ISR proposal was refused or lost (no AlterPartition answer)."""
        if partition.isr_proposal_ended():
            self._hw_increased(partition.key)

    def maybe_shrink_isr(self, now_ms: int, lag_ms: int) -> None:
        """Kafka's isr-expiration task: each leader proposes its ISR without laggards."""
        # A copy: on the controller a proposal applies new metadata before it returns.
        for partition in list(self.partitions.values()):
            out = partition.maybe_shrink_isr(now_ms, lag_ms)
            if out:
                self.logger.info(
                    "isr_shrink_proposed",
                    topic=partition.topic,
                    partition=partition.index,
                    out_of_sync=out,
                )

    # --- offset lookups (read-only, broker/replication/offset_queries.py) -----------------------------

    def offsets_for_leader_epoch(self, body: dict) -> dict:
        return offsets_for_leader_epoch(self._lookup, body)

    def list_offsets(self, body: dict) -> dict:
        return list_offsets(self._lookup, body)

    def delete_records(
        self, body: dict, session: ConnectionSession | None = None
    ) -> dict | PendingResponse:
        """DeleteRecords: answered once the in-sync replicas moved their start too."""
        answer, waiting = delete_records(self._lookup, body)
        if not waiting:
            return answer
        op = DelayedDeleteRecords(body["timeout_ms"], answer, waiting, self._lookup)
        return self._park(self.produce_purgatory, op, list(waiting), session)
