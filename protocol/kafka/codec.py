"""Kafka's request and response framing around the message bodies (sans-IO).

A request frame: header (api_key int16, api_version int16, correlation_id int32,
client_id nullable int16 string, and in flexible versions a tagged-field section: header
v2) then the body. A response: correlation_id, a tagged-field section when the response
is flexible (header v1) except for ApiVersions, whose response header is always v0 (a
client that does not know the broker's versions yet must be able to read it: KIP-511),
then the body. Frames are 4-byte big-endian lengths, the same as ours (protocol/framing).

``SUPPORTED`` is what the Kafka listener serves: only versions implemented in full. The
data path and the group APIs stop before their flexible versions; ApiVersions v3
(librdkafka sends it first) and the admin APIs whose flexible versions stock admin clients
ask for (DeleteTopics v4+, ElectLeaders v2, DescribeCluster: every version) are flexible.
Every client this serves negotiates down: librdkafka (confluent-kafka, kcat) from its
maxima, kafka-python and aiokafka likewise from their ApiVersions probe.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from minibroker.protocol.api import ApiKey
from minibroker.protocol.errors import ErrorCode, ProtocolError
from minibroker.protocol.framing import encode_frame_of
from minibroker.protocol.kafka.messages import KafkaDecodeError, message_codec, read_uvarint


class KafkaApi:
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    FIND_COORDINATOR = 10
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    CREATE_PARTITIONS = 37
    INCREMENTAL_ALTER_CONFIGS = 44
    ELECT_LEADERS = 43
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61


# The group APIs are named by the native ApiKey: the native protocol has them under Kafka's
# own keys and versions' meaning (protocol/group_api.py).
# api key -> the spec's name stem (specs/<stem>Request.json, <stem>Response.json)
SPEC_NAMES = {
    KafkaApi.PRODUCE: "Produce",
    KafkaApi.FETCH: "Fetch",
    KafkaApi.LIST_OFFSETS: "ListOffsets",
    KafkaApi.METADATA: "Metadata",
    ApiKey.OFFSET_COMMIT: "OffsetCommit",
    ApiKey.OFFSET_FETCH: "OffsetFetch",
    KafkaApi.FIND_COORDINATOR: "FindCoordinator",
    ApiKey.JOIN_GROUP: "JoinGroup",
    ApiKey.HEARTBEAT: "Heartbeat",
    ApiKey.LEAVE_GROUP: "LeaveGroup",
    ApiKey.SYNC_GROUP: "SyncGroup",
    ApiKey.DESCRIBE_GROUPS: "DescribeGroups",
    ApiKey.LIST_GROUPS: "ListGroups",
    KafkaApi.API_VERSIONS: "ApiVersions",
    KafkaApi.CREATE_TOPICS: "CreateTopics",
    KafkaApi.DELETE_TOPICS: "DeleteTopics",
    KafkaApi.ELECT_LEADERS: "ElectLeaders",
    KafkaApi.DESCRIBE_CLUSTER: "DescribeCluster",
    KafkaApi.INIT_PRODUCER_ID: "InitProducerId",
    KafkaApi.OFFSET_FOR_LEADER_EPOCH: "OffsetForLeaderEpoch",
    KafkaApi.DESCRIBE_CONFIGS: "DescribeConfigs",
    KafkaApi.DESCRIBE_CLIENT_QUOTAS: "DescribeClientQuotas",
    KafkaApi.ALTER_CLIENT_QUOTAS: "AlterClientQuotas",
    ApiKey.DELETE_GROUPS: "DeleteGroups",
    ApiKey.ADD_PARTITIONS_TO_TXN: "AddPartitionsToTxn",
    ApiKey.ADD_OFFSETS_TO_TXN: "AddOffsetsToTxn",
    ApiKey.END_TXN: "EndTxn",
    ApiKey.TXN_OFFSET_COMMIT: "TxnOffsetCommit",
    ApiKey.DESCRIBE_TRANSACTIONS: "DescribeTransactions",
    ApiKey.LIST_TRANSACTIONS: "ListTransactions",
    KafkaApi.CREATE_PARTITIONS: "CreatePartitions",
    KafkaApi.DELETE_RECORDS: "DeleteRecords",
    KafkaApi.DESCRIBE_LOG_DIRS: "DescribeLogDirs",
    KafkaApi.DESCRIBE_PRODUCERS: "DescribeProducers",
    KafkaApi.ALTER_CONFIGS: "AlterConfigs",
    KafkaApi.INCREMENTAL_ALTER_CONFIGS: "IncrementalAlterConfigs",
    ApiKey.OFFSET_DELETE: "OffsetDelete",
}

# (min, max) served. Produce from v3 (v2 batches only), Fetch from v4 (isolation level).
SUPPORTED: dict[int, tuple[int, int]] = {
    KafkaApi.PRODUCE: (3, 8),
    KafkaApi.FETCH: (4, 11),
    # v6 is flexible, v7 carries MAX_TIMESTAMP (-3, KIP-734); v8+ (tiered storage) is not.
    KafkaApi.LIST_OFFSETS: (1, 7),
    KafkaApi.METADATA: (0, 8),
    KafkaApi.API_VERSIONS: (0, 3),
    # CreateTopics to v7: v5 (flexible) answers the counts and configs, v6 refuses a topic
    # over controller_mutation_rate (KIP-599), v7 gives its topic id.
    KafkaApi.CREATE_TOPICS: (0, 7),
    # librdkafka asks DeleteTopics up to v4 and ElectLeaders up to v2 (both flexible there),
    # kafka-python 3 up to the broker's maxima (DeleteTopics v6: topics named by id too),
    # aiokafka DeleteTopics up to v3. DescribeCluster is flexible from v0 (kafka-python 3's
    # describe_cluster and the Java admin ask for it; librdkafka's uses Metadata).
    KafkaApi.DELETE_TOPICS: (0, 6),
    KafkaApi.ELECT_LEADERS: (0, 2),
    KafkaApi.DESCRIBE_CLUSTER: (0, 1),
    # InitProducerId to v4: v3 carries the producer's own id and epoch (KIP-360, which
    # librdkafka needs to bump an epoch), v4 knows PRODUCER_FENCED (KIP-588).
    KafkaApi.INIT_PRODUCER_ID: (0, 4),
    KafkaApi.OFFSET_FOR_LEADER_EPOCH: (0, 3),
    KafkaApi.DESCRIBE_CONFIGS: (0, 4),
    KafkaApi.ALTER_CONFIGS: (0, 2),
    KafkaApi.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    KafkaApi.DELETE_RECORDS: (0, 2),
    KafkaApi.DESCRIBE_LOG_DIRS: (0, 4),
    KafkaApi.DESCRIBE_PRODUCERS: (0, 0),
    # librdkafka asks CreatePartitions up to v1, kafka-python and the Java admin up to v3.
    KafkaApi.CREATE_PARTITIONS: (0, 3),
    # Client quotas (KIP-546): every version (v1 is the flexible one).
    KafkaApi.DESCRIBE_CLIENT_QUOTAS: (0, 1),
    KafkaApi.ALTER_CLIENT_QUOTAS: (0, 1),
    # The classic group protocol, from v0: librdkafka turns its balanced consumer on only
    # when every group API's range reaches its feature table's minimum (JoinGroup, SyncGroup,
    # Heartbeat, LeaveGroup and FindCoordinator v0, OffsetCommit v1-2, OffsetFetch v1);
    # otherwise subscribe() waits forever without an error. The maxima are the last
    # non-flexible versions, the first that carry group.instance.id (static membership,
    # KIP-345: JoinGroup v5, SyncGroup/Heartbeat/LeaveGroup v3, OffsetCommit v7,
    # DescribeGroups v4): what librdkafka, kafka-python and aiokafka send when it is set.
    KafkaApi.FIND_COORDINATOR: (0, 2),
    ApiKey.JOIN_GROUP: (0, 5),
    ApiKey.SYNC_GROUP: (0, 3),
    ApiKey.HEARTBEAT: (0, 3),
    ApiKey.LEAVE_GROUP: (0, 3),
    ApiKey.OFFSET_COMMIT: (0, 7),
    # OffsetFetch to v7 (flexible from v6): v7's require_stable (KIP-447).
    ApiKey.OFFSET_FETCH: (0, 7),
    ApiKey.LIST_GROUPS: (0, 2),
    ApiKey.DESCRIBE_GROUPS: (0, 4),
    ApiKey.DELETE_GROUPS: (0, 1),
    # Transactions (KIP-98, KIP-447, KIP-664), to the last version before AddPartitionsToTxn
    # v4's broker-to-broker batching (KIP-890) and EndTxn/AddOffsetsToTxn v4's epoch bump
    # per transaction: TxnOffsetCommit v3 carries the consumer's generation (KIP-447).
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 3),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 3),
    ApiKey.END_TXN: (0, 3),
    ApiKey.TXN_OFFSET_COMMIT: (0, 3),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),
    ApiKey.OFFSET_DELETE: (0, 0),
}

_HEAD = struct.Struct(">hhih")  # api_key, api_version, correlation_id, client_id length
_CORRELATION = struct.Struct(">i")
_ERROR_ONLY = struct.Struct(">ih")  # correlation_id, error_code: the answer with no schema


class KafkaRequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


class KafkaUnsupported(ProtocolError):
    """An API or version the listener does not serve; the header is known, so it is
    answered (UNSUPPORTED_VERSION), not a closed connection."""

    def __init__(self, header: KafkaRequestHeader, message: str) -> None:
        super().__init__(message)
        self.header = header


def served(api_key: int, version: int) -> bool:
    span = SUPPORTED.get(api_key)
    return span is not None and span[0] <= version <= span[1]


def decode_request(payload: bytes) -> tuple[KafkaRequestHeader, dict]:
    """A frame's payload: the header and the body. ProtocolError when it cannot be read
    (close the connection, as Kafka does); KafkaUnsupported when it can be answered."""
    if len(payload) < _HEAD.size:
        raise KafkaDecodeError(f"request of {len(payload)} bytes is shorter than its header")
    api_key, version, correlation_id, client_len = _HEAD.unpack_from(payload)
    pos = _HEAD.size
    client_id = None
    if client_len >= 0:
        end = pos + client_len
        if end > len(payload):
            raise KafkaDecodeError("client_id cut off")
        try:
            client_id = payload[pos:end].decode()
        except UnicodeDecodeError:
            raise KafkaDecodeError("client_id is not UTF-8") from None
        pos = end
    header = KafkaRequestHeader(api_key, version, correlation_id, client_id)
    if not served(api_key, version):
        raise KafkaUnsupported(header, f"api {api_key} version {version} is not served")
    codec = message_codec(SPEC_NAMES[api_key] + "Request", version)
    if codec.flexible:  # header v2: skip the header's tagged fields
        try:
            count, pos = read_uvarint(payload, pos)
            for _ in range(count):
                _, pos = read_uvarint(payload, pos)
                size, pos = read_uvarint(payload, pos)
                pos += size
        except IndexError:
            raise KafkaDecodeError("request header's tagged fields cut off") from None
    return header, codec.decode(memoryview(payload)[pos:] if pos else payload)


def encode_response(header: KafkaRequestHeader, body: dict) -> bytes:
    """The whole frame answering ``header``."""
    api_key = header.api_key
    codec = message_codec(SPEC_NAMES[api_key] + "Response", header.api_version)
    out = bytearray(_CORRELATION.pack(header.correlation_id))
    if codec.flexible and api_key != KafkaApi.API_VERSIONS:
        out.append(0)  # header v1: no tagged fields
    codec.encode_into(out, body)
    return encode_frame_of(out)


def encode_request(header: KafkaRequestHeader, body: dict) -> bytes:
    """A request frame (tests and benchmarks speak to the listener with it)."""
    codec = message_codec(SPEC_NAMES[header.api_key] + "Request", header.api_version)
    client = None if header.client_id is None else header.client_id.encode()
    out = bytearray(
        _HEAD.pack(
            header.api_key,
            header.api_version,
            header.correlation_id,
            -1 if client is None else len(client),
        )
    )
    out += client or b""
    if codec.flexible:
        out.append(0)
    codec.encode_into(out, body)
    return encode_frame_of(out)


def decode_response(header: KafkaRequestHeader, payload: bytes) -> dict:
    """A response payload to the request ``header`` (tests and benchmarks)."""
    (correlation_id,) = _CORRELATION.unpack_from(payload)
    if correlation_id != header.correlation_id:
        raise ProtocolError(f"response for {correlation_id}, expected {header.correlation_id}")
    codec = message_codec(SPEC_NAMES[header.api_key] + "Response", header.api_version)
    pos = 4
    if codec.flexible and header.api_key != KafkaApi.API_VERSIONS:
        pos = 5
    return codec.decode(payload[pos:])


def api_versions_body(error: int = 0) -> dict:
    return {
        "error_code": error,
        "api_keys": [
            {"api_key": key, "min_version": low, "max_version": high}
            for key, (low, high) in sorted(SUPPORTED.items())
        ],
    }


def unsupported_response(header: KafkaRequestHeader) -> bytes:
    """UNSUPPORTED_VERSION in the only shape the asker can read.

    ApiVersions at a version above ours: a v0 body with our versions (KIP-511: the client
    retries at the highest we name). An API whose spec we carry: its response at the
    asked version with the top-level error code set. Anything else has no schema both
    sides know: the correlation id and the error code.
    """
    code = int(ErrorCode.UNSUPPORTED_VERSION)
    if header.api_key == KafkaApi.API_VERSIONS:
        body = message_codec("ApiVersionsResponse", 0).encode(api_versions_body(code))
        return encode_frame_of(_CORRELATION.pack(header.correlation_id), body)
    stem = SPEC_NAMES.get(header.api_key)
    if stem is not None:
        try:
            codec = message_codec(stem + "Response", header.api_version)
        except ValueError:  # a version the spec does not know either
            pass
        else:
            out = bytearray(_CORRELATION.pack(header.correlation_id))
            if codec.flexible:
                out.append(0)
            codec.encode_into(out, {"error_code": code})
            return encode_frame_of(out)
    return encode_frame_of(_ERROR_ONLY.pack(header.correlation_id, code))
