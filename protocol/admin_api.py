"""Body schemas of the admin APIs that change a topic after its creation (issue 38).

Kafka's api keys and field meanings, in the native protocol's shape (``topics`` by name,
maps for configs). api.py registers them; the Kafka listener translates Kafka's bodies onto
them (broker/kafka/admin.py), so a rule lives in one handler for both listeners.

CreatePartitions: ``count`` is the topic's new partition count (not the number added);
``assignments`` (None: the controller places them) holds one replica list per *new*
partition, as in Kafka.
"""

from __future__ import annotations

from minibroker.protocol.schema import (
    BOOL,
    INT16,
    INT32,
    INT64,
    STRING,
    array,
    integer,
    nullable,
    string,
    struct,
)

_TOPIC = string(max_len=249)
_NODE = integer("int32", min=-1)
_ERROR = INT16
_MESSAGE = (nullable(STRING), None)
_TOP_ERROR = {"error_code": (_ERROR, 0), "error_message": _MESSAGE, "throttle_time_ms": (INT32, 0)}

# --- CreatePartitions (Kafka key 37) --------------------------------------------------------

CREATE_PARTITIONS_REQ = struct(
    {
        "topics": array(
            struct(
                {"name": _TOPIC, "count": integer("int32", min=0)},
                {"assignments": (nullable(array(array(_NODE))), None)},
            )
        )
    },
    {"timeout_ms": (integer("int32", min=0), 30000), "validate_only": (BOOL, False)},
)
CREATE_PARTITIONS_RESP = struct(
    {"results": array(struct({"name": _TOPIC, "error_code": _ERROR}, {"error_message": _MESSAGE}))},
    _TOP_ERROR,
)

# --- IncrementalAlterConfigs (Kafka key 44; AlterConfigs, key 33, is ``replace``) ----------

RESOURCE_TYPE = integer("int8", min=0)
CONFIG_OPERATION = integer("int8", min=0, max=3)  # SET, DELETE, APPEND, SUBTRACT
INCREMENTAL_ALTER_CONFIGS_REQ = struct(
    {
        "resources": array(
            struct(
                {
                    "resource_type": RESOURCE_TYPE,
                    "resource_name": STRING,
                    "configs": array(
                        struct(
                            {"name": STRING, "config_operation": CONFIG_OPERATION},
                            {"value": (nullable(STRING), None)},
                        )
                    ),
                }
            )
        )
    },
    {
        "validate_only": (BOOL, False),
        # AlterConfigs: the given configs become the resource's whole dynamic config.
        "replace": (BOOL, False),
        "timeout_ms": (integer("int32", min=0), 30000),
    },
)
_RESOURCE_RESULT = struct(
    {
        "resource_type": RESOURCE_TYPE,
        "resource_name": STRING,
        "error_code": _ERROR,
    },
    {"error_message": _MESSAGE},
)
INCREMENTAL_ALTER_CONFIGS_RESP = struct({"responses": array(_RESOURCE_RESULT)}, _TOP_ERROR)

# --- DescribeConfigs (Kafka key 32) ---------------------------------------------------------

DESCRIBE_CONFIGS_REQ = struct(
    {
        "resources": array(
            struct(
                {"resource_type": RESOURCE_TYPE, "resource_name": STRING},
                {"configuration_keys": (nullable(array(STRING)), None)},
            )
        )
    },
    {"include_synonyms": (BOOL, False), "include_documentation": (BOOL, False)},
)
_SYNONYM = struct({"name": STRING, "value": nullable(STRING), "source": integer("int8")})
_CONFIG_ENTRY = struct(
    {
        "name": STRING,
        "value": nullable(STRING),
        "read_only": BOOL,
        "config_source": integer("int8"),
        "is_sensitive": BOOL,
    },
    {
        "synonyms": (array(_SYNONYM), []),
        "config_type": (integer("int8"), 0),
        "documentation": _MESSAGE,
    },
)
DESCRIBE_CONFIGS_RESP = struct(
    {
        "results": array(
            struct(
                {
                    "resource_type": RESOURCE_TYPE,
                    "resource_name": STRING,
                    "error_code": _ERROR,
                },
                {"error_message": _MESSAGE, "configs": (array(_CONFIG_ENTRY), [])},
            )
        )
    },
    _TOP_ERROR,
)

# --- DeleteRecords (Kafka key 21) ----------------------------------------------------------

_PARTITION = integer("int32", min=0)
DELETE_RECORDS_REQ = struct(
    {
        "topics": array(
            struct(
                {
                    "name": _TOPIC,
                    # offset: records before it go; -1 means the high watermark
                    "partitions": array(struct({"partition": _PARTITION, "offset": INT64})),
                }
            )
        )
    },
    {"timeout_ms": (integer("int32", min=0), 30000)},
)
DELETE_RECORDS_RESP = struct(
    {
        "topics": array(
            struct(
                {
                    "name": _TOPIC,
                    "partitions": array(
                        struct(
                            {"partition": _PARTITION, "error_code": _ERROR, "low_watermark": INT64},
                            {"error_message": _MESSAGE},
                        )
                    ),
                }
            )
        )
    },
    _TOP_ERROR,
)

# --- DescribeLogDirs (Kafka key 35) and DescribeProducers (Kafka key 61): Kafka's shapes ----

DESCRIBE_LOG_DIRS_REQ = struct(
    {},
    {
        # None: every partition this broker hosts
        "topics": (
            nullable(array(struct({"topic": _TOPIC, "partitions": array(_PARTITION)}))),
            None,
        )
    },
)
_LOG_DIR_PARTITION = struct(
    {
        "partition_index": _PARTITION,
        "partition_size": INT64,
        "offset_lag": INT64,
        "is_future_key": BOOL,
    }
)
DESCRIBE_LOG_DIRS_RESP = struct(
    {
        "results": array(
            struct(
                {
                    "error_code": _ERROR,
                    "log_dir": STRING,
                    "topics": array(
                        struct({"name": _TOPIC, "partitions": array(_LOG_DIR_PARTITION)})
                    ),
                },
                {"total_bytes": (INT64, -1), "usable_bytes": (INT64, -1)},
            )
        )
    },
    _TOP_ERROR,
)
DESCRIBE_PRODUCERS_REQ = struct(
    {"topics": array(struct({"name": _TOPIC, "partition_indexes": array(_PARTITION)}))}
)
_PRODUCER = struct(
    {
        "producer_id": INT64,
        "producer_epoch": INT32,
        "last_sequence": INT32,
        "last_timestamp": INT64,
        "coordinator_epoch": INT32,
        "current_txn_start_offset": INT64,
    }
)
DESCRIBE_PRODUCERS_RESP = struct(
    {
        "topics": array(
            struct(
                {
                    "name": _TOPIC,
                    "partitions": array(
                        struct(
                            {"partition_index": _PARTITION, "error_code": _ERROR},
                            {"error_message": _MESSAGE, "active_producers": (array(_PRODUCER), [])},
                        )
                    ),
                }
            )
        )
    },
    _TOP_ERROR,
)
