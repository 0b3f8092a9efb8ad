"""Request dispatch: one method per API, each returning a body, a PendingResponse, or None.

Handlers run on the trio thread and never block: a request that must wait (acks=all,
long-poll fetch) parks in a purgatory and the connection keeps serving others.

Trust: the cluster's internal APIs (registration, heartbeats, ISR changes, metadata
pushes, follower fetches) steer leaders, ISRs and high watermarks, so they are answered
only on a connection whose peer authenticated as a cluster member (SASL_HANDSHAKE +
SASL_AUTHENTICATE, broker/network/cluster_auth.py), and only about itself: the broker id in the
body must be the authenticated one, and metadata is taken from the controller alone.
Everyone else gets CLUSTER_AUTHORIZATION_FAILED and nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from minibroker.broker.network.faults import FaultError
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.network.session import ConnectionSession
from minibroker.broker.raft.wire import QUORUM_APIS, SENDER_FIELDS
from minibroker.protocol import ApiKey, RequestHeader, api_name, supported_versions
from minibroker.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from minibroker.broker.server import Broker

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
        ApiKey.PRODUCE,
        ApiKey.FETCH,
        ApiKey.LIST_OFFSETS,
        ApiKey.OFFSET_FOR_LEADER_EPOCH,
    }
)


class RequestHandler:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        # The same for every request: one object, so the network layer packs it once.
        self._api_versions = {"error_code": 0, "api_versions": supported_versions()}
        self.handlers: dict[int, Handler] = {
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.METADATA: self.metadata,
            ApiKey.CREATE_TOPICS: self.create_topics,
            ApiKey.DELETE_TOPICS: self.delete_topics,
            ApiKey.PRODUCE: self.produce,
            ApiKey.FETCH: self.fetch,
            ApiKey.LIST_OFFSETS: self.list_offsets,
            ApiKey.BROKER_STATS: self.broker_stats,
            ApiKey.BROKER_REGISTRATION: self.controller_only(self.broker.role.register_broker),
            ApiKey.BROKER_HEARTBEAT: self.controller_only(self.broker.role.heartbeat),
            ApiKey.ALTER_PARTITION: self.controller_only(self.alter_partition),
            ApiKey.ALLOCATE_PRODUCER_IDS: self.controller_only(
                self.broker.role.allocate_producer_ids
            ),
            ApiKey.INIT_PRODUCER_ID: self.init_producer_id,
            ApiKey.UPDATE_METADATA: self.update_metadata,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
            ApiKey.FAULTS: self.faults,
            ApiKey.SASL_HANDSHAKE: self.sasl_handshake,
            ApiKey.SASL_AUTHENTICATE: self.sasl_authenticate,
        }
        for key in QUORUM_APIS:
            self.handlers[key] = self.quorum

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
        self.broker.log.info(
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
            if not self.broker.is_controller:
                return {
                    "error_code": int(ErrorCode.NOT_CONTROLLER),
                    "error_message": f"broker {self.broker.broker_id} is not the controller",
                }
            return method(body)

        return handler

    def handle(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse | None:
        faults = self.broker.faults
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
                return self.broker.delayed(
                    delay, self.handlers[header.api_key](header, body, session)
                )
        handler = self.handlers[header.api_key]
        if (
            header.api_key in WAIT_FOR_METADATA
            and not self.broker.metadata_ready.is_set()
            and not (header.api_key == ApiKey.PRODUCE and body["acks"] == 0)  # no answer to hold
        ):
            return self.broker.after_catch_up(lambda: handler(header, body, session))
        return handler(header, body, session)

    def quorum(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse:
        """Vote, BeginQuorumEpoch, EndQuorumEpoch, QuorumFetch, FetchSnapshot: voters only."""
        claimed = body[SENDER_FIELDS[header.api_key]]
        refusal = self.refuse_unless_member(session, header.api_key, claimed)
        if refusal is not None:
            return refusal
        quorum = self.broker.quorum
        if quorum is None or quorum.core is None or claimed not in quorum.voters:
            return self.refuse(
                session, header.api_key, f"from broker {claimed}, which is not a quorum voter"
            )
        return quorum.handle_request(header.api_key, body, claimed, session)

    def sasl_handshake(self, header: RequestHeader, body: dict, session: ConnectionSession) -> dict:
        return self.broker.authenticator.handshake(session, body)

    def sasl_authenticate(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict:
        return self.broker.authenticator.authenticate(session, body)

    def faults(self, header: RequestHeader, body: dict, session: ConnectionSession) -> dict:
        if not self.broker.config["faults.enable"]:
            return {
                "error_code": int(ErrorCode.INVALID_REQUEST),
                "faults": [],
                "error_message": f"fault injection is off on broker {self.broker.broker_id}: "
                "start it with faults.enable=true",
            }
        try:
            active = self.broker.faults.apply(body, self_id=self.broker.broker_id)
        except FaultError as exc:
            return {
                "error_code": int(ErrorCode.INVALID_REQUEST),
                "faults": self.broker.faults.describe(),
                "error_message": str(exc),
            }
        self.broker.log.warning("fault_injection", **body)
        return {"error_code": 0, "faults": active, "error_message": None}

    # --- APIs -----------------------------------------------------------------------------

    def api_versions(self, header: RequestHeader, body: dict, session: ConnectionSession) -> dict:
        return self._api_versions

    def metadata(self, header: RequestHeader, body: dict, session: ConnectionSession) -> dict:
        broker = self.broker
        md = broker.metadata
        wanted = body["topics"]
        if wanted and broker.config["auto.create.topics.enable"]:
            missing = [n for n in wanted if n not in md.topics]
            if missing:
                broker.auto_create(missing)
                md = broker.metadata
        names = list(md.topics) if wanted is None else wanted
        topics = []
        for name in names:
            topic = md.topics.get(name)
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
        return self.broker.link.create_topics(
            body["topics"], body["validate_only"], forwarded=session.principal is not None
        )

    def delete_topics(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse:
        # As create_topics: a broker's forward (authenticated) is answered here or refused.
        return self.broker.link.delete_topics(
            body["topic_names"], forwarded=session.principal is not None
        )

    def alter_partition(self, body: dict) -> dict:
        return self.broker.role.alter_partition(body)

    def offset_for_leader_epoch(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict:
        return self.broker.replica_manager.offsets_for_leader_epoch(body)

    def update_metadata(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict:
        broker = self.broker
        refusal = self.refuse_unless_member(session, header.api_key)
        if refusal is not None:
            return refusal
        # Every broker is a voter: its metadata is the quorum's committed log, never a
        # pushed snapshot (Kafka's KRaft brokers take no UpdateMetadata either).
        return self.refuse(
            session,
            header.api_key,
            f"from broker {session.principal}: broker {broker.broker_id} takes metadata "
            "from the metadata quorum only",
        )

    def produce(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse | None:
        broker = self.broker
        if broker.config["auto.create.topics.enable"]:
            missing = [t["name"] for t in body["topics"] if t["name"] not in broker.metadata.topics]
            if missing:
                broker.auto_create(missing)
        return broker.replica_manager.produce(body, session)

    def fetch(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse:
        if body["replica_id"] >= 0:
            # A follower's fetch moves its LEO, hence the HW and the ISR: members only.
            refusal = self.refuse_unless_member(session, header.api_key, body["replica_id"])
            if refusal is not None:
                return refusal
        return self.broker.replica_manager.fetch(body, session)

    def init_producer_id(
        self, header: RequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse:
        return self.broker.producer_ids.init_producer_id(body)

    def list_offsets(self, header: RequestHeader, body: dict, session: ConnectionSession) -> dict:
        return self.broker.replica_manager.list_offsets(body)

    def broker_stats(self, header: RequestHeader, body: dict, session: ConnectionSession) -> dict:
        return {"error_code": 0, "broker_id": self.broker.broker_id, "stats": self.broker.stats()}
