"""Kafka's error codes (same names, same numbers) and the exceptions named after them.

Both the broker and the client raise these, so a failure reads the same on
both sides of the wire: ``NotEnoughReplicas`` is error code 19 everywhere.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    STALE_CONTROLLER_EPOCH = 11
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    # consumer groups (Kafka's classic group protocol)
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    NOT_CONTROLLER = 41
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_REQUEST = 42
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    TRANSACTION_COORDINATOR_FENCED = 52
    INVALID_PRODUCER_ID_MAPPING = 49
    UNKNOWN_PRODUCER_ID = 59
    PRODUCER_FENCED = 90
    # transactions (KIP-98, KIP-447)
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    OPERATION_NOT_ATTEMPTED = 55
    UNSTABLE_OFFSET_COMMIT = 88
    TRANSACTIONAL_ID_NOT_FOUND = 105
    KAFKA_STORAGE_ERROR = 56
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    UNSUPPORTED_COMPRESSION_TYPE = 76
    SASL_AUTHENTICATION_FAILED = 58
    TOPIC_DELETION_DISABLED = 73
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    OFFSET_NOT_AVAILABLE = 78
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    INVALID_CONFIG = 40
    INVALID_RECORD = 87
    THROTTLING_QUOTA_EXCEEDED = 89
    NON_EMPTY_GROUP = 68
    GROUP_SUBSCRIBED_TO_TOPIC = 86  # OffsetDelete of a topic the group consumes
    GROUP_ID_NOT_FOUND = 69
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82  # KIP-345: another member holds this group.instance.id now
    # incremental fetch sessions (KIP-227), topic ids (KIP-516), DescribeCluster (KIP-919)
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    UNKNOWN_TOPIC_ID = 100
    UNSUPPORTED_ENDPOINT_TYPE = 115

    @property
    def retriable(self) -> bool:
        return self in RETRIABLE

    @classmethod
    def parse(cls, value: int) -> ErrorCode:
        """Map a wire value to a code; codes we do not know read as UNKNOWN_SERVER_ERROR."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN_SERVER_ERROR


# Kafka's RetriableException subclasses: a client may retry these after a
# metadata refresh and a backoff.
RETRIABLE = frozenset(
    {
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.BROKER_NOT_AVAILABLE,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.NOT_CONTROLLER,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.OFFSET_NOT_AVAILABLE,
        ErrorCode.THROTTLING_QUOTA_EXCEEDED,
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
        ErrorCode.INVALID_FETCH_SESSION_EPOCH,
        # Kafka's InvalidMetadataException subclasses (the metadata may change).
        ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
        ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
        ErrorCode.ELECTION_NOT_NEEDED,
        ErrorCode.UNKNOWN_TOPIC_ID,
        # A commit or abort is completing: retry InitProducerId / AddPartitionsToTxn.
        ErrorCode.CONCURRENT_TRANSACTIONS,
        ErrorCode.UNSTABLE_OFFSET_COMMIT,
    }
)


class ProtocolError(Exception):
    """Bytes that cannot be decoded: the only exception the decoders ever raise."""


class FrameTooLarge(ProtocolError):
    """A frame header announced more bytes than the configured maximum."""


