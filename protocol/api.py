"""The APIs: keys (Kafka's numbers where Kafka has the API), versions and body schemas.

Each (key, version) has a request schema and a response schema. Adding a field
means adding a version; a peer that asks for a version we do not have gets
UNSUPPORTED_VERSION, never a guess. A new version's field is optional with the
value that means "as before" as its default, so a body without it (what the older
version sends) means what it always did.
"""

from __future__ import annotations

from enum import IntEnum

from minibroker.protocol import admin_api, group_api, txn_api
from minibroker.protocol.schema import (
    BOOL,
    BYTES,
    FLOAT64,
    INT16,
    INT32,
    INT64,
    STRING,
    Validator,
    anything,
    array,
    binary,
    integer,
    mapping,
    nullable,
    string,
    struct,
)


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    LEADER_AND_ISR = 4
    UPDATE_METADATA = 6
    CONTROLLED_SHUTDOWN = 7
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    WRITE_TXN_MARKERS = 27
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    DELETE_GROUPS = 42
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_CONFIGS = 32
    CREATE_PARTITIONS = 37
    INCREMENTAL_ALTER_CONFIGS = 44
    DESCRIBE_LOG_DIRS = 35
    OFFSET_DELETE = 47
    SASL_AUTHENTICATE = 36
    ELECT_LEADERS = 43
    VOTE = 52
    BEGIN_QUORUM_EPOCH = 53
    END_QUORUM_EPOCH = 54
    ALTER_PARTITION = 56
    FETCH_SNAPSHOT = 59
    ALLOCATE_PRODUCER_IDS = 67
    BROKER_REGISTRATION = 62
    BROKER_HEARTBEAT = 63
    DESCRIBE_PRODUCERS = 61
    # minibroker's own APIs (no Kafka equivalent) live above 10000.
    BROKER_STATS = 10000
    FAULTS = 10001
    # The metadata quorum's log fetch: Kafka reuses Fetch (key 1) on the controller
    # listener; ours shares the listener with partition fetches, so it has its own key.
    QUORUM_FETCH = 10002


TOPIC_NAME = string(max_len=249)
NODE_ID = integer("int32", min=-1)
PARTITION = integer("int32", min=0)
OFFSET = INT64
ERROR = INT16
ERROR_MESSAGE = (nullable(STRING), None)

# --- shared pieces -------------------------------------------------------------------------

_ERROR_ONLY = struct({"error_code": ERROR}, {"error_message": ERROR_MESSAGE})


def _per_partition(partition_fields: dict, optional: dict | None = None) -> Validator:
    """topics: [{name, partitions: [{partition, ...}]}] — the shape of every partitioned API."""
    part = struct({"partition": PARTITION, **partition_fields}, optional)
    return array(struct({"name": TOPIC_NAME, "partitions": array(part)}))


# --- ApiVersions ---------------------------------------------------------------------------

API_VERSIONS_REQ = struct({})
API_VERSIONS_RESP = struct(
    {"error_code": ERROR, "api_versions": array(array(INT32, max_len=3))},
    {"error_message": ERROR_MESSAGE},
)

# --- Metadata ------------------------------------------------------------------------------

METADATA_REQ = struct({}, {"topics": (nullable(array(TOPIC_NAME)), None)})
# v1: Kafka's AllowAutoTopicCreation (Metadata v4+). False: a topic that does not exist is
# answered UNKNOWN_TOPIC_OR_PARTITION even with auto.create.topics.enable (a consumer's
# metadata must not create, or re-create a deleted, topic). Absent (v0): True, as before.
METADATA_REQ_V1 = struct(
    {},
    {
        "topics": (nullable(array(TOPIC_NAME)), None),
        "allow_auto_topic_creation": (BOOL, True),
    },
)
_PORT = integer("int32", min=0, max=65535)
# kafka_host/kafka_port: the broker's Kafka listener (0: none), registered and advertised.
_KAFKA_LISTENER = {"kafka_host": (STRING, ""), "kafka_port": (_PORT, 0)}
_BROKER = struct({"node_id": NODE_ID, "host": STRING, "port": _PORT}, _KAFKA_LISTENER)
_PARTITION_META = struct(
    {
        "partition": PARTITION,
        "error_code": ERROR,
        "leader": NODE_ID,
        "leader_epoch": INT32,
        "replicas": array(NODE_ID),
        "isr": array(NODE_ID),
    },
    {"offline_replicas": (array(NODE_ID), [])},
)
METADATA_RESP = struct(
    {
        "brokers": array(_BROKER),
        "controller_id": NODE_ID,
        "topics": array(
            struct(
                {"name": TOPIC_NAME, "error_code": ERROR, "partitions": array(_PARTITION_META)},
                {"error_message": ERROR_MESSAGE},
            )
        ),
    },
    {"error_code": (ERROR, 0), "error_message": ERROR_MESSAGE},
)

# --- CreateTopics --------------------------------------------------------------------------

