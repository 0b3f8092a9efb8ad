"""Kafka's authorized-operations bit fields (KIP-430), as Metadata, DescribeCluster and
DescribeGroups answer them when asked (``include_*_authorized_operations``).

minibroker has no ACLs, so every operation a resource type supports is allowed: with no
authorizer Kafka answers exactly that set (AclEntry.supportedOperations). Bit ``n`` is
AclOperation code ``n``. Not asked, the answer is the spec's default, INT32_MIN.
"""

from __future__ import annotations

# org.apache.kafka.common.acl.AclOperation codes (wire values).
READ = 3
WRITE = 4
CREATE = 5
DELETE = 6
ALTER = 7
DESCRIBE = 8
CLUSTER_ACTION = 9
DESCRIBE_CONFIGS = 10
ALTER_CONFIGS = 11
IDEMPOTENT_WRITE = 12

NOT_REQUESTED = -(2**31)  # the spec's default: "authorized operations were not requested"


def _bits(*operations: int) -> int:
    return sum(1 << op for op in operations)


TOPIC_OPERATIONS = _bits(
    READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS
)
CLUSTER_OPERATIONS = _bits(
    CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER, DESCRIBE
)
GROUP_OPERATIONS = _bits(READ, DESCRIBE, DELETE)


def authorized(operations: int, requested: bool) -> int:
    """What to answer: every supported operation if the client asked, else NOT_REQUESTED."""
    return operations if requested else NOT_REQUESTED
