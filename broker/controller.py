"""The controller role: owns cluster metadata, assigns replicas, elects leaders, persists.

Exactly one broker (``controller.id``, default the lowest id) runs this. Every change
is made on a draft and persisted atomically before it becomes the controller's
metadata and is published to the brokers: a restarted controller never forgets a
topic or hands out an old leader epoch again, and a failed save (disk full, read-only
directory) changes nothing anywhere — the request that caused it gets
KAFKA_STORAGE_ERROR and the broker keeps serving.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from protocol.errors import ErrorCode, KafkaStorageError

from .config import BrokerConfig
from .metadata import (
    BrokerInfo,
    ClusterMetadata,
    MetadataStoreError,
    PartitionState,
    TopicState,
    load_metadata,
    save_metadata,
)
from .metadata_check import topic_name_error
from .placement import assign_replicas
from .storage.limits import partition_cap_error
from .topic_config import topic_configs_error

METADATA_FILE = "cluster-metadata.json"

__all__ = ["METADATA_FILE", "Controller", "MetadataPersistError", "topic_name_error"]


class MetadataPersistError(KafkaStorageError):
    """The metadata change could not be saved, so it was not made."""


class Controller:
    def __init__(
        self,
        broker_id: int,
        data_dir: Path,
        config: BrokerConfig,
        logger: Any,
        publish: Callable[[ClusterMetadata], None],
    ) -> None:
        self.broker_id = broker_id
        self.path = data_dir / METADATA_FILE
        self.config = config
        self.log = logger
        self.publish = publish
        # A corrupt file raises MetadataStoreError naming it: the broker exits with that line.
        self.metadata = load_metadata(self.path) or ClusterMetadata()
        self.metadata.controller_id = broker_id
        self.metadata.live.add(broker_id)
        self._changed = False

    @contextmanager
    def _change(self, *, publish: bool = True) -> Iterator[ClusterMetadata]:
        """Make a change on a draft; persist it; only then apply and publish it.

        Inside the block ``self.metadata`` is the draft (helpers read it there) and
        ``self.commit()`` marks it changed. If the block or the save fails, the committed
        object, never touched, stays the metadata; a failed save raises
        MetadataPersistError for the caller to answer with.
        """
        committed = self.metadata
        draft = committed.copy()
        self.metadata = draft
        self._changed = False
        try:
            yield draft
            if self._changed:
                draft.epoch += 1
                try:
                    save_metadata(self.path, draft)
                except OSError as exc:
                    self.log.error("metadata_save_failed", path=str(self.path), error=str(exc))
                    raise MetadataPersistError(
                        f"controller {self.broker_id} cannot save cluster metadata to "
                        f"{self.path}: {exc.strerror or exc}; nothing was changed"
                    ) from None
        except BaseException:
            self.metadata = committed
            raise
        if self._changed and publish:
            self.publish(draft)

    def commit(self) -> None:
        """Mark the draft of the current ``_change`` as changed: it will be saved, then published."""
        self._changed = True

    def register_self(self, info: BrokerInfo) -> None:
        """At start, before anything is served: a failed save stops the broker with one line."""
        try:
            with self._change(publish=False):
                self._register(info)
        except MetadataPersistError as exc:
            raise MetadataStoreError(exc.message) from None

    def register_broker(self, info: BrokerInfo) -> None:
        md = self.metadata
        if md.brokers.get(info.node_id) != info or info.node_id not in md.live:
            with self._change():
                self._register(info)

    def _register(self, info: BrokerInfo) -> None:
        md = self.metadata
        if md.brokers.get(info.node_id) != info:
            md.brokers[info.node_id] = info
            self.log.info("broker_registered", node_id=info.node_id, host=info.host, port=info.port)
            self.commit()
        if self._unfence(info.node_id):
            self.commit()

    # --- liveness and leader election ---------------------------------------------------------

    def broker_alive(self, broker_id: int) -> None:
        """A heartbeat: a fenced broker that heartbeats again is live again."""
        md = self.metadata
        if broker_id in md.brokers and broker_id not in md.live:
            with self._change():
                self._unfence(broker_id)
                self.commit()

    def _unfence(self, broker_id: int) -> bool:
        md = self.metadata
        if broker_id in md.live:
            return False
        md.live.add(broker_id)
        self.log.info("broker_unfenced", node_id=broker_id)
        # Partitions that went offline with this broker as their last ISR member come back.
        for topic in md.topics.values():
            for index, state in enumerate(topic.partitions):
                if state.leader < 0 and broker_id in state.isr:
                    self._elect(topic.name, index, state, reason="replica_returned")
        return True

    def fence(self, broker_id: int, reason: str) -> None:
        """Take a dead (or cleanly stopping) broker out: move its leaderships, shrink ISRs."""
        if broker_id not in self.metadata.live or broker_id == self.broker_id:
            return
        with self._change() as md:
            self._fence(md, broker_id, reason)

    def _fence(self, md: ClusterMetadata, broker_id: int, reason: str) -> None:
        md.live.discard(broker_id)
        self.log.warning("broker_fenced", node_id=broker_id, reason=reason)
        for topic in md.topics.values():
            for index, state in enumerate(topic.partitions):
                if state.leader == broker_id:
                    self._elect(topic.name, index, state, reason=reason)
                elif broker_id in state.isr and len(state.isr) > 1:
                    state.isr = [r for r in state.isr if r != broker_id]
                    state.partition_epoch += 1
        self.commit()

    def _elect(self, topic: str, index: int, state: PartitionState, reason: str) -> None:
        """A new leader from the live ISR (outside it only with unclean election), new epoch."""
        live = self.metadata.live
        candidates = [r for r in state.replicas if r in state.isr and r in live]
        unclean = False
        if not candidates and self.config["unclean.leader.election.enable"]:
            candidates = [r for r in state.replicas if r in live]
            unclean = bool(candidates)
        old = state.leader
        state.leader = candidates[0] if candidates else -1
        state.leader_epoch += 1
        state.partition_epoch += 1
        if state.leader >= 0:
            if unclean:
                state.isr = [state.leader]
            elif len(state.isr) > 1:
                state.isr = [r for r in state.isr if r in live or r == state.leader]
        self.log.info(
            "leader_elected" if state.leader >= 0 else "partition_offline",
            topic=topic,
            partition=index,
            old_leader=old,
            new_leader=state.leader,
            leader_epoch=state.leader_epoch,
            isr=state.isr,
            reason=reason,
            unclean=unclean,
        )

    def create_topics(self, topics: list[dict], validate_only: bool = False) -> list[dict]:
        if validate_only:
            return [self._create_topic(request, True) for request in topics]
        results: list[dict] = []
        try:
            with self._change():
                for request in topics:
                    results.append(self._create_topic(request, False))
                if any(result["error_code"] == 0 for result in results):
                    self.commit()
        except MetadataPersistError as exc:
            for result in results:
                if result["error_code"] == 0:
                    result.update(error_code=int(exc.code), error_message=exc.message)
        return results

    def _create_topic(self, request: dict, validate_only: bool) -> dict:
        name = request["name"]
        num_partitions = request["num_partitions"]
        if num_partitions == -1:
            num_partitions = self.config["num.partitions"]
        rf = request["replication_factor"]
        if rf == -1:
            rf = self.config["default.replication.factor"]
        result = {
            "name": name,
            "error_code": 0,
            "error_message": None,
            "num_partitions": num_partitions,
            "replication_factor": rf,
        }

        def fail(code: ErrorCode, message: str) -> dict:
            result.update(error_code=int(code), error_message=message)
            return result

        if (problem := topic_name_error(name)) is not None:
            return fail(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        if name in self.metadata.topics:
            return fail(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic '{name}' already exists")
        if num_partitions < 1:
            return fail(
                ErrorCode.INVALID_PARTITIONS, f"num_partitions must be >= 1, got {num_partitions}"
            )
        brokers = sorted(b for b in self.metadata.brokers if b in self.metadata.live)
        if rf < 1 or rf > len(brokers):
            return fail(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor {rf} must be between 1 and the {len(brokers)} live broker(s)",
            )
        if (problem := topic_configs_error(request["configs"])) is not None:
            return fail(ErrorCode.INVALID_CONFIG, problem)
        hosted = (p.replicas for t in self.metadata.topics.values() for p in t.partitions)
        if (problem := partition_cap_error(hosted, brokers, num_partitions, rf)) is not None:
            return fail(ErrorCode.POLICY_VIOLATION, problem)
        if validate_only:
            return result
        # Kafka's spread (broker/placement.py): partition 0 is not always on one broker.
        partitions = [
            PartitionState(
                leader=replicas[0], leader_epoch=0, replicas=replicas, isr=list(replicas)
            )
            for replicas in assign_replicas(brokers, num_partitions, rf)
        ]
        self.metadata.topics[name] = TopicState(name, partitions, dict(request["configs"]))
        self.log.info("topic_created", topic=name, partitions=num_partitions, replication_factor=rf)
        return result

    # --- ISR changes proposed by leaders -------------------------------------------------------

    def alter_partition(self, request: dict) -> dict:
        """Apply a leader's ISR proposal if it is based on the current state (Kafka's AlterPartition)."""
        topic = self.metadata.topics.get(request["topic"])
        index = request["partition"]
        if topic is None or index >= len(topic.partitions):
            return {"error_code": int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), "error_message": None}
        state = topic.partitions[index]
        if request["broker_id"] != state.leader or request["leader_epoch"] != state.leader_epoch:
            return {
                "error_code": int(ErrorCode.FENCED_LEADER_EPOCH),
                "error_message": f"leader is {state.leader} at epoch {state.leader_epoch}",
            }
        if request["partition_epoch"] != state.partition_epoch:
            # A stale proposal: answer with the current state so the leader can catch up.
            return {
                "error_code": int(ErrorCode.INVALID_REQUEST),
                "isr": state.isr,
                "partition_epoch": state.partition_epoch,
                "error_message": f"partition epoch {request['partition_epoch']} != {state.partition_epoch}",
            }
        new_isr = [r for r in request["new_isr"] if r in state.replicas]
        if state.leader not in new_isr or len(set(new_isr)) != len(new_isr):
            return {
                "error_code": int(ErrorCode.INVALID_REQUEST),
                "error_message": f"bad ISR {request['new_isr']}",
            }
        if sorted(new_isr) != sorted(state.isr):
            try:
                with self._change() as md:
                    state = md.topics[topic.name].partitions[index]
                    self.log.info(
                        "isr_changed",
                        topic=topic.name,
                        partition=index,
                        old_isr=state.isr,
                        new_isr=new_isr,
                    )
                    state.isr = new_isr
                    state.partition_epoch += 1
                    self.commit()
            except MetadataPersistError as exc:
                return {"error_code": int(exc.code), "error_message": exc.message}
        return {
            "error_code": 0,
            "error_message": None,
            "isr": state.isr,
            "partition_epoch": state.partition_epoch,
        }