CREATE_TOPICS_REQ = struct(
    {
        "topics": array(
            struct(
                {"name": TOPIC_NAME},
                {
                    "num_partitions": (integer("int32", min=-1), -1),
                    "replication_factor": (integer("int16", min=-1), -1),
                    "configs": (mapping(STRING, STRING), {}),
                    # Manual replica assignments, one list per partition (None: placed by
                    # the controller); the counts must then be -1, as in Kafka.
                    "assignments": (nullable(array(array(NODE_ID))), None),
                },
            )
        )
    },
    {"timeout_ms": (integer("int32", min=0), 30000), "validate_only": (BOOL, False)},
)
_CREATED = {"name": TOPIC_NAME, "error_code": ERROR}
_CREATED_OPTIONAL = {
    "error_message": ERROR_MESSAGE,
    "num_partitions": (INT32, -1),
    "replication_factor": (INT16, -1),
}
_TOP_ERROR = {"error_code": (ERROR, 0), "error_message": ERROR_MESSAGE}
# A quota throttle in the answer (KIP-219: the connection is muted for as long).
THROTTLE = {"throttle_time_ms": (INT32, 0)}
CREATE_TOPICS_RESP = struct({"topics": array(struct(_CREATED, _CREATED_OPTIONAL))}, _TOP_ERROR)
# v1: each created topic's id (as Metadata's topic_id; "" when none was created), and
# controller_mutation_rate refusing topics with THROTTLING_QUOTA_EXCEEDED (Kafka's v6-v7).
CREATE_TOPICS_RESP_V1 = struct(
    {
        "topics": array(
            struct(_CREATED, {**_CREATED_OPTIONAL, "topic_id": (string(max_len=64), "")})
        )
    },
    {**_TOP_ERROR, **THROTTLE},
)

# --- ElectLeaders (KIP-183, KIP-460) ------------------------------------------------------

# Kafka's ElectionType: PREFERRED moves leadership to the first replica of the list when it
# is alive and in the ISR; UNCLEAN elects a leader for a partition that has none.
ELECTION_PREFERRED = 0
ELECTION_UNCLEAN = 1
ELECT_LEADERS_REQ = struct(
    {},
    {
        # Absent (Kafka's v0) means PREFERRED.
        "election_type": (integer("int8", min=0, max=1), ELECTION_PREFERRED),
        # None: every partition of every topic (answered only for those it elected or
        # could not; partitions already led as wanted are left out, as in Kafka).
        "topic_partitions": (
            nullable(array(struct({"topic": TOPIC_NAME, "partitions": array(PARTITION)}))),
            None,
        ),
        "timeout_ms": (integer("int32", min=0), 60000),
    },
)
ELECT_LEADERS_RESP = struct(
    {
        "error_code": ERROR,
        "replica_election_results": array(
            struct(
                {
                    "topic": TOPIC_NAME,
                    "partition_result": array(
                        struct(
                            {"partition_id": PARTITION, "error_code": ERROR},
                            {"error_message": ERROR_MESSAGE},
                        )
                    ),
                }
            )
        ),
    },
    {"error_message": ERROR_MESSAGE, "throttle_time_ms": (INT32, 0)},
)

# --- DeleteTopics (Kafka's v0-v5 shape: names in, one result per name out) ----------------

DELETE_TOPICS_REQ = struct(
    {"topic_names": array(TOPIC_NAME)}, {"timeout_ms": (integer("int32", min=0), 30000)}
)
_DELETED = {
    "responses": array(
        struct({"name": TOPIC_NAME, "error_code": ERROR}, {"error_message": ERROR_MESSAGE})
    )
}
DELETE_TOPICS_RESP = struct(_DELETED, _TOP_ERROR)
# v1: controller_mutation_rate refuses topics with THROTTLING_QUOTA_EXCEEDED (Kafka's v5).
DELETE_TOPICS_RESP_V1 = struct(_DELETED, {**_TOP_ERROR, **THROTTLE})

# --- Produce -------------------------------------------------------------------------------

# Internal topics (Kafka's Topic.isInternal, plus minibroker's own health topic): anyone may
# read them, but a Produce to one is refused with INVALID_TOPIC_EXCEPTION, from either
# listener, unless its client.id is ADMIN_CLIENT_ID (Kafka's AdminUtils.ADMIN_CLIENT_ID,
# the one exception KafkaApis makes). The broker's own writers go around the rule: the
# group coordinator appends directly, the cluster's health check (`cluster up`'s acks=all
# write, deploy/cluster_ops.py) produces with the admin client id.
GROUP_METADATA_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
HEALTH_TOPIC = "__minibroker_health"
INTERNAL_TOPICS = frozenset({GROUP_METADATA_TOPIC, TRANSACTION_STATE_TOPIC, HEALTH_TOPIC})
ADMIN_CLIENT_ID = "__admin_client"

PRODUCE_REQ = struct(
    {
        "acks": INT16,  # validated by the broker: INVALID_REQUIRED_ACKS, as Kafka does
        "timeout_ms": integer("int32", min=0),
        "topics": _per_partition({"records": BYTES}),
    }
)
_PRODUCE_RESP_FIELDS = {
    "topics": _per_partition(
        {"error_code": ERROR, "base_offset": OFFSET},
        {
            "log_append_time": (INT64, -1),
            "log_start_offset": (INT64, -1),
            "error_message": ERROR_MESSAGE,
            # A refused batch's records and why (Kafka's RecordErrors, KIP-467).
            "record_errors": (
                array(struct({"batch_index": INT32, "message": nullable(STRING)})),
                [],
            ),
        },
    )
}
_PRODUCE_RESP_OPTIONAL = {"error_code": (ERROR, 0), "error_message": ERROR_MESSAGE}
PRODUCE_RESP = struct(_PRODUCE_RESP_FIELDS, _PRODUCE_RESP_OPTIONAL)
# v1: how long a client quota holds the producer back (Kafka's Produce v1, KIP-219's
# throttle: the connection is muted for as long).
PRODUCE_RESP_V1 = struct(
    _PRODUCE_RESP_FIELDS, {**_PRODUCE_RESP_OPTIONAL, "throttle_time_ms": (INT32, 0)}
)

