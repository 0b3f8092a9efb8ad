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
