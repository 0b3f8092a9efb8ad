"""``controller_mutation_rate`` on the Kafka listener's CreateTopics, CreatePartitions and
DeleteTopics (KIP-599; the bucket and its strict/permissive rules: broker/quota/mutation.py).

Each topic of a request spends the partitions it would create or delete, in request
order, before the request goes to the controller: a topic the strict quota refuses is
answered THROTTLING_QUOTA_EXCEEDED and never sent, the others are. Kafka counts at the
controller after validation; we count on the broker the client asked (stock admin
clients send these requests to the controller that Metadata names) and leave out what
the metadata already shows will fail (a topic that exists, or does not, or would not
grow), so the partitions counted are those the controller would create or delete.
"""

from __future__ import annotations

from minibroker.broker.network.session import ConnectionSession
from minibroker.broker.quota import ClientQuotas
from minibroker.broker.quota.mutation import MutationQuota
from minibroker.broker.quota.service import with_throttle
from minibroker.protocol.errors import ErrorCode
from minibroker.protocol.kafka import KafkaApi, KafkaRequestHeader

# Kafka's ControllerApis: the first version of each API that answers THROTTLING_QUOTA_EXCEEDED
# (older ones are throttled permissively: accepted, then the answer delayed).
STRICT_SINCE = {KafkaApi.CREATE_TOPICS: 6, KafkaApi.CREATE_PARTITIONS: 3, KafkaApi.DELETE_TOPICS: 5}
THROTTLED = int(ErrorCode.THROTTLING_QUOTA_EXCEEDED)
THROTTLED_MESSAGE = "The throttling quota has been exceeded."  # Kafka's Errors message


class Mutations:
    """One request's controller mutation quota (none: nothing to count or throttle)."""

    __slots__ = ("quota", "quotas", "session")

    def __init__(
        self, quotas: ClientQuotas | None, header: KafkaRequestHeader, session: ConnectionSession
    ) -> None:
        self.quotas = quotas
        self.session = session
        strict = header.api_version >= STRICT_SINCE[header.api_key]
        self.quota: MutationQuota | None = (
            None if quotas is None else quotas.mutation_quota(session, header.client_id, strict)
        )

    def admit(self, permits: int) -> bool:
        """Spend one topic's ``permits`` partitions; False: refuse it (strict, in debt)."""
        quota = self.quota
        if quota is None or permits <= 0:
            return True
        return quota.record(permits, self.quotas.clock.now_ms())  # type: ignore[union-attr]

    def answer(self, out: dict) -> dict:
        """``out`` with the throttle the quota gives now; the connection muted for it."""
        if self.quota is None:
            return out
        throttle = self.quotas.mutation_throttle(self.session, self.quota)  # type: ignore[union-attr]
        return with_throttle(out, throttle) if throttle else out