# --- InitProducerId (KIP-98; KIP-360's producer_id/epoch fields) and AllocateProducerIds ---

PRODUCER_ID = INT64
PRODUCER_EPOCH = integer("int16", min=-1)
INIT_PRODUCER_ID_REQ = struct(
    {},
    {
        "transactional_id": (nullable(STRING), None),
        "transaction_timeout_ms": (INT32, 60000),
        "producer_id": (PRODUCER_ID, -1),
        "producer_epoch": (PRODUCER_EPOCH, -1),
    },
)
INIT_PRODUCER_ID_RESP = struct(
    {"error_code": ERROR, "producer_id": PRODUCER_ID, "producer_epoch": PRODUCER_EPOCH},
    {"error_message": ERROR_MESSAGE},
)
# A broker asks the active controller for a block of ids (KIP-730), on the metadata log.
ALLOCATE_PRODUCER_IDS_REQ = struct({"broker_id": NODE_ID})
ALLOCATE_PRODUCER_IDS_RESP = struct(
    {
        "error_code": ERROR,
        "producer_id_start": PRODUCER_ID,
        "producer_id_len": integer("int32", min=0),
    },
    {"error_message": ERROR_MESSAGE},
)

# --- Fetch ---------------------------------------------------------------------------------

FETCH_REQ = struct(
    {
        "max_wait_ms": integer("int32", min=0),
        "min_bytes": integer("int32", min=0),
        "topics": _per_partition(
            {"fetch_offset": OFFSET},
            {
                "partition_max_bytes": (integer("int32", min=0), 1048576),
                "current_leader_epoch": (INT32, -1),
                "last_fetched_epoch": (INT32, -1),
                # A follower's own HW (-1: not given). The leader leaves a partition with
                # no records, no error and this HW out of its answer: see fetch_request.py.
                "high_watermark": (INT64, -1),
                # A follower's own log start (-1: not given): while it is behind the
                # leader's (DeleteRecords), the partition is never left out of the answer,
                # and the leader learns each replica's start (DeleteRecords' low watermark).
                "log_start_offset": (INT64, -1),
            },
        ),
    },
    {
        "replica_id": (NODE_ID, -1),
        "max_bytes": (integer("int32", min=0), 52428800),
        "isolation_level": (integer("int8", min=0, max=1), 0),
        "replica_epoch": (INT64, -1),
    },
)
_DIVERGING = struct({"epoch": INT32, "end_offset": OFFSET})
_FETCH_PARTITION = {"error_code": ERROR, "high_watermark": OFFSET, "records": BYTES}
_FETCH_PARTITION_OPTIONAL = {
    "log_start_offset": (OFFSET, -1),
    "log_end_offset": (OFFSET, -1),
    "diverging_epoch": (nullable(_DIVERGING), None),
    "error_message": ERROR_MESSAGE,
}
_FETCH_TOP = {
    "error_code": (ERROR, 0),
    "error_message": ERROR_MESSAGE,
    "throttle_time_ms": (INT32, 0),
}
FETCH_RESP = struct(
    {"topics": _per_partition(_FETCH_PARTITION, _FETCH_PARTITION_OPTIONAL)}, _FETCH_TOP
)
# Version 1: transactions (KIP-98). A read_committed answer (isolation_level 1) stops at
# the last stable offset and names the aborted transactions in the range it returns, so
# the reader can drop their records; every consumer answer carries the LSO.
_ABORTED_TXN = struct({"producer_id": PRODUCER_ID, "first_offset": OFFSET})
FETCH_RESP_V1 = struct(
    {
        "topics": _per_partition(
            _FETCH_PARTITION,
            {
                **_FETCH_PARTITION_OPTIONAL,
                "last_stable_offset": (OFFSET, -1),
                "aborted_transactions": (nullable(array(_ABORTED_TXN)), None),
            },
        )
    },
    _FETCH_TOP,
)

# Version 2: incremental fetch sessions (KIP-227's request side), for followers. A full
# fetch (session_epoch 0) names every partition and opens a session, whose id the answer
# gives; then each fetch (epoch 1, 2, ...) names only the partitions whose fields changed,
# and the ones to drop in forgotten_topics: the leader holds the rest. session_epoch -1:
# no session (what versions 0 and 1 are). The answer is version 1's, with the session id.
FETCH_REQ_V2 = struct(
    FETCH_REQ.fields,
    {
        **FETCH_REQ.optional,
        "session_id": (INT32, 0),
        "session_epoch": (INT32, -1),
        "forgotten_topics": (
            array(struct({"name": TOPIC_NAME, "partitions": array(PARTITION)})),
            [],
        ),
    },
)
FETCH_RESP_V2 = struct(FETCH_RESP_V1.fields, {**_FETCH_TOP, "session_id": (INT32, 0)})

