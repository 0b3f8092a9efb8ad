"""Request dispatch: one method per API, each returning a body, a PendingResponse, or None.

Handlers run on the trio thread and never block: a request that must wait (acks=all,
long-poll fetch) parks in a purgatory and the connection keeps serving others.

Like Kafka's KafkaApis, the handler is built with its collaborators (replica manager,
controller role and link, quorum, authenticator, producer ids, faults, the metadata
cache and the catch-up gate), never with the broker: it sits below server.py.

Trust: the cluster's internal APIs (registration, heartbeats, ISR changes, metadata
pushes, follower fetches, a replica's offset lookups) steer leaders, ISRs and high
watermarks or show records not yet committed, so they are answered
only on a connection whose peer authenticated as a cluster member (SASL_HANDSHAKE +
SASL_AUTHENTICATE, broker/network/cluster_auth.py), and only about itself: the broker id in the
body must be the authenticated one, and metadata is taken from the controller alone.
Everyone else gets CLUSTER_AUTHORIZATION_FAILED and nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from typing import Any

from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.controller.active import ControllerRole
from minibroker.broker.controller.election_api import handle_elect_leaders
from minibroker.broker.controller.membership import ControllerLink
from minibroker.broker.controller.producer_ids import ProducerIdManager
from minibroker.broker.coordinator import CoordinatorService
from minibroker.broker.metadata.cache import MetadataCache
from minibroker.broker.metadata.check import topic_name_error
from minibroker.broker.metadata.config_view import describe_configs
from minibroker.broker.network.cluster_auth import Authenticator
from minibroker.broker.network.deferral import RequestDeferral
from minibroker.broker.network.faults import FaultError, FaultInjector
from minibroker.broker.network.pending import PendingResponse, then
from minibroker.broker.network.session import ConnectionSession
from minibroker.broker.quota import ClientQuotas
from minibroker.broker.quota.topic_mutations import MUTATING_APIS, count_native
from minibroker.broker.raft.driver import QuorumDriver
from minibroker.broker.raft.wire import QUORUM_APIS, SENDER_FIELDS
from minibroker.broker.replication.fetch_request import FetchRequest
from minibroker.broker.replication.log_dirs import describe_log_dirs, describe_producers
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.broker.transaction import TransactionService
from minibroker.protocol import (
    ADMIN_CLIENT_ID,
    INTERNAL_TOPICS,
    ApiKey,
    RequestHeader,
    api_name,
    supported_versions,
)
from minibroker.protocol.api import NEWEST_VERSIONS, SCHEMAS
from minibroker.protocol.errors import ErrorCode
from minibroker.protocol.schema import narrow

Handler = Callable[[RequestHeader, dict, ConnectionSession], "dict | PendingResponse | None"]

# Answered from cluster metadata: held until this broker has caught up with the quorum
# after its start (Kafka opens its client listeners only then), so a restarted broker
# never says "no such topic" about a topic it has simply not read back yet. Quorum,
# membership and SASL APIs are not held: catching up needs them.
WAIT_FOR_METADATA = frozenset(
    {
        ApiKey.METADATA,
        ApiKey.CREATE_TOPICS,
        ApiKey.DELETE_TOPICS,
        ApiKey.CREATE_PARTITIONS,
        ApiKey.INCREMENTAL_ALTER_CONFIGS,
        ApiKey.DESCRIBE_CONFIGS,
        ApiKey.DELETE_RECORDS,
        ApiKey.DESCRIBE_LOG_DIRS,
        ApiKey.DESCRIBE_PRODUCERS,
        ApiKey.PRODUCE,
        ApiKey.FETCH,
        ApiKey.LIST_OFFSETS,
        ApiKey.OFFSET_FOR_LEADER_EPOCH,
        ApiKey.FIND_COORDINATOR,
        ApiKey.WRITE_TXN_MARKERS,
        ApiKey.INIT_PRODUCER_ID,
        ApiKey.ADD_PARTITIONS_TO_TXN,
        ApiKey.ADD_OFFSETS_TO_TXN,
        ApiKey.END_TXN,
        ApiKey.TXN_OFFSET_COMMIT,
    }
)


def answer_in_asked_version(api_key: int, handler: Handler) -> Handler:
    """``handler`` answers in its API's newest version; a request in an older one gets the
    answer narrowed to that version's response schema (static membership's v1 group APIs:
    a v0 client, whose schemas reject unknown keys, must not see group_instance_id)."""
    versions, newest = SCHEMAS[api_key], NEWEST_VERSIONS[api_key]
    if newest == 0:
        return handler

    def answer(header: RequestHeader, body: dict, session: ConnectionSession) -> Any:
        result = handler(header, body, session)
        if header.api_version == newest:
            return result
        schema = versions[header.api_version][1]
        return then(result, lambda answer: narrow(schema, answer))

    return answer


@cache
def carries_throttle(api_key: int, api_version: int) -> bool:
    """Whether the native answer in this version has a ``throttle_time_ms`` field (a
    client's schema rejects one it does not know)."""
    schema = SCHEMAS.get(api_key, {}).get(api_version, (None, None))[1]
    known = {*getattr(schema, "fields", ()), *getattr(schema, "optional", ())}
    return "throttle_time_ms" in known


def _unanswered(header: RequestHeader, body: Any) -> bool:
    """A produce with acks=0 gets no answer: nothing to hold back."""
    return header.api_key == ApiKey.PRODUCE and body["acks"] == 0


def _auto_creatable(name: str) -> bool:
    """auto.create.topics.enable creates only what may exist and is nobody's own: not an
    illegal name, nor an internal topic (created by its owner with its own settings: the
    coordinator's offsets.topic.*, the health check's replication)."""
    return name not in INTERNAL_TOPICS and topic_name_error(name) is None


class RequestHandler:
    """Kafka's KafkaApis: built with what answering needs, never with the broker itself."""

    def __init__(
        self,
        broker_id: int,
        config: BrokerConfig,
        logger: Any,
        *,
        cache: MetadataCache,
        replica_manager: ReplicaManager,
        role: ControllerRole,
        link: ControllerLink,
        quorum: QuorumDriver,
        authenticator: Authenticator,
        producer_ids: ProducerIdManager,
        faults: FaultInjector,
        deferral: RequestDeferral,
        stats: Callable[[], dict],
        coordinator: CoordinatorService | None = None,
        transactions: TransactionService | None = None,
        quotas: ClientQuotas | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.config = config
        self.log = logger
        self.cache = cache
        self.replica_manager = replica_manager
        self.role = role
        self.link = link
        self.quorum_driver = quorum
        self.authenticator = authenticator
        self.producer_ids = producer_ids
        self.fault_injector = faults
        self.deferral = deferral
        self.stats = stats
        self.coordinator = coordinator
        self.transactions = transactions
        self.quotas = quotas
        # The same for every request: one object, so the network layer packs it once.
        self._api_versions = {"error_code": 0, "api_versions": supported_versions()}
        self.handlers = self._handlers()

    def _handlers(self) -> dict[int, Handler]:
        handlers: dict[int, Handler] = {
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.METADATA: self.metadata,
            ApiKey.CREATE_TOPICS: self.create_topics,
            ApiKey.ELECT_LEADERS: self.elect_leaders,
            ApiKey.DELETE_TOPICS: self.delete_topics,
            ApiKey.PRODUCE: self.produce,
            ApiKey.FETCH: self.fetch,
            ApiKey.WRITE_TXN_MARKERS: self.write_txn_markers,
            ApiKey.LIST_OFFSETS: self.list_offsets,
            ApiKey.BROKER_STATS: self.broker_stats,
            ApiKey.ALTER_CLIENT_QUOTAS: self.alter_client_quotas,
            ApiKey.DESCRIBE_CLIENT_QUOTAS: self.describe_client_quotas,
            ApiKey.BROKER_REGISTRATION: self.controller_only(self.role.register_broker),
            ApiKey.BROKER_HEARTBEAT: self.controller_only(self.role.heartbeat),
            ApiKey.ALTER_PARTITION: self.controller_only(self.role.alter_partition),
            ApiKey.ALLOCATE_PRODUCER_IDS: self.controller_only(self.role.allocate_producer_ids),
            ApiKey.INIT_PRODUCER_ID: self.init_producer_id,
            ApiKey.UPDATE_METADATA: self.update_metadata,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
            ApiKey.FAULTS: self.faults,
            ApiKey.SASL_HANDSHAKE: self.sasl_handshake,
            ApiKey.SASL_AUTHENTICATE: self.sasl_authenticate,
        }
        handlers.update(self._admin_handlers())
        for key in QUORUM_APIS:
            handlers[key] = self.quorum
        if self.coordinator is not None:
            handlers.update(self._group_handlers(self.coordinator))
        if self.coordinator is not None and self.transactions is not None:
            handlers.update(self._txn_handlers(self.coordinator, self.transactions))
        return handlers

    def _txn_handlers(
        self, groups: CoordinatorService, txns: TransactionService
    ) -> dict[int, Handler]:
        """The transaction APIs (broker/transaction); TxnOffsetCommit is the group
        coordinator's; FindCoordinator picks the coordinator by key_type (Kafka's 0/1)."""

        def body_only(method: Callable[[dict], Any]) -> Handler:
            return lambda header, body, session: method(body)

        def find(header: RequestHeader, body: dict, session: ConnectionSession) -> Any:
            if body.get("key_type", 0) == 1:
                return txns.find_coordinator(body)
            return groups.find_coordinator(body)

        return {
            ApiKey.FIND_COORDINATOR: find,
            ApiKey.ADD_PARTITIONS_TO_TXN: body_only(txns.add_partitions_to_txn),
            ApiKey.ADD_OFFSETS_TO_TXN: body_only(txns.add_offsets_to_txn),
            ApiKey.END_TXN: body_only(txns.end_txn),
            ApiKey.TXN_OFFSET_COMMIT: body_only(groups.txn_commit_offsets),
            ApiKey.LIST_TRANSACTIONS: body_only(txns.list_transactions),
            ApiKey.DESCRIBE_TRANSACTIONS: body_only(txns.describe_transactions),
        }

    def _admin_handlers(self) -> dict[int, Handler]:
        """Issue 38's admin APIs, each answered by its own subsystem: controller changes go
        through the link as CreateTopics does (an authenticated peer's request was forwarded
        to us: answered here or refused), the rest from this broker's replicas and metadata."""
        link, rm = self.link, self.replica_manager
        return {
            ApiKey.CREATE_PARTITIONS: lambda h, b, s: link.create_partitions(
                b["topics"], b["validate_only"], forwarded=s.principal is not None
            ),
            ApiKey.INCREMENTAL_ALTER_CONFIGS: lambda h, b, s: link.alter_configs(
                b, forwarded=s.principal is not None
            ),
            ApiKey.DESCRIBE_CONFIGS: lambda h, b, s: describe_configs(
                b, self.cache.metadata, self.config, self.broker_id
            ),
            ApiKey.DELETE_RECORDS: lambda h, b, s: rm.delete_records(b, s),
            ApiKey.DESCRIBE_LOG_DIRS: lambda h, b, s: describe_log_dirs(rm, b),
            ApiKey.DESCRIBE_PRODUCERS: lambda h, b, s: describe_producers(rm, b),
        }

    @staticmethod
    def _group_handlers(coordinator: CoordinatorService) -> dict[int, Handler]:
        """The consumer-group APIs, answered by broker/coordinator (client_id and the peer's
        address are what DescribeGroups shows of each member)."""

        def body_only(method: Callable[[dict], Any]) -> Handler:
            return lambda header, body, session: method(body)

        def join(header: RequestHeader, body: dict, session: ConnectionSession) -> Any:
            host = session.peer.rpartition(":")[0] or session.peer
            return coordinator.join_group(body, header.client_id or "", host)

        handlers = {
            ApiKey.FIND_COORDINATOR: body_only(coordinator.find_coordinator),
            ApiKey.JOIN_GROUP: join,
            ApiKey.SYNC_GROUP: body_only(coordinator.sync_group),
            ApiKey.HEARTBEAT: body_only(coordinator.heartbeat),
            ApiKey.LEAVE_GROUP: body_only(coordinator.leave_group),
            ApiKey.OFFSET_COMMIT: body_only(coordinator.commit_offsets),
            ApiKey.OFFSET_FETCH: body_only(coordinator.fetch_offsets),
            ApiKey.LIST_GROUPS: body_only(coordinator.list_groups),
            ApiKey.DESCRIBE_GROUPS: body_only(coordinator.describe_groups),
            ApiKey.DELETE_GROUPS: body_only(coordinator.delete_groups),
            ApiKey.OFFSET_DELETE: body_only(coordinator.delete_offsets),
        }
        return {key: answer_in_asked_version(key, handler) for key, handler in handlers.items()}

    def refuse_unless_member(
        self, session: ConnectionSession, api_key: int, claimed: int | None = None
    ) -> dict | None:
        """None if the peer is an authenticated member speaking for itself (``claimed``)."""
        principal = session.principal
        if principal is None:
            return self.refuse(session, api_key, "is for authenticated cluster members only")
        if claimed is not None and claimed != principal:
            return self.refuse(
                session, api_key, f"from broker {principal} may not speak for broker {claimed}"
            )
        return None

    def refuse(self, session: ConnectionSession, api_key: int, why: str) -> dict:
        principal = session.principal
        self.log.info(
            "cluster_authorization_failed",
            peer=session.peer,
            api=api_name(api_key),
            principal=principal,
            reason=why,
        )
        return {
            "error_code": int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
            "error_message": f"{api_name(api_key)} {why}",
        }

    def controller_only(self, method: Callable[[dict], dict]) -> Handler:
        """Internal APIs the controller answers, for the broker named in the body only."""

        def handler(header: RequestHeader, body: dict, session: ConnectionSession) -> dict:
            refusal = self.refuse_unless_member(session, header.api_key, body["broker_id"])
            if refusal is not None:
                return refusal
            if not self.role.active:
                return {
                    "error_code": int(ErrorCode.NOT_CONTROLLER),
                    "error_message": f"broker {self.broker_id} is not the controller",
                }
            return method(body)

        return handler

    def prepare(self, header: RequestHeader, body: dict) -> dict | FetchRequest:
        """A validated body as its handler takes it: a Fetch becomes the FetchRequest the
        read path works on, every other body stays itself; InvalidRequest if it cannot.

        The network layer keeps prepared Fetches by their bytes (SocketServer._one), so
        identical long polls from thousands of consumers are decoded and prepared once.
        """
        if header.api_key == ApiKey.FETCH:
            return self.replica_manager.fetch_request(body, header.api_version)
        return body

    def handle(
        self, header: RequestHeader, body: Any, session: ConnectionSession
    ) -> dict | PendingResponse | None:
        """A native-listener request: :meth:`dispatch` under its client's quotas."""
        quotas = self.quotas
        if quotas is not None and quotas.request.enabled and session.principal is None:
            return quotas.timed(
                partial(self._from_client, header, body, session),
                session,
                header.client_id,
                carries_throttle(header.api_key, header.api_version),
            )
        return self._from_client(header, body, session)

    def _from_client(
        self, header: RequestHeader, body: Any, session: ConnectionSession
    ) -> dict | PendingResponse | None:
        """A client's topic changes count against its controller_mutation_rate (the Kafka
        listener counts its own, before they reach :meth:`dispatch`)."""
        quotas = self.quotas
        if (
            header.api_key in MUTATING_APIS
            and quotas is not None
            and quotas.mutation.enabled
            and session.principal is None
        ):
            return count_native(
                quotas,
                self.cache.metadata,
                self.config["num.partitions"],
                header,
                body,
                session,
                lambda admitted: self.dispatch(header, admitted, session),
            )
        return self.dispatch(header, body, session)

    def dispatch(
        self, header: RequestHeader, body: Any, session: ConnectionSession
    ) -> dict | PendingResponse | None:
        """The API's answer, without the request_percentage accounting ``handle`` adds (the
        Kafka listener accounts its whole request, of which this is a part, itself)."""
        faults = self.fault_injector
        if faults.faults and header.api_key != ApiKey.FAULTS:
            # isolate: a request from a cut-off peer is lost, as on a partitioned network
            # (its id: the authenticated principal, or the one a handshake claims).
            peer = (
                body["broker_id"] if header.api_key == ApiKey.SASL_HANDSHAKE else session.principal
            )
            if faults.drops(peer):
                return faults.hold(peer, session)
            code = faults.take_failure(header.api_key)
            if code:
                return {"error_code": code, "error_message": "injected by fault fail-api"}
            delay = faults.api_delay(header.api_key)
            if delay:
                return self.deferral.delayed(
                    delay, self.handlers[header.api_key](header, body, session)
                )
            delay = faults.api_delay(header.api_key, "delay-request")
            if delay and not _unanswered(header, body):
                return self.deferral.handled_after(
                    delay, lambda: self._dispatch(header, body, session)
                )
        return self._dispatch(header, body, session)

    def _dispatch(
        self, header: RequestHeader, body: Any, session: ConnectionSession
    ) -> dict | PendingResponse | None:
        handler = self.handlers[header.api_key]
        if (
            header.api_key in WAIT_FOR_METADATA
            and not self.cache.ready.is_set()
            and not _unanswered(header, body)  # no answer to hold
        ):
            return self.deferral.after_catch_up(lambda: handler(header, body, session))
        return handler(header, body, session)

    def quorum(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse:
        """Vote, BeginQuorumEpoch, EndQuorumEpoch, QuorumFetch, FetchSnapshot: voters only."""
        claimed = body[SENDER_FIELDS[header.api_key]]
        refusal = self.refuse_unless_member(session, header.api_key, claimed)
        if refusal is not None:
            return refusal
        quorum = self.quorum_driver
        if quorum.core is None or claimed not in quorum.voters:
            return self.refuse(
                session, header.api_key, f"from broker {claimed}, which is not a quorum voter"
            )
        return quorum.handle_request(header.api_key, body, claimed, session)

    def sasl_handshake(self, header: RequestHeader, body: dict, session: ConnectionSession) -> dict:
        return self.authenticator.handshake(session, body)

    def sasl_authenticate(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict:
        return self.authenticator.authenticate(session, body)

    def faults(self, header: RequestHeader, body: dict, session: ConnectionSession) -> dict:
        if not self.config["faults.enable"]:
            return {
                "error_code": int(ErrorCode.INVALID_REQUEST),
                "faults": [],
                "error_message": f"fault injection is off on broker {self.broker_id}: "
                "start it with faults.enable=true",
            }
        try:
            active = self.fault_injector.apply(body, self_id=self.broker_id)
        except FaultError as exc:
            return {
                "error_code": int(ErrorCode.INVALID_REQUEST),
                "faults": self.fault_injector.describe(),
                "error_message": str(exc),
            }
        self.log.warning("fault_injection", **body)
        return {"error_code": 0, "faults": active, "error_message": None}

    # --- APIs -----------------------------------------------------------------------------

    def api_versions(self, header: RequestHeader, body: dict, session: ConnectionSession) -> dict:
        return self._api_versions

    def metadata(self, header: RequestHeader, body: dict, session: ConnectionSession) -> dict:
        md = self.cache.metadata
        wanted = body["topics"]
        # Kafka's getTopicMetadata: auto-creation only when the broker allows it and the
        # request does too (AllowAutoTopicCreation: a consumer's metadata says no).
        if (
            wanted
            and self.config["auto.create.topics.enable"]
            and body.get("allow_auto_topic_creation", True)
        ):
            missing = [n for n in wanted if n not in md.topics and _auto_creatable(n)]
            if missing:
                self._auto_create(missing)
                md = self.cache.metadata
        names = list(md.topics) if wanted is None else wanted
        topics = []
        for name in names:
            topic = md.topics.get(name)
            illegal = topic_name_error(name) if topic is None else None
            if illegal is not None:
                # A name that can never exist (Kafka's Topic.validate): not retriable.
                topics.append(
                    {
                        "name": name,
                        "error_code": int(ErrorCode.INVALID_TOPIC_EXCEPTION),
                        "partitions": [],
                        "error_message": illegal,
                    }
                )
                continue
            if topic is None:
                topics.append(
                    {
                        "name": name,
                        "error_code": int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                        "partitions": [],
                        "error_message": f"topic '{name}' does not exist",
                    }
                )
                continue
            topics.append(
                {
                    "name": name,
                    "error_code": 0,
                    "partitions": [
                        {
                            "partition": i,
                            "error_code": 0
                            if p.leader >= 0
                            else int(ErrorCode.LEADER_NOT_AVAILABLE),
                            "leader": p.leader,
                            "leader_epoch": p.leader_epoch,
                            "replicas": p.replicas,
                            "isr": p.isr,
                            "offline_replicas": [r for r in p.replicas if r not in md.live],
                        }
                        for i, p in enumerate(topic.partitions)
                    ],
                }
            )
        brokers = [
            {"node_id": b.node_id, "host": b.host, "port": b.port} for b in md.brokers.values()
        ]
        return {"brokers": brokers, "controller_id": md.controller_id, "topics": topics}

    def create_topics(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse:
        # From another broker (an authenticated principal): forwarded to us as the controller.
        return self.link.create_topics(
            body["topics"], body["validate_only"], forwarded=session.principal is not None
        )

    def elect_leaders(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse:
        # As CreateTopics: a broker's (authenticated) request was forwarded to us.
        return handle_elect_leaders(self.link, body, forwarded=session.principal is not None)

    def _auto_create(self, names: list[str]) -> None:
        """auto.create.topics.enable: ask the controller for each with the broker defaults."""
        self.link.create_topics(
            [
                {"name": n, "num_partitions": -1, "replication_factor": -1, "configs": {}}
                for n in names
            ],
            False,
        )

    def delete_topics(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse:
        # As create_topics: a broker's forward (authenticated) is answered here or refused.
        return self.link.delete_topics(body["topic_names"], forwarded=session.principal is not None)

    def offset_for_leader_epoch(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict:
        refusal = self.refuse_replica_view(header, body["replica_id"], session)
        if refusal is not None:
            return refusal
        return self.replica_manager.offsets_for_leader_epoch(body)

    def refuse_replica_view(
        self, header: RequestHeader, replica_id: int, session: ConnectionSession
    ) -> dict | None:
        """A ``replica_id`` >= 0 sees a replica's view, up to the log end past the high
        watermark (records not yet committed, which a failover may take back): members
        only, speaking for themselves, as for a follower's fetch (Kafka's CLUSTER_ACTION)."""
        if replica_id < 0:
            return None
        return self.refuse_unless_member(session, header.api_key, replica_id)

    def update_metadata(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict:
        refusal = self.refuse_unless_member(session, header.api_key)
        if refusal is not None:
            return refusal
        # Every broker is a voter: its metadata is the quorum's committed log, never a
        # pushed snapshot (Kafka's KRaft brokers take no UpdateMetadata either).
        return self.refuse(
            session,
            header.api_key,
            f"from broker {session.principal}: broker {self.broker_id} takes metadata "
            "from the metadata quorum only",
        )

    def produce(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse | None:
        topics = self.cache.metadata.topics
        missing = [t["name"] for t in body["topics"] if t["name"] not in topics]
        if missing and self.config["auto.create.topics.enable"]:
            creatable = [name for name in missing if _auto_creatable(name)]
            if creatable:
                self._auto_create(creatable)
        if missing or self.deferral.holding(session):
            # Just created (by a client, or auto-created above), a topic may not be applied
            # here yet: wait for it briefly rather than have the client back off and retry.
            # The connection's later produces wait behind it, in order.
            return self.deferral.after_topics_known(
                session,
                lambda: all(name in self.cache.metadata.topics for name in missing),
                lambda: self._produce(header, body, session),
                answered=body["acks"] != 0,
            )
        return self._produce(header, body, session)

    def _produce(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse | None:
        # Kafka's rule: only the admin client id may write internal topics from outside.
        allowed = header.client_id == ADMIN_CLIENT_ID
        result = self.replica_manager.produce(body, session, internal_topics_allowed=allowed)
        quotas = self.quotas
        if quotas is not None and quotas.produce.enabled:
            return self._produce_throttled(header, body, session, result)
        return result

    def _produce_throttled(
        self, header: RequestHeader, body: dict, session: ConnectionSession, result: Any
    ) -> Any:
        """producer_byte_rate: the request's record bytes count against the producer's
        quota; its answer says for how long the connection is muted (Produce v1+)."""
        size = sum(len(p["records"]) for t in body["topics"] for p in t["partitions"])
        throttle = self.quotas.record(self.quotas.produce, session, header.client_id, size)
        if not throttle or result is None or header.api_version < 1:
            return result
        return then(result, lambda answer: {**answer, "throttle_time_ms": throttle})

    def fetch(
        self, header: RequestHeader, fetch: FetchRequest, session: ConnectionSession
    ) -> dict | PendingResponse:
        # A follower's fetch also moves its LEO, hence the HW and the ISR.
        refusal = self.refuse_replica_view(header, fetch.replica_id, session)
        if refusal is not None:
            return refusal
        result = self.replica_manager.fetch(fetch, session)
        quotas = self.quotas
        if quotas is not None and fetch.replica_id < 0 and quotas.fetch.enabled:
            client_id = header.client_id
            return then(result, lambda answer: self._fetch_throttled(answer, client_id, session))
        return result

    def _fetch_throttled(self, answer: dict, client_id: str | None, session: Any) -> dict:
        """consumer_byte_rate: the answer's record bytes count against the consumer's quota
        once they are known (Kafka records a fetch's response size)."""
        size = sum(len(p["records"]) for t in answer.get("topics", ()) for p in t["partitions"])
        throttle = self.quotas.record(self.quotas.fetch, session, client_id, size)
        # A copy: identical long polls share one answer body (ReplicaManager).
        return {**answer, "throttle_time_ms": throttle} if throttle else answer

    def write_txn_markers(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse:
        """Inter-broker: a transaction coordinator ends transactions on our partitions."""
        refusal = self.refuse_unless_member(session, header.api_key)
        if refusal is not None:
            return refusal
        return self.replica_manager.write_txn_markers(body, session)

    def init_producer_id(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse:
        # A transactional id is its transaction coordinator's (epochs, fencing); without
        # one, a fresh id at epoch 0 from the controller's blocks.
        if body["transactional_id"] is not None and self.transactions is not None:
            return self.transactions.init_producer_id(body)
        return self.producer_ids.init_producer_id(body)

    def list_offsets(self, header: RequestHeader, body: dict, session: ConnectionSession) -> dict:
        refusal = self.refuse_replica_view(header, body["replica_id"], session)
        if refusal is not None:
            return refusal
        return self.replica_manager.list_offsets(body)

    def alter_client_quotas(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse:
        # As CreateTopics: to the active controller, whose records every broker applies.
        return self.link.alter_client_quotas(body, forwarded=session.principal is not None)

    def describe_client_quotas(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict:
        if self.quotas is None:
            return {"error_code": 0, "entries": []}
        return self.quotas.describe(body)

    def broker_stats(self, header: RequestHeader, body: dict, session: ConnectionSession) -> dict:
        return {"error_code": 0, "broker_id": self.broker_id, "stats": self.stats()}