class KafkaError(Exception):
    """Base of the exceptions named after Kafka error codes."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.code.name)
        self.message = message

    @property
    def retriable(self) -> bool:
        return self.code.retriable

    def __str__(self) -> str:
        if self.message and self.message != self.code.name:
            return f"{self.code.name}: {self.message}"
        return self.code.name


def _class_name(code: ErrorCode) -> str:
    name = "".join(part.capitalize() for part in code.name.split("_"))
    # InvalidTopicException -> InvalidTopic, but NetworkException keeps Kafka's full name.
    short = name.removesuffix("Exception")
    return short if any(c.isupper() for c in short[1:]) else name


# The decoders' verdicts on a well-framed request are error codes too: a body that does
# not match its API's schema is InvalidRequest, an unknown key or version is
# UnsupportedVersion. One class each, so they are also ProtocolErrors (what a decoder
# raises) and a server answers with ``exc.code`` and ``exc.message``.
_DECODER_VERDICTS = frozenset({ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_VERSION})

_BY_CODE: dict[ErrorCode, type[KafkaError]] = {}
for _code in ErrorCode:
    if _code is ErrorCode.NONE:
        continue
    _bases = (KafkaError, ProtocolError) if _code in _DECODER_VERDICTS else (KafkaError,)
    _cls = type(_class_name(_code), _bases, {"code": _code, "__module__": __name__})
    _BY_CODE[_code] = _cls
    globals()[_cls.__name__] = _cls


def error_class(code: int | ErrorCode) -> type[KafkaError]:
    """The exception class for a wire error code."""
    return _BY_CODE[ErrorCode.parse(code)]


def raise_for(code: int, message: str = "") -> None:
    """Raise the named exception unless ``code`` is NONE."""
    if code != 0:
        raise error_class(code)(message)


# Names for static analysis and `from protocol.errors import RequestTimedOut`.
UnknownServerError = _BY_CODE[ErrorCode.UNKNOWN_SERVER_ERROR]
OffsetOutOfRange = _BY_CODE[ErrorCode.OFFSET_OUT_OF_RANGE]
CorruptMessage = _BY_CODE[ErrorCode.CORRUPT_MESSAGE]
UnknownTopicOrPartition = _BY_CODE[ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
LeaderNotAvailable = _BY_CODE[ErrorCode.LEADER_NOT_AVAILABLE]
NotLeaderOrFollower = _BY_CODE[ErrorCode.NOT_LEADER_OR_FOLLOWER]
RequestTimedOut = _BY_CODE[ErrorCode.REQUEST_TIMED_OUT]
BrokerNotAvailable = _BY_CODE[ErrorCode.BROKER_NOT_AVAILABLE]
MessageTooLarge = _BY_CODE[ErrorCode.MESSAGE_TOO_LARGE]
NetworkException = _BY_CODE[ErrorCode.NETWORK_EXCEPTION]
InvalidTopic = _BY_CODE[ErrorCode.INVALID_TOPIC_EXCEPTION]
NotEnoughReplicas = _BY_CODE[ErrorCode.NOT_ENOUGH_REPLICAS]
NotEnoughReplicasAfterAppend = _BY_CODE[ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND]
InvalidRequiredAcks = _BY_CODE[ErrorCode.INVALID_REQUIRED_ACKS]
UnsupportedVersion = _BY_CODE[ErrorCode.UNSUPPORTED_VERSION]
TopicAlreadyExists = _BY_CODE[ErrorCode.TOPIC_ALREADY_EXISTS]
TopicDeletionDisabled = _BY_CODE[ErrorCode.TOPIC_DELETION_DISABLED]
InvalidPartitions = _BY_CODE[ErrorCode.INVALID_PARTITIONS]
InvalidReplicationFactor = _BY_CODE[ErrorCode.INVALID_REPLICATION_FACTOR]
InvalidReplicaAssignment = _BY_CODE[ErrorCode.INVALID_REPLICA_ASSIGNMENT]
PolicyViolation = _BY_CODE[ErrorCode.POLICY_VIOLATION]
InvalidRequest = _BY_CODE[ErrorCode.INVALID_REQUEST]
InvalidConfig = _BY_CODE[ErrorCode.INVALID_CONFIG]
KafkaStorageError = _BY_CODE[ErrorCode.KAFKA_STORAGE_ERROR]
FencedLeaderEpoch = _BY_CODE[ErrorCode.FENCED_LEADER_EPOCH]
InvalidRecord = _BY_CODE[ErrorCode.INVALID_RECORD]
InvalidTimestamp = _BY_CODE[ErrorCode.INVALID_TIMESTAMP]
ClusterAuthorizationFailed = _BY_CODE[ErrorCode.CLUSTER_AUTHORIZATION_FAILED]
OutOfOrderSequenceNumber = _BY_CODE[ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER]
InvalidProducerEpoch = _BY_CODE[ErrorCode.INVALID_PRODUCER_EPOCH]
InvalidTxnState = _BY_CODE[ErrorCode.INVALID_TXN_STATE]
UnstableOffsetCommit = _BY_CODE[ErrorCode.UNSTABLE_OFFSET_COMMIT]
TransactionalIdNotFound = _BY_CODE[ErrorCode.TRANSACTIONAL_ID_NOT_FOUND]
TransactionCoordinatorFenced = _BY_CODE[ErrorCode.TRANSACTION_COORDINATOR_FENCED]
SaslAuthenticationFailed = _BY_CODE[ErrorCode.SASL_AUTHENTICATION_FAILED]
CoordinatorLoadInProgress = _BY_CODE[ErrorCode.COORDINATOR_LOAD_IN_PROGRESS]
CoordinatorNotAvailable = _BY_CODE[ErrorCode.COORDINATOR_NOT_AVAILABLE]
NotCoordinator = _BY_CODE[ErrorCode.NOT_COORDINATOR]
IllegalGeneration = _BY_CODE[ErrorCode.ILLEGAL_GENERATION]
InconsistentGroupProtocol = _BY_CODE[ErrorCode.INCONSISTENT_GROUP_PROTOCOL]
InvalidGroupId = _BY_CODE[ErrorCode.INVALID_GROUP_ID]
UnknownMemberId = _BY_CODE[ErrorCode.UNKNOWN_MEMBER_ID]
InvalidSessionTimeout = _BY_CODE[ErrorCode.INVALID_SESSION_TIMEOUT]
RebalanceInProgress = _BY_CODE[ErrorCode.REBALANCE_IN_PROGRESS]
NonEmptyGroup = _BY_CODE[ErrorCode.NON_EMPTY_GROUP]
GroupIdNotFound = _BY_CODE[ErrorCode.GROUP_ID_NOT_FOUND]
MemberIdRequired = _BY_CODE[ErrorCode.MEMBER_ID_REQUIRED]
FencedInstanceId = _BY_CODE[ErrorCode.FENCED_INSTANCE_ID]
PreferredLeaderNotAvailable = _BY_CODE[ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE]
EligibleLeadersNotAvailable = _BY_CODE[ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE]
ElectionNotNeeded = _BY_CODE[ErrorCode.ELECTION_NOT_NEEDED]
FetchSessionIdNotFound = _BY_CODE[ErrorCode.FETCH_SESSION_ID_NOT_FOUND]
InvalidFetchSessionEpoch = _BY_CODE[ErrorCode.INVALID_FETCH_SESSION_EPOCH]
UnknownTopicId = _BY_CODE[ErrorCode.UNKNOWN_TOPIC_ID]
UnsupportedEndpointType = _BY_CODE[ErrorCode.UNSUPPORTED_ENDPOINT_TYPE]