# A client quota entity: (entity type, name) pairs, a null name the default (Kafka's
# EntityData); its values by quota key (producer_byte_rate, ...).
_QUOTA_ENTITY = array(
    struct({"entity_type": string(max_len=32), "entity_name": nullable(string(max_len=1024))}),
    max_len=2,
)
_QUOTA_VALUES = mapping(string(max_len=64), FLOAT64)
# --- AlterClientQuotas / DescribeClientQuotas (KIP-546), Kafka's shapes ------------------

ALTER_CLIENT_QUOTAS_REQ = struct(
    {
        "entries": array(
            struct(
                {
                    "entity": _QUOTA_ENTITY,
                    "ops": array(
                        struct(
                            {"key": string(max_len=64)},
                            {"value": (FLOAT64, 0.0), "remove": (BOOL, False)},
                        ),
                        max_len=64,
                    ),
                }
            ),
            max_len=10000,
        )
    },
    {"validate_only": (BOOL, False)},
)
ALTER_CLIENT_QUOTAS_RESP = struct(
    {
        "entries": array(
            struct({"error_code": ERROR, "entity": _QUOTA_ENTITY}, {"error_message": ERROR_MESSAGE})
        )
    },
    {"error_code": (ERROR, 0), "error_message": ERROR_MESSAGE, "throttle_time_ms": (INT32, 0)},
)
# match_type: 0 the name given, 1 the default entity, 2 any entity of the type.
DESCRIBE_CLIENT_QUOTAS_REQ = struct(
    {
        "components": array(
            struct(
                {
                    "entity_type": string(max_len=32),
                    "match_type": integer("int8", min=0, max=2),
                },
                {"match": (nullable(string(max_len=1024)), None)},
            ),
            max_len=2,
        )
    },
    {"strict": (BOOL, False)},
)
DESCRIBE_CLIENT_QUOTAS_RESP = struct(
    {"error_code": ERROR},
    {
        "error_message": ERROR_MESSAGE,
        "throttle_time_ms": (INT32, 0),
        "entries": (
            nullable(array(struct({"entity": _QUOTA_ENTITY, "values": _QUOTA_VALUES}))),
            None,
        ),
    },
)

# --- ListOffsets ---------------------------------------------------------------------------

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3  # KIP-734: the record with the largest timestamp (Kafka's ListOffsets v7+)

LIST_OFFSETS_REQ = struct(
    {"topics": _per_partition({"timestamp": INT64})},
    {"replica_id": (NODE_ID, -1), "isolation_level": (integer("int8", min=0, max=1), 0)},
)
LIST_OFFSETS_RESP = struct(
    {
        "topics": _per_partition(
            {"error_code": ERROR, "timestamp": INT64, "offset": OFFSET},
            {"error_message": ERROR_MESSAGE, "leader_epoch": (INT32, -1)},
        )
    },
    {"error_code": (ERROR, 0), "error_message": ERROR_MESSAGE},
)

# --- WriteTxnMarkers (inter-broker: a transaction coordinator to partition leaders) ----

# Kafka's WriteTxnMarkersRequest v1 (docs/transactions.md, "The partition side"): one
# control batch per (marker, partition), answered when the ISR has it (acks=all).
_TXN_MARKER = struct(
    {
        "producer_id": PRODUCER_ID,
        "producer_epoch": PRODUCER_EPOCH,
        "transaction_result": BOOL,
        "topics": array(struct({"name": TOPIC_NAME, "partition_indexes": array(PARTITION)})),
        "coordinator_epoch": INT32,
    }
)
WRITE_TXN_MARKERS_REQ = struct({"markers": array(_TXN_MARKER)})
_TXN_MARKER_RESULT = struct(
    {
        "producer_id": PRODUCER_ID,
        "topics": array(
            struct(
                {
                    "name": TOPIC_NAME,
                    "partitions": array(
                        struct({"partition_index": PARTITION, "error_code": ERROR})
                    ),
                }
            )
        ),
    }
)
WRITE_TXN_MARKERS_RESP = struct(
    {"markers": array(_TXN_MARKER_RESULT)},
    {"error_code": (ERROR, 0), "error_message": ERROR_MESSAGE},
)

# --- BrokerStats (minibroker) --------------------------------------------------------------

BROKER_STATS_REQ = struct({})
BROKER_STATS_RESP = struct(
    {"error_code": ERROR, "broker_id": NODE_ID, "stats": mapping(STRING, anything())},
    {"error_message": ERROR_MESSAGE},
)

# --- cluster APIs (broker <-> controller) --------------------------------------------------

_PARTITION_STATE = struct(
    {
        "leader": NODE_ID,
        "leader_epoch": INT32,
        "replicas": array(NODE_ID),
        "isr": array(NODE_ID),
    },
    {"partition_epoch": (INT32, 0)},
)
METADATA_SNAPSHOT = struct(
    {
        "controller_id": NODE_ID,
        "epoch": INT64,
        "brokers": array(_BROKER),
        "topics": array(
            struct(
                {"name": TOPIC_NAME, "partitions": array(_PARTITION_STATE)},
                # topic_id: Kafka's topic id, which tells a topic from an earlier one of the
                # same name (deleted, then created again); "" for topics from before it.
                {"configs": (mapping(STRING, STRING), {}), "topic_id": (string(max_len=64), "")},
            )
        ),
    },
    {
        "live_brokers": (array(NODE_ID), []),
        "next_producer_id": (integer("int64", min=0), 0),
        # Client quotas (KRaft's ClientQuotaRecord): each entity with its values.
        "client_quotas": (array(struct({"entity": _QUOTA_ENTITY, "values": _QUOTA_VALUES})), []),
        # dynamic broker configs: "" (cluster default) or a broker id -> key -> value
        "broker_configs": (mapping(STRING, mapping(STRING, STRING)), {}),
    },
)

