"""Body schemas of the transaction APIs (KIP-98, KIP-447, KIP-664), under Kafka's api keys.

Kafka's field names in snake_case, one version each (the Kafka listener translates every
Kafka version onto these). A transactional producer talks to its transaction coordinator
(InitProducerId with a transactional id lives in api.py with the idempotent one,
AddPartitionsToTxn, AddOffsetsToTxn, EndTxn), to its group's coordinator
(TxnOffsetCommit), and an admin lists and describes transactions. WriteTxnMarkers, the
coordinator's internal request to each partition leader, is in api.py with the partition
side.

Every answer carries ``throttle_time_ms`` so that one with only an error code is a
verdict the caller reads (protocol.connection's rule), not a bare error body.
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

TRANSACTIONAL_ID = string(max_len=32767)
_GROUP_ID = string(max_len=255)
_TOPIC = string(max_len=249)
_PARTITION = integer("int32", min=0)
_PRODUCER_ID = INT64
_EPOCH = integer("int16", min=-1)
_ERROR = INT16
_MESSAGE = {"error_message": (nullable(STRING), None)}
_THROTTLE = {"throttle_time_ms": (INT32, 0)}
_TOPIC_PARTITIONS = array(struct({"name": _TOPIC, "partitions": array(_PARTITION)}))
_PARTITION_RESULTS = array(
    struct(
        {
            "name": _TOPIC,
            "partitions": array(struct({"partition": _PARTITION, "error_code": _ERROR})),
        }
    )
)
_PRODUCER = {
    "transactional_id": TRANSACTIONAL_ID,
    "producer_id": _PRODUCER_ID,
    "producer_epoch": _EPOCH,
}

# --- AddPartitionsToTxn (24): the partitions a transaction is about to write -------------

ADD_PARTITIONS_TO_TXN_REQ = struct({**_PRODUCER, "topics": _TOPIC_PARTITIONS})
ADD_PARTITIONS_TO_TXN_RESP = struct({"results": _PARTITION_RESULTS}, {**_THROTTLE})

# --- AddOffsetsToTxn (25): the group whose offsets the transaction will commit -------------

ADD_OFFSETS_TO_TXN_REQ = struct({**_PRODUCER, "group_id": _GROUP_ID})
ADD_OFFSETS_TO_TXN_RESP = struct({"error_code": _ERROR}, {**_MESSAGE, **_THROTTLE})

# --- EndTxn (26): commit (True) or abort ------------------------------------------------------

END_TXN_REQ = struct({**_PRODUCER, "committed": BOOL})
END_TXN_RESP = ADD_OFFSETS_TO_TXN_RESP

# --- TxnOffsetCommit (28): offsets pending in a transaction (KIP-447's member fields) -------

TXN_OFFSET_COMMIT_REQ = struct(
    {
        **_PRODUCER,
        "group_id": _GROUP_ID,
        "topics": array(
            struct(
                {
                    "name": _TOPIC,
                    "partitions": array(
                        struct(
                            {
                                "partition": _PARTITION,
                                "committed_offset": INT64,
                                "committed_metadata": nullable(STRING),
                            },
                            {"committed_leader_epoch": (INT32, -1)},
                        )
                    ),
                }
            )
        ),
    },
    {
        "generation_id": (INT32, -1),
        "member_id": (string(max_len=512), ""),
        "group_instance_id": (nullable(string(max_len=255)), None),
    },
)
TXN_OFFSET_COMMIT_RESP = struct({"topics": _PARTITION_RESULTS}, {**_THROTTLE})

# --- DescribeTransactions (65) and ListTransactions (66), KIP-664 -----------------------------

DESCRIBE_TRANSACTIONS_REQ = struct({"transactional_ids": array(TRANSACTIONAL_ID)})
DESCRIBE_TRANSACTIONS_RESP = struct(
    {
        "transaction_states": array(
            struct(
                {
                    "error_code": _ERROR,
                    "transactional_id": TRANSACTIONAL_ID,
                    "transaction_state": STRING,
                    "transaction_timeout_ms": INT32,
                    "transaction_start_time_ms": INT64,
                    "producer_id": _PRODUCER_ID,
                    "producer_epoch": _EPOCH,
                    "topics": _TOPIC_PARTITIONS,
                }
            )
        )
    },
    {**_THROTTLE},
)
LIST_TRANSACTIONS_REQ = struct(
    {},
    {
        "state_filters": (array(STRING), []),
        "producer_id_filters": (array(_PRODUCER_ID), []),
        # KIP-994: only transactions running longer than this (ms); -1: any.
        "duration_filter": (INT64, -1),
    },
)
LIST_TRANSACTIONS_RESP = struct(
    {
        "error_code": _ERROR,
        "unknown_state_filters": array(STRING),
        "transaction_states": array(
            struct(
                {
                    "transactional_id": TRANSACTIONAL_ID,
                    "producer_id": _PRODUCER_ID,
                    "transaction_state": STRING,
                }
            )
        ),
    },
    {**_MESSAGE, **_THROTTLE},
)
