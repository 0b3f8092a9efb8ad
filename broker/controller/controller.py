"""The controller role: owns cluster metadata, assigns replicas, elects leaders.

Runs on the active controller only: the voter that leads the metadata quorum with its
epoch committed (broker/server.py builds it from the committed MetadataImage then, and
drops it when leadership is lost). Every change is made on a draft; the records that
turn the old state into it (metadata_records.records_for_change) are appended to the
quorum, and the request that caused it is answered once they commit, so an answer never
names a state a new controller could forget.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.common.topic_config import topic_configs_error
from minibroker.broker.controller.client_quotas import apply_entries
from minibroker.broker.controller.partitions import AssignmentRefused, assigned_partitions
from minibroker.broker.controller.placement import assign_replicas
from minibroker.broker.metadata.check import topic_name_error
from minibroker.broker.metadata.image import BrokerInfo, ClusterMetadata, PartitionState, TopicState
from minibroker.broker.metadata.records import encode_change, records_for_change
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.storage.limits import partition_cap_error, replica_counts
from minibroker.protocol.errors import ErrorCode

# The pre-quorum controller's store: read once, to import it into an empty quorum.
METADATA_FILE = "cluster-metadata.json"
# Producer ids per AllocateProducerIds answer (Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE).
PRODUCER_ID_BLOCK = 1000

__all__ = ["METADATA_FILE", "Controller", "topic_name_error"]


class Controller:
    def __init__(
        self,
        broker_id: int,
        config: BrokerConfig,
        logger: Any,
        metadata: ClusterMetadata,
        submit: Callable[[list[bytes], Any, Any], PendingResponse],
    ) -> None:
        self.broker_id = broker_id
        self.config = config
        self.log = logger
        # ``submit(entries, answer, lost)`` appends to the metadata quorum; ``answer`` goes
        # out once they commit, ``lost`` (None: NOT_CONTROLLER) if this voter loses
        # leadership first.
        self.submit = submit
        # Built from the committed MetadataImage when this voter became active; from then
        # on it runs ahead of the image by the records appended but not yet committed.
        self.metadata = metadata
        self.metadata.controller_id = broker_id
        self._changed = False
        self._pending: list[dict] = []

    @contextmanager
    def _change(self) -> Iterator[ClusterMetadata]:
        """Make a change on a draft; the records that turn the old state into it are queued
        for the quorum (``_reply`` appends them with the answer).

        Inside the block ``self.metadata`` is the draft (helpers read it there) and
        ``self.commit()`` marks it changed. If the block fails, the old object, never
        touched, stays the metadata and nothing is appended.
        """
        committed = self.metadata
        draft = committed.copy()
        self.metadata = draft
        self._changed = False
        try:
            yield draft
        except BaseException:
            self.metadata = committed
            raise
        if self._changed:
            draft.epoch += 1
            self._pending += records_for_change(committed, draft)
        else:
            self.metadata = committed

    def _reply(self, answer: Any, lost: Any = None) -> Any:
        """``answer`` now if nothing changed, else once the queued records commit.

        All the records behind one answer go to the quorum as one log entry (records.py):
        every broker applies them together or not at all, so a create is never half done.
        """
        records, self._pending = self._pending, []
        if not records:
            return answer
        return self.submit([encode_change(records)], answer, lost)

    def commit(self) -> None:
        """Mark the draft of the current ``_change`` as changed: its records will be appended."""
        self._changed = True

    def import_legacy(self, legacy: ClusterMetadata) -> dict | PendingResponse:
        """Take the topics and brokers of a pre-quorum ``cluster-metadata.json`` into the
        metadata log, keeping their leader and partition epochs, so an upgraded cluster
        keeps its topics. Topics the log already has are left as they are."""
        with self._change() as md:
            for name, topic in legacy.topics.items():
                if name not in md.topics:
                    md.topics[name] = topic
                    self.commit()
            for node_id, info in legacy.brokers.items():
                if node_id not in md.brokers:
                    md.brokers[node_id] = info
                    self.commit()
            md.epoch = max(md.epoch, legacy.epoch)  # metadata epochs never go back
        return self._reply({"error_code": 0})

    def register_broker(self, info: BrokerInfo, answer: dict) -> dict | PendingResponse:
        md = self.metadata
        if md.brokers.get(info.node_id) != info or info.node_id not in md.live:
            with self._change():
                self._register(info)
        return self._reply(answer)

    def _register(self, info: BrokerInfo) -> None:
        md = self.metadata
        if md.brokers.get(info.node_id) != info:
            md.brokers[info.node_id] = info
            self.log.info("broker_registered", node_id=info.node_id, host=info.host, port=info.port)
            self.commit()
        if self._unfence(info.node_id):
            self.commit()

    # --- liveness and leader election ---------------------------------------------------------

    def broker_alive(self, broker_id: int, answer: dict) -> dict | PendingResponse:
        """A heartbeat: a fenced broker that heartbeats again is live again."""
        md = self.metadata
        if broker_id in md.brokers and broker_id not in md.live:
            with self._change():
                self._unfence(broker_id)
                self.commit()
        return self._reply(answer)

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

    def fence(self, broker_id: int, reason: str, answer: dict | None = None) -> Any:
        """Take a dead (or cleanly stopping) broker out: move its leaderships, shrink ISRs."""
        if broker_id in self.metadata.live and broker_id != self.broker_id:
            with self._change() as md:
                self._fence(md, broker_id, reason)
        return self._reply(answer if answer is not None else {"error_code": 0})

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

    def create_topics(
        self, topics: list[dict], validate_only: bool = False
    ) -> dict | PendingResponse:
        """``{"topics": results}``, sent once the new topics' records commit.

        All the topics of one request are one change (one log entry): created together on
        every broker or not at all. If this voter loses the controller role before the
        change commits, every topic answers REQUEST_TIMED_OUT (the change may still commit
        under the next controller), never NOT_CONTROLLER: that would tell the forwarding
        broker to send the request again, to a controller that may already have it.
        """
        requested = [self._resolved(request) for request in topics]
        limit = self.config["controller.max.partitions.per.request"]
        total = sum(
            len(r["assignments"]) if r["assignments"] is not None else max(0, r["num_partitions"])
            for r in requested
        )
        if total > limit:
            message = (
                f"the request adds {total} partitions, over "
                f"controller.max.partitions.per.request={limit}: split it into smaller requests"
            )
            return {"topics": [_failed(r, ErrorCode.POLICY_VIOLATION, message) for r in requested]}
        md = self.metadata
        live = sorted(b for b in md.brokers if b in md.live)
        counts = replica_counts(
            (p.replicas for t in md.topics.values() for p in t.partitions), live
        )
        if validate_only:
            return {"topics": [self._create_topic(r, live, counts, True) for r in requested]}
        results: list[dict] = []
        with self._change():
            for request in requested:
                results.append(self._create_topic(request, live, counts, False))
            if any(result["error_code"] == 0 for result in results):
                self.commit()
        lost = {
            "topics": [
                _failed(
                    r,
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"broker {self.broker_id} lost the controller role before the change "
                    "committed; it may still commit: describe the topic before retrying",
                )
                for r in requested
            ]
        }
        return self._reply({"topics": results}, lost)

    def _resolved(self, request: dict) -> dict:
        """The request's answer skeleton, with the broker defaults for -1 counts."""
        num_partitions = request["num_partitions"]
        rf = request["replication_factor"]
        assignments = request.get("assignments")
        if assignments is not None:  # the counts come from the assignments (-1 given)
            return {
                "name": request["name"],
                "error_code": 0,
                "error_message": None,
                "num_partitions": num_partitions,
                "replication_factor": rf,
                "configs": request["configs"],
                "assignments": assignments,
            }
        return {
            "name": request["name"],
            "error_code": 0,
            "error_message": None,
            "num_partitions": self.config["num.partitions"]
            if num_partitions == -1
            else num_partitions,
            "replication_factor": self.config["default.replication.factor"] if rf == -1 else rf,
            "configs": request["configs"],
            "assignments": request.get("assignments"),
        }

    def _create_topic(
        self, request: dict, brokers: list[int], counts: dict[int, int], validate_only: bool
    ) -> dict:
        """Validate and place one topic on the draft; ``counts`` (replicas per live broker)
        is updated with its replicas, so the next topic of the request sees them."""
        name = request["name"]
        num_partitions = request["num_partitions"]
        rf = request["replication_factor"]
        result = {k: v for k, v in request.items() if k not in _REQUEST_ONLY}
        if request["assignments"] is not None:
            return self._create_assigned(request, result, counts, validate_only)
        if (problem := topic_name_error(name)) is not None:
            return _failed(result, ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        if name in self.metadata.topics:
            return _failed(result, ErrorCode.TOPIC_ALREADY_EXISTS, f"topic '{name}' already exists")
        if num_partitions < 1:
            return _failed(
                result,
                ErrorCode.INVALID_PARTITIONS,
                f"num_partitions must be >= 1, got {num_partitions}",
            )
        if rf < 1 or rf > len(brokers):
            return _failed(
                result,
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor {rf} must be between 1 and the {len(brokers)} live broker(s)",
            )
        if (problem := topic_configs_error(request["configs"])) is not None:
            return _failed(result, ErrorCode.INVALID_CONFIG, problem)
        if (problem := partition_cap_error(counts, num_partitions, rf)) is not None:
            return _failed(result, ErrorCode.POLICY_VIOLATION, problem)
        # Kafka's spread (broker/controller/placement.py): partition 0 is not always on one broker.
        assignment = assign_replicas(brokers, num_partitions, rf)
        for replicas in assignment:
            for broker in replicas:
                counts[broker] += 1
        if validate_only:
            return result
        partitions = [
            PartitionState(
                leader=replicas[0], leader_epoch=0, replicas=replicas, isr=list(replicas)
            )
            for replicas in assignment
        ]
        self._add_topic(
            result,
            partitions,
            request["configs"],
            partitions=num_partitions,
            replication_factor=rf,
        )
        return result

    def _create_assigned(
        self, request: dict, result: dict, counts: dict[int, int], validate_only: bool
    ) -> dict:
        """A topic created with manual replica assignments (Kafka's CreatableReplicaAssignment:
        one replica list per partition, counts left at -1), checked as CreatePartitions'."""
        name, assignments = request["name"], request["assignments"]
        if request["num_partitions"] != -1 or request["replication_factor"] != -1:
            return _failed(
                result,
                ErrorCode.INVALID_REQUEST,
                "Both numPartitions or replicationFactor and replicasAssignments were set. "
                "Both cannot be used at the same time.",
            )
        if (problem := topic_name_error(name)) is not None:
            return _failed(result, ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        if name in self.metadata.topics:
            return _failed(result, ErrorCode.TOPIC_ALREADY_EXISTS, f"topic '{name}' already exists")
        if (problem := topic_configs_error(request["configs"])) is not None:
            return _failed(result, ErrorCode.INVALID_CONFIG, problem)
        try:
            partitions = assigned_partitions(self.metadata, assignments)
        except AssignmentRefused as refused:
            return _failed(result, refused.code, refused.message)
        rf = len(assignments[0])
        result.update(num_partitions=len(assignments), replication_factor=rf)
        if (problem := partition_cap_error(counts, len(assignments), rf)) is not None:
            return _failed(result, ErrorCode.POLICY_VIOLATION, problem)
        for replicas in assignments:
            for broker in replicas:
                if broker in counts:
                    counts[broker] += 1
        if validate_only:
            return result
        self._add_topic(result, partitions, request["configs"], assignments=assignments)
        return result

    def _add_topic(
        self, result: dict, states: list[PartitionState], configs: dict[str, str], **logged: Any
    ) -> None:
        """Put the new topic on the draft under a fresh topic id, which its answer carries."""
        topic_id = result["topic_id"] = uuid.uuid4().hex
        name = result["name"]
        self.metadata.topics[name] = TopicState(name, states, dict(configs), topic_id)
        self.log.info("topic_created", topic=name, topic_id=topic_id, **logged)

    def delete_topics(self, names: list[str]) -> dict | PendingResponse:
        """``{"responses": results}``, sent once the RemoveTopic records commit (Kafka's
        DeleteTopics): every broker then drops its replicas of the topics and their files."""
        results: list[dict] = []
        with self._change() as md:
            for name in names:
                code, message = ErrorCode.NONE, None
                if name not in md.topics:
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    message = f"topic '{name}' does not exist"
                elif not self.config["delete.topic.enable"]:
                    code = ErrorCode.TOPIC_DELETION_DISABLED
                    message = "topic deletion is disabled (delete.topic.enable=false)"
                else:
                    topic = md.topics.pop(name)
                    self.log.info("topic_deleted", topic=name, topic_id=topic.topic_id)
                    self.commit()
                results.append({"name": name, "error_code": int(code), "error_message": message})
        return self._reply({"responses": results})

    def alter_client_quotas(self, entries: list[dict], validate_only: bool) -> Any:
        """``{"entries": results}``, sent once the ClientQuotaRecords commit."""
        with self._change() as md:
            results, changed = apply_entries(md.client_quotas, entries, validate_only)
            if changed:
                self.commit()
        return self._reply({"entries": results})

    # --- producer ids -------------------------------------------------------------------------

    def allocate_producer_ids(self, broker_id: int) -> dict | PendingResponse:
        """A block of PRODUCER_ID_BLOCK ids for ``broker_id``, answered once its record
        commits: a new controller continues after it, so no id is handed out twice."""
        with self._change() as md:
            start = md.next_producer_id
            md.next_producer_id = start + PRODUCER_ID_BLOCK
            self.commit()
        self.log.info("producer_ids_allocated", broker_id=broker_id, start=start)
        return self._reply(
            {
                "error_code": 0,
                "error_message": None,
                "producer_id_start": start,
                "producer_id_len": PRODUCER_ID_BLOCK,
            }
        )

    # --- ISR changes proposed by leaders -------------------------------------------------------

    def alter_partition(self, request: dict) -> dict | PendingResponse:
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
        return self._reply(
            {
                "error_code": 0,
                "error_message": None,
                "isr": state.isr,
                "partition_epoch": state.partition_epoch,
            }
        )


# What a topic's request carries that its answer never echoes.
_REQUEST_ONLY = frozenset({"configs", "assignments"})


def _failed(result: dict, code: ErrorCode, message: str) -> dict:
    """``result`` (a topic's answer) with an error; configs are never echoed."""
    out = {k: v for k, v in result.items() if k not in _REQUEST_ONLY}
    out.update(error_code=int(code), error_message=message)
    return out