BROKER_REGISTRATION_REQ = struct(
    {"broker_id": NODE_ID, "host": STRING, "port": _PORT},
    {"incarnation": (INT64, 0), **_KAFKA_LISTENER},
)
BROKER_REGISTRATION_RESP = struct(
    {"error_code": ERROR},
    {"error_message": ERROR_MESSAGE, "metadata": (nullable(METADATA_SNAPSHOT), None)},
)
BROKER_HEARTBEAT_REQ = struct(
    {"broker_id": NODE_ID, "metadata_epoch": INT64}, {"shutting_down": (BOOL, False)}
)
BROKER_HEARTBEAT_RESP = BROKER_REGISTRATION_RESP
UPDATE_METADATA_REQ = struct({"metadata": METADATA_SNAPSHOT})
UPDATE_METADATA_RESP = _ERROR_ONLY
ALTER_PARTITION_REQ = struct(
    {
        "broker_id": NODE_ID,
        "topic": TOPIC_NAME,
        "partition": PARTITION,
        "leader_epoch": INT32,
        "partition_epoch": INT32,
        "new_isr": array(NODE_ID),
    }
)
ALTER_PARTITION_RESP = struct(
    {"error_code": ERROR},
    {"error_message": ERROR_MESSAGE, "isr": (array(NODE_ID), []), "partition_epoch": (INT32, -1)},
)
OFFSET_FOR_LEADER_EPOCH_REQ = struct(
    {"replica_id": NODE_ID, "topics": _per_partition({"leader_epoch": INT32})}
)
OFFSET_FOR_LEADER_EPOCH_RESP = struct(
    {"topics": _per_partition({"error_code": ERROR, "leader_epoch": INT32, "end_offset": OFFSET})},
    {"error_code": (ERROR, 0), "error_message": ERROR_MESSAGE},
)

# --- the controller quorum (KIP-595, KIP-630): voter <-> voter, members only ------------------
#
# Cut to one metadata partition: no topic/partition nesting. Every response carries the
# responder's (leader_epoch, leader_id) so a stale voter learns the new leader from any answer.

_QUORUM_EPOCH = INT32
_LEADER = nullable(NODE_ID)
_OFFSET_AND_EPOCH = struct({"offset": OFFSET, "epoch": INT32})
_QUORUM_RESP = {"error_code": ERROR, "leader_epoch": _QUORUM_EPOCH, "leader_id": _LEADER}
VOTE_REQ = struct(
    {
        "candidate_epoch": _QUORUM_EPOCH,
        "candidate_id": NODE_ID,
        "last_offset_epoch": INT32,
        "last_offset": OFFSET,
    }
)
VOTE_RESP = struct({**_QUORUM_RESP, "vote_granted": BOOL}, {"error_message": ERROR_MESSAGE})
# Version 1 (Kafka's Vote v2, KIP-996): pre_vote asks "would you vote for me?" without the
# epoch moving; the response echoes it.
_PRE_VOTE = {"pre_vote": (BOOL, False)}
VOTE_REQ_V1 = struct(VOTE_REQ.fields, _PRE_VOTE)
VOTE_RESP_V1 = struct(VOTE_RESP.fields, {**VOTE_RESP.optional, **_PRE_VOTE})
BEGIN_QUORUM_EPOCH_REQ = struct({"leader_epoch": _QUORUM_EPOCH, "leader_id": NODE_ID})
BEGIN_QUORUM_EPOCH_RESP = struct(_QUORUM_RESP, {"error_message": ERROR_MESSAGE})
END_QUORUM_EPOCH_REQ = struct(
    {
        "leader_epoch": _QUORUM_EPOCH,
        "leader_id": NODE_ID,
        "preferred_successors": array(NODE_ID, max_len=1000),
    }
)
END_QUORUM_EPOCH_RESP = BEGIN_QUORUM_EPOCH_RESP
_QUORUM_ENTRY = struct(
    {"offset": OFFSET, "epoch": INT32, "data": BYTES}, {"control": (BOOL, False)}
)
QUORUM_FETCH_REQ = struct(
    {
        "correlation_id": INT64,
        "replica_id": NODE_ID,
        "current_leader_epoch": _QUORUM_EPOCH,
        "fetch_offset": OFFSET,
        "last_fetched_epoch": INT32,
        "max_wait_ms": integer("int32", min=0),
    }
)
QUORUM_FETCH_RESP = struct(
    {"correlation_id": INT64, **_QUORUM_RESP},
    {
        "error_message": ERROR_MESSAGE,
        "high_watermark": (nullable(OFFSET), None),
        "records": (array(_QUORUM_ENTRY), []),
        "diverging_epoch": (nullable(_OFFSET_AND_EPOCH), None),
        "snapshot_id": (nullable(_OFFSET_AND_EPOCH), None),
    },
)
FETCH_SNAPSHOT_REQ = struct(
    {
        "correlation_id": INT64,
        "replica_id": NODE_ID,
        "current_leader_epoch": _QUORUM_EPOCH,
        "snapshot_id": _OFFSET_AND_EPOCH,
    }
)
FETCH_SNAPSHOT_RESP = struct(
    {"correlation_id": INT64, **_QUORUM_RESP},
    {
        "error_message": ERROR_MESSAGE,
        "snapshot": (nullable(struct({"snapshot_id": _OFFSET_AND_EPOCH, "data": BYTES})), None),
    },
)

