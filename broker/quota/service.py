"""The broker's client quotas: the configured values, one manager per quota type, and the
throttler, behind the two calls the request path makes (produce and fetch bytes).

Who a connection is: its user (Kafka's principal name; ``ANONYMOUS`` on a connection
that did not authenticate, as Kafka's PLAINTEXT listener) and the request's client id.
Cluster members (brokers authenticated by broker/network/cluster_auth.py) are never
client-throttled: their traffic is replication, which replication quotas govern.
"""

from __future__ import annotations

from minibroker.broker.common.clock import Clock
from minibroker.broker.network.session import ConnectionSession
from minibroker.broker.purgatory import Timer
from minibroker.broker.quota.entity import (
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaConfigs,
    QuotaEntity,
)
from minibroker.broker.quota.manager import ClientQuotaManager
from minibroker.broker.quota.throttle import ChannelThrottler

ANONYMOUS = "ANONYMOUS"


class ClientQuotas:
    """Kafka's QuotaManagers for client quotas, and the throttled-channel reaper."""

    def __init__(self, timer: Timer, clock: Clock, *, samples: int, window_ms: int) -> None:
        self.configs = QuotaConfigs()
        self.clock = clock
        self.produce = ClientQuotaManager(PRODUCER_BYTE_RATE, self.configs, samples, window_ms)
        self.fetch = ClientQuotaManager(CONSUMER_BYTE_RATE, self.configs, samples, window_ms)
        self.request = ClientQuotaManager(REQUEST_PERCENTAGE, self.configs, samples, window_ms)
        self.mutation = ClientQuotaManager(
            CONTROLLER_MUTATION_RATE, self.configs, samples, window_ms
        )
        self.throttler = ChannelThrottler(timer)

    def apply(self, entity: QuotaEntity, key: str, value: float | None) -> None:
        """A committed ClientQuotaRecord: set (or remove, None) one value on this broker."""
        self.configs.set(entity, key, value)

    def record(
        self,
        manager: ClientQuotaManager,
        session: ConnectionSession,
        client_id: str | None,
        value: float,
    ) -> int:
        """Count ``value`` for the connection's entity and mute it for the throttle time
        that gives (returned: the answer's ``throttle_time_ms``)."""
        if session.principal is not None or not manager.enabled:
            return 0
        throttle = manager.record(ANONYMOUS, client_id or "", value, self.clock.now_ms())
        if throttle:
            self.throttler.throttle(session, throttle)
        return throttle

    def stats(self) -> dict:
        now_ms = self.clock.now_ms()
        return {
            "throttler": self.throttler.stats(),
            **{
                m.key: m.stats(now_ms)
                for m in (self.produce, self.fetch, self.request, self.mutation)
                if m.usage
            },
        }
