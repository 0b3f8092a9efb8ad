"""The broker's client quotas: the configured values, one manager per quota type, and the
throttler, behind the two calls the request path makes (produce and fetch bytes).

Who a connection is: its user (Kafka's principal name; ``ANONYMOUS`` on a connection
that did not authenticate, as Kafka's PLAINTEXT listener) and the request's client id.
Cluster members (brokers authenticated by broker/network/cluster_auth.py) are never
client-throttled: their traffic is replication, which replication quotas govern.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any

from minibroker.broker.common.clock import Clock
from minibroker.broker.network.pending import then
from minibroker.broker.network.session import ConnectionSession
from minibroker.broker.purgatory import Timer
from minibroker.broker.quota.entity import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    USER,
    QuotaConfigs,
    QuotaEntity,
)
from minibroker.broker.quota.manager import ClientQuotaManager
from minibroker.broker.quota.mutation import ControllerMutationQuotaManager, MutationQuota
from minibroker.broker.quota.throttle import ChannelThrottler
from minibroker.protocol.errors import ErrorCode

ANONYMOUS = "ANONYMOUS"
# Entities per quota type a stats answer lists (the rest are counted, and all are on the
# Prometheus endpoint): a table of 10,000 client ids is read by no one.
STATS_TOP_ENTITIES = 50


class ClientQuotas:
    """Kafka's QuotaManagers for client quotas, and the throttled-channel reaper."""

    def __init__(self, timer: Timer, clock: Clock, *, samples: int, window_ms: int) -> None:
        self.configs = QuotaConfigs()
        self.clock = clock
        self.produce = ClientQuotaManager(PRODUCER_BYTE_RATE, self.configs, samples, window_ms)
        self.fetch = ClientQuotaManager(CONSUMER_BYTE_RATE, self.configs, samples, window_ms)
        self.request = ClientQuotaManager(REQUEST_PERCENTAGE, self.configs, samples, window_ms)
        self.mutation = ControllerMutationQuotaManager(self.configs, samples, window_ms)
        self.throttler = ChannelThrottler(timer)

    def apply(self, entity: QuotaEntity, key: str, value: float | None) -> None:
        """A committed ClientQuotaRecord: set (or remove, None) one value on this broker."""
        self.configs.set(entity, key, value)

    def sync(self, client_quotas: dict) -> None:
        """Take the committed metadata's client quotas (``ClusterMetadata.client_quotas``):
        every broker applies the same ClientQuotaRecords, so every broker throttles alike."""
        wanted = {QuotaEntity.of(dict(entity)): values for entity, values in client_quotas.items()}
        configs = self.configs
        for entity, values in list(configs.by_entity.items()):
            for key in list(values):
                if key not in wanted.get(entity, {}):
                    configs.set(entity, key, None)
        for entity, values in wanted.items():
            have = configs.by_entity.get(entity, {})
            for key, value in values.items():
                if have.get(key) != value:
                    configs.set(entity, key, value)

    def describe(self, body: dict) -> dict:
        """DescribeClientQuotas, answered from this broker's applied quotas (as Kafka's
        brokers answer it from their metadata cache)."""
        components = []
        for c in body["components"]:
            kind, match, name = c["entity_type"], c["match_type"], c["match"]
            if kind not in (USER, CLIENT_ID):
                return _describe_error(f"unsupported quota entity type {kind}")
            if match == 0 and name is None:
                return _describe_error(f"a name to match for {kind} (match_type 0)")
            components.append((kind, match, name))
        if len({c[0] for c in components}) != len(components):
            return _describe_error("an entity type appears twice in the filter")
        found = self.configs.describe(components, body["strict"])
        return {
            "error_code": 0,
            "error_message": None,
            "entries": [
                {
                    "entity": [
                        {"entity_type": kind, "entity_name": name}
                        for kind, name in entity.parts().items()
                    ],
                    "values": {k: float(v) for k, v in values.items()},
                }
                for entity, values in found
            ],
        }

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

    def mutation_quota(
        self, session: ConnectionSession, client_id: str | None, strict: bool
    ) -> MutationQuota | None:
        """A CreateTopics/CreatePartitions/DeleteTopics request's controller_mutation_rate
        quota (strict: the version answers THROTTLING_QUOTA_EXCEEDED), or None: unbounded."""
        if session.principal is not None or not self.mutation.enabled:
            return None
        return self.mutation.quota_for(ANONYMOUS, client_id or "", strict, self.clock.now_ms())

    def mutation_throttle(self, session: ConnectionSession, quota: MutationQuota | None) -> int:
        """When the answer goes out: its throttle time, for which the connection is muted."""
        if quota is None:
            return 0
        throttle = quota.throttle_time_ms(self.clock.now_ms())
        if throttle:
            self.throttler.throttle(session, throttle)
        return throttle

    def timed(
        self,
        handle: Callable[[], Any],
        session: ConnectionSession,
        client_id: str | None,
        carries_throttle: bool,
    ) -> Any:
        """``handle()``'s answer, its time counted for request_percentage: the time handling
        took counts against the client's share of the loop (Kafka: of a request handler
        thread), in percent-seconds; over it, the connection is muted like any throttled one,
        and (``carries_throttle``: the answer has the field) its ``throttle_time_ms`` is the
        larger of this throttle and the one the API gave (Kafka's KafkaApis). Only the time
        spent now is counted: a parked request's wait costs the loop nothing."""
        started = perf_counter()
        result = handle()
        used = (perf_counter() - started) * 100
        throttle = self.record(self.request, session, client_id, used)
        if not throttle or not carries_throttle or result is None:
            return result
        return then(result, lambda answer: with_throttle(answer, throttle))

    def managers(self) -> tuple[ClientQuotaManager, ...]:
        return (self.produce, self.fetch, self.request, self.mutation)

    def stats(self, top: int = STATS_TOP_ENTITIES) -> dict:
        """The throttler's figures, how many entities each quota type counts, and the
        ``top`` of them by throttle time given."""
        now_ms = self.clock.now_ms()
        used = [m for m in self.managers() if m.usage]
        return {
            "throttler": self.throttler.stats(),
            "entities": {m.key: len(m.usage) for m in used},
            **{m.key: m.stats(now_ms, top) for m in used},
        }


def with_throttle(answer: dict, throttle_ms: int) -> dict:
    """``answer`` carrying at least ``throttle_ms``: the larger of two quotas' throttles is
    the one the client waits out (they run at once). A bare error answer (no schema
    fields) is left as it is."""
    if set(answer) <= {"error_code", "error_message"}:
        return answer
    if (answer.get("throttle_time_ms") or 0) >= throttle_ms:
        return answer
    return {**answer, "throttle_time_ms": throttle_ms}


def _describe_error(why: str) -> dict:
    return {"error_code": int(ErrorCode.INVALID_REQUEST), "error_message": why, "entries": None}