# --- SaslHandshake / SaslAuthenticate (cluster members prove they hold the secret) ---------
#
# Modelled on Kafka's pair, folded into two round trips: the handshake names the
# mechanism, the claimed broker id and the client's nonce, and answers with the server's
# id and nonce; authenticate carries the client's proof and answers with the server's.

NONCE = binary(max_len=64)
SASL_HANDSHAKE_REQ = struct(
    {
        "mechanism": string(max_len=64),
        "broker_id": NODE_ID,
        "cluster_id": string(max_len=64),
        "client_nonce": NONCE,
    }
)
SASL_HANDSHAKE_RESP = struct(
    {"error_code": ERROR},
    {
        "error_message": ERROR_MESSAGE,
        "mechanisms": (array(string(max_len=64), max_len=16), []),
        "broker_id": (NODE_ID, -1),
        "server_nonce": (NONCE, b""),
    },
)
SASL_AUTHENTICATE_REQ = struct({"auth_bytes": binary(max_len=64)})
SASL_AUTHENTICATE_RESP = struct(
    {"error_code": ERROR},
    {"error_message": ERROR_MESSAGE, "auth_bytes": (binary(max_len=64), b"")},
)

# --- Faults (minibroker: fault injection for tests) -------------------------------------------

FAULT_ACTIONS = (
    "delay-replication",
    "drop-replication",
    "delay-api",
    "delay-request",
    "fail-api",
    "isolate",
    "clear",
)
_FAULT = struct(
    {"action": string(max_len=32)},
    {
        "topic": (nullable(TOPIC_NAME), None),
        "partition": (integer("int32", min=-1), -1),
        "delay_ms": (integer("int32", min=0), 0),
        "api_key": (integer("int32", min=-1), -1),
        "error_code": (INT16, 0),
        "count": (integer("int32", min=-1), -1),
        # isolate: the peers whose requests are dropped; clear: lift only isolation from these
        "brokers": (array(integer("int32", min=0), max_len=1024), ()),
    },
)
FAULTS_REQ = _FAULT
FAULTS_RESP = struct(
    {"error_code": ERROR, "faults": array(_FAULT)}, {"error_message": ERROR_MESSAGE}
)

# --- registry ------------------------------------------------------------------------------

