"""``controller_mutation_rate`` (KIP-599): partitions created or deleted per second, per
entity, on a token bucket (Kafka's ControllerMutationQuotaManager).

CreateTopics, CreatePartitions and DeleteTopics spend one token per partition they
create or delete. The bucket refills at the quota's rate and holds at most
``quota.window.num * quota.window.size.seconds`` seconds of it, so a client may burst
that much at once (Kafka's TokenBucket). A request gets one ``MutationQuota`` (Kafka's
Strict- or PermissiveControllerMutationQuota), asked topic by topic, in request order:

* strict (the versions that know THROTTLING_QUOTA_EXCEEDED: CreateTopics v6+,
  CreatePartitions v3+, DeleteTopics v5+): a topic is refused once the bucket is already
  below zero, and the answer's throttle time is how long until it is back at zero; a
  topic that finds the bucket at or above zero is accepted whatever it costs (so one
  big topic always goes through, and the next request waits for the debt to refill);
* permissive (older versions, which would not understand the error): every topic is
  accepted, and the answer is throttled once the bucket goes below zero.

As Kafka's, the throttle time is taken when the answer is sent, less the time the
request spent waiting for the controller since it was computed.
"""

from __future__ import annotations

from minibroker.broker.quota.entity import CONTROLLER_MUTATION_RATE, QuotaConfigs
from minibroker.broker.quota.manager import ClientQuotaManager, EntityUsage


class TokenBucket:
    """Kafka's TokenBucket stat: tokens refilled at the bound per second, capped at the
    burst (samples * window of it), spent by recording. Starts full."""

    __slots__ = ("burst_s", "last_ms", "tokens")

    def __init__(self, samples: int, window_ms: int, now_ms: int) -> None:
        self.burst_s = samples * window_ms / 1000.0
        self.last_ms = now_ms
        self.tokens: float | None = None  # None: full, whatever the bound turns out to be

    def measure(self, bound: float, now_ms: int) -> float:
        """The tokens left now (negative: in debt)."""
        burst = self.burst_s * bound
        tokens = burst if self.tokens is None else self.tokens
        tokens = min(burst, tokens + bound * (now_ms - self.last_ms) / 1000.0)
        self.tokens, self.last_ms = tokens, now_ms
        return tokens

    def record(self, value: float, bound: float, now_ms: int) -> float:
        """Spend ``value`` tokens; the tokens left."""
        tokens = self.measure(bound, now_ms) - value
        self.tokens = tokens
        return tokens


def debt_ms(tokens: float, bound: float) -> int:
    """Kafka's ControllerMutationQuotaManager.throttleTimeMs: the time that refills a
    bucket ``tokens`` below zero back to zero."""
    return round(-tokens / bound * 1000) if tokens < 0 else 0


class MutationQuota:
    """One request's view of its entity's bucket (strict or permissive, as above)."""

    __slots__ = ("_manager", "_recorded_ms", "_throttle_ms", "_usage", "strict")

    def __init__(self, manager: ControllerMutationQuotaManager, usage: EntityUsage, strict: bool):
        self._manager = manager
        self._usage = usage
        self.strict = strict
        self._throttle_ms = 0
        self._recorded_ms = 0

    def record(self, permits: int, now_ms: int) -> bool:
        """Spend ``permits`` for one topic; False: refused (strict, the bucket in debt)."""
        usage = self._usage
        bucket: TokenBucket = usage.rate  # type: ignore[assignment]
        usage.last_ms = now_ms
        if self.strict:
            throttle = debt_ms(bucket.measure(usage.bound, now_ms), usage.bound)
            if throttle:
                self._throttled(throttle, now_ms)
                return False
            bucket.record(permits, usage.bound, now_ms)
            return True
        throttle = debt_ms(bucket.record(permits, usage.bound, now_ms), usage.bound)
        if throttle:
            self._throttled(throttle, now_ms)
        return True

    def _throttled(self, throttle_ms: int, now_ms: int) -> None:
        self._throttle_ms, self._recorded_ms = throttle_ms, now_ms
        self._usage.throttle_ms_total += throttle_ms
        self._usage.throttle_count += 1

    def throttle_time_ms(self, now_ms: int) -> int:
        """The answer's throttle: the last one computed, less the time since."""
        return max(0, self._throttle_ms - (now_ms - self._recorded_ms))


class ControllerMutationQuotaManager(ClientQuotaManager):
    """The entities' buckets, resolved as every client quota is (broker/quota/entity.py)."""

    stat = TokenBucket

    def __init__(self, configs: QuotaConfigs, samples: int, window_ms: int) -> None:
        super().__init__(CONTROLLER_MUTATION_RATE, configs, samples, window_ms)

    def quota_for(
        self, user: str, client_id: str, strict: bool, now_ms: int
    ) -> MutationQuota | None:
        """A request's quota, or None when no entity bounds this connection's mutations."""
        usage = self.usage_of(user, client_id, now_ms)
        return None if usage is None else MutationQuota(self, usage, strict)

    def record(self, user: str, client_id: str, value: float, now_ms: int) -> int:
        """Kafka's recordAndGetThrottleTimeMs for this quota: strict on the bucket."""
        quota = self.quota_for(user, client_id, True, now_ms)
        if quota is None or quota.record(int(value), now_ms):
            return 0
        return quota.throttle_time_ms(now_ms)

    def _figures(self, usage: EntityUsage, now_ms: int) -> dict:
        """Kafka's ``tokens`` metric: read without refilling, so a scrape on another thread
        writes nothing."""
        return {"tokens": usage.rate.tokens}
