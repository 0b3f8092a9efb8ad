"""Quotas: windowed rates per client entity, the throttle time they give, and muting a
throttled connection until the shared timer ends the throttle (Kafka's ClientQuotaManager,
ThrottledChannel and ReplicationQuotaManager). See docs/quotas.md."""

from minibroker.broker.quota.entity import (
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    DEFAULT,
    PRODUCER_BYTE_RATE,
    QUOTA_KEYS,
    REQUEST_PERCENTAGE,
    QuotaConfigs,
    QuotaEntity,
    QuotaError,
    validate_quota,
)
from minibroker.broker.quota.manager import ClientQuotaManager
from minibroker.broker.quota.rate import SampledRate, throttle_time_ms
from minibroker.broker.quota.replication import (
    FOLLOWER_REPLICAS,
    LEADER_REPLICAS,
    ReplicationQuota,
    throttled_replicas_error,
)
from minibroker.broker.quota.service import ClientQuotas
from minibroker.broker.quota.throttle import ChannelThrottler

__all__ = [
    "CONSUMER_BYTE_RATE",
    "CONTROLLER_MUTATION_RATE",
    "DEFAULT",
    "FOLLOWER_REPLICAS",
    "LEADER_REPLICAS",
    "PRODUCER_BYTE_RATE",
    "QUOTA_KEYS",
    "REQUEST_PERCENTAGE",
    "ChannelThrottler",
    "ClientQuotaManager",
    "ClientQuotas",
    "QuotaConfigs",
    "QuotaEntity",
    "QuotaError",
    "ReplicationQuota",
    "SampledRate",
    "throttle_time_ms",
    "throttled_replicas_error",
    "validate_quota",
]