# (request schema, response schema) per key and version.
SCHEMAS: dict[int, dict[int, tuple[Validator, Validator]]] = {
    ApiKey.API_VERSIONS: {0: (API_VERSIONS_REQ, API_VERSIONS_RESP)},
    ApiKey.METADATA: {0: (METADATA_REQ, METADATA_RESP), 1: (METADATA_REQ_V1, METADATA_RESP)},
    ApiKey.CREATE_TOPICS: {
        0: (CREATE_TOPICS_REQ, CREATE_TOPICS_RESP),
        1: (CREATE_TOPICS_REQ, CREATE_TOPICS_RESP_V1),
    },
    ApiKey.ELECT_LEADERS: {0: (ELECT_LEADERS_REQ, ELECT_LEADERS_RESP)},
    ApiKey.DELETE_TOPICS: {
        0: (DELETE_TOPICS_REQ, DELETE_TOPICS_RESP),
        1: (DELETE_TOPICS_REQ, DELETE_TOPICS_RESP_V1),
    },
    ApiKey.PRODUCE: {0: (PRODUCE_REQ, PRODUCE_RESP), 1: (PRODUCE_REQ, PRODUCE_RESP_V1)},
    ApiKey.FETCH: {
        0: (FETCH_REQ, FETCH_RESP),
        1: (FETCH_REQ, FETCH_RESP_V1),
        2: (FETCH_REQ_V2, FETCH_RESP_V2),
    },
    ApiKey.LIST_OFFSETS: {0: (LIST_OFFSETS_REQ, LIST_OFFSETS_RESP)},
    ApiKey.ALTER_CLIENT_QUOTAS: {0: (ALTER_CLIENT_QUOTAS_REQ, ALTER_CLIENT_QUOTAS_RESP)},
    ApiKey.DESCRIBE_CLIENT_QUOTAS: {0: (DESCRIBE_CLIENT_QUOTAS_REQ, DESCRIBE_CLIENT_QUOTAS_RESP)},
    ApiKey.BROKER_STATS: {0: (BROKER_STATS_REQ, BROKER_STATS_RESP)},
    ApiKey.BROKER_REGISTRATION: {0: (BROKER_REGISTRATION_REQ, BROKER_REGISTRATION_RESP)},
    ApiKey.BROKER_HEARTBEAT: {0: (BROKER_HEARTBEAT_REQ, BROKER_HEARTBEAT_RESP)},
    ApiKey.UPDATE_METADATA: {0: (UPDATE_METADATA_REQ, UPDATE_METADATA_RESP)},
    ApiKey.ALTER_PARTITION: {0: (ALTER_PARTITION_REQ, ALTER_PARTITION_RESP)},
    ApiKey.OFFSET_FOR_LEADER_EPOCH: {
        0: (OFFSET_FOR_LEADER_EPOCH_REQ, OFFSET_FOR_LEADER_EPOCH_RESP)
    },
    ApiKey.INIT_PRODUCER_ID: {0: (INIT_PRODUCER_ID_REQ, INIT_PRODUCER_ID_RESP)},
    ApiKey.ALLOCATE_PRODUCER_IDS: {0: (ALLOCATE_PRODUCER_IDS_REQ, ALLOCATE_PRODUCER_IDS_RESP)},
    # Version 1, as Kafka's (the contract with the coordinator, docs/transactions.md).
    ApiKey.WRITE_TXN_MARKERS: {1: (WRITE_TXN_MARKERS_REQ, WRITE_TXN_MARKERS_RESP)},
    ApiKey.FAULTS: {0: (FAULTS_REQ, FAULTS_RESP)},
    ApiKey.VOTE: {0: (VOTE_REQ, VOTE_RESP), 1: (VOTE_REQ_V1, VOTE_RESP_V1)},
    ApiKey.BEGIN_QUORUM_EPOCH: {0: (BEGIN_QUORUM_EPOCH_REQ, BEGIN_QUORUM_EPOCH_RESP)},
    ApiKey.END_QUORUM_EPOCH: {0: (END_QUORUM_EPOCH_REQ, END_QUORUM_EPOCH_RESP)},
    ApiKey.QUORUM_FETCH: {0: (QUORUM_FETCH_REQ, QUORUM_FETCH_RESP)},
    ApiKey.FETCH_SNAPSHOT: {0: (FETCH_SNAPSHOT_REQ, FETCH_SNAPSHOT_RESP)},
    ApiKey.SASL_HANDSHAKE: {0: (SASL_HANDSHAKE_REQ, SASL_HANDSHAKE_RESP)},
    ApiKey.SASL_AUTHENTICATE: {0: (SASL_AUTHENTICATE_REQ, SASL_AUTHENTICATE_RESP)},
    # consumer groups (protocol/group_api.py)
    ApiKey.FIND_COORDINATOR: {0: (group_api.FIND_COORDINATOR_REQ, group_api.FIND_COORDINATOR_RESP)},
    # Version 1 of a group API: static membership's group_instance_id (group_api.py).
    ApiKey.JOIN_GROUP: {
        0: (group_api.JOIN_GROUP_REQ, group_api.JOIN_GROUP_RESP),
        1: (group_api.JOIN_GROUP_REQ_V1, group_api.JOIN_GROUP_RESP_V1),
    },
    ApiKey.SYNC_GROUP: {
        0: (group_api.SYNC_GROUP_REQ, group_api.SYNC_GROUP_RESP),
        1: (group_api.SYNC_GROUP_REQ_V1, group_api.SYNC_GROUP_RESP),
    },
    ApiKey.HEARTBEAT: {
        0: (group_api.HEARTBEAT_REQ, group_api.HEARTBEAT_RESP),
        1: (group_api.HEARTBEAT_REQ_V1, group_api.HEARTBEAT_RESP),
    },
    ApiKey.LEAVE_GROUP: {
        0: (group_api.LEAVE_GROUP_REQ, group_api.LEAVE_GROUP_RESP),
        1: (group_api.LEAVE_GROUP_REQ_V1, group_api.LEAVE_GROUP_RESP_V1),
    },
    ApiKey.OFFSET_COMMIT: {
        0: (group_api.OFFSET_COMMIT_REQ, group_api.OFFSET_COMMIT_RESP),
        1: (group_api.OFFSET_COMMIT_REQ_V1, group_api.OFFSET_COMMIT_RESP),
        2: (group_api.OFFSET_COMMIT_REQ_V2, group_api.OFFSET_COMMIT_RESP),
    },
    ApiKey.OFFSET_FETCH: {
        0: (group_api.OFFSET_FETCH_REQ, group_api.OFFSET_FETCH_RESP),
        1: (group_api.OFFSET_FETCH_REQ, group_api.OFFSET_FETCH_RESP_V1),
    },
    ApiKey.LIST_GROUPS: {0: (group_api.LIST_GROUPS_REQ, group_api.LIST_GROUPS_RESP)},
    ApiKey.DESCRIBE_GROUPS: {
        0: (group_api.DESCRIBE_GROUPS_REQ, group_api.DESCRIBE_GROUPS_RESP),
        1: (group_api.DESCRIBE_GROUPS_REQ, group_api.DESCRIBE_GROUPS_RESP_V1),
    },
    ApiKey.DELETE_GROUPS: {0: (group_api.DELETE_GROUPS_REQ, group_api.DELETE_GROUPS_RESP)},
    # transactions (protocol/txn_api.py)
    ApiKey.ADD_PARTITIONS_TO_TXN: {
        0: (txn_api.ADD_PARTITIONS_TO_TXN_REQ, txn_api.ADD_PARTITIONS_TO_TXN_RESP)
    },
    ApiKey.ADD_OFFSETS_TO_TXN: {
        0: (txn_api.ADD_OFFSETS_TO_TXN_REQ, txn_api.ADD_OFFSETS_TO_TXN_RESP)
    },
    ApiKey.END_TXN: {0: (txn_api.END_TXN_REQ, txn_api.END_TXN_RESP)},
    ApiKey.TXN_OFFSET_COMMIT: {0: (txn_api.TXN_OFFSET_COMMIT_REQ, txn_api.TXN_OFFSET_COMMIT_RESP)},
    ApiKey.DESCRIBE_TRANSACTIONS: {
        0: (txn_api.DESCRIBE_TRANSACTIONS_REQ, txn_api.DESCRIBE_TRANSACTIONS_RESP)
    },
    ApiKey.LIST_TRANSACTIONS: {0: (txn_api.LIST_TRANSACTIONS_REQ, txn_api.LIST_TRANSACTIONS_RESP)},
    ApiKey.OFFSET_DELETE: {0: (group_api.OFFSET_DELETE_REQ, group_api.OFFSET_DELETE_RESP)},
    # topic changes after creation (protocol/admin_api.py)
    # v1: the same shapes; a v1 client knows controller_mutation_rate's refusal
    # (THROTTLING_QUOTA_EXCEEDED, Kafka's CreatePartitions v3).
    ApiKey.CREATE_PARTITIONS: {
        0: (admin_api.CREATE_PARTITIONS_REQ, admin_api.CREATE_PARTITIONS_RESP),
        1: (admin_api.CREATE_PARTITIONS_REQ, admin_api.CREATE_PARTITIONS_RESP),
    },
    ApiKey.INCREMENTAL_ALTER_CONFIGS: {
        0: (admin_api.INCREMENTAL_ALTER_CONFIGS_REQ, admin_api.INCREMENTAL_ALTER_CONFIGS_RESP)
    },
    ApiKey.DESCRIBE_CONFIGS: {0: (admin_api.DESCRIBE_CONFIGS_REQ, admin_api.DESCRIBE_CONFIGS_RESP)},
    ApiKey.DELETE_RECORDS: {0: (admin_api.DELETE_RECORDS_REQ, admin_api.DELETE_RECORDS_RESP)},
    ApiKey.DESCRIBE_LOG_DIRS: {
        0: (admin_api.DESCRIBE_LOG_DIRS_REQ, admin_api.DESCRIBE_LOG_DIRS_RESP)
    },
    ApiKey.DESCRIBE_PRODUCERS: {
        0: (admin_api.DESCRIBE_PRODUCERS_REQ, admin_api.DESCRIBE_PRODUCERS_RESP)
    },
}

# The version our handlers answer in and our peers ask in when the other side has it.
NEWEST_VERSIONS: dict[int, int] = {int(key): max(versions) for key, versions in SCHEMAS.items()}

# APIs whose answer is about one item (one partition), so a non-zero top-level
# error_code is that item's result, returned with the rest of the body for the caller to
# read, not a failure of the request that the connection raises (protocol.connection has
# the rule). AlterPartition: a stale proposal comes back INVALID_REQUEST with the current
# ISR. A new API answering "no, and here is the current state" at top level belongs here:
# so do the quorum's (KIP-595), whose errors (FENCED_LEADER_EPOCH, ...) travel with the
# epoch and leader the Raft core must learn from. A bare error body still raises.
ITEM_VERDICT_APIS = frozenset(
    int(key)
    for key in (
        ApiKey.ALTER_PARTITION,
        ApiKey.VOTE,
        ApiKey.BEGIN_QUORUM_EPOCH,
        ApiKey.END_QUORUM_EPOCH,
        ApiKey.QUORUM_FETCH,
        ApiKey.FETCH_SNAPSHOT,
        # A group's verdict is its coordinator's answer about that group (Kafka's group
        # errors: REBALANCE_IN_PROGRESS, MEMBER_ID_REQUIRED with the id to rejoin with,
        # NOT_COORDINATOR, ...): the client reads the code and acts on the rest.
        ApiKey.FIND_COORDINATOR,
        ApiKey.JOIN_GROUP,
        ApiKey.SYNC_GROUP,
        ApiKey.HEARTBEAT,
        ApiKey.LEAVE_GROUP,
        ApiKey.OFFSET_FETCH,
        ApiKey.LIST_GROUPS,
        # A transaction's verdict from its coordinator (CONCURRENT_TRANSACTIONS: retry,
        # PRODUCER_FENCED: give up, ...), read by the producer as data.
        ApiKey.INIT_PRODUCER_ID,
        ApiKey.ADD_OFFSETS_TO_TXN,
        ApiKey.END_TXN,
        ApiKey.LIST_TRANSACTIONS,
    )
)

# A top-level error body is valid as the response to any API (UNSUPPORTED_VERSION,
# INVALID_REQUEST, or an error injected for tests).
ERROR_RESPONSE = _ERROR_ONLY


def supported_versions() -> list[list[int]]:
    """``[[api_key, min_version, max_version], ...]`` for ApiVersions."""
    return [[int(k), min(v), max(v)] for k, v in sorted(SCHEMAS.items())]


def api_name(key: int) -> str:
    try:
        return ApiKey(key).name
    except ValueError:
        return f"API_{key}"


__all__ = [
    "BYTES",
    "EARLIEST_TIMESTAMP",
    "ELECTION_PREFERRED",
    "ELECTION_UNCLEAN",
    "ERROR_RESPONSE",
    "INT64",
    "ITEM_VERDICT_APIS",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "NEWEST_VERSIONS",
    "SCHEMAS",
    "ApiKey",
    "api_name",
    "supported_versions",
]
