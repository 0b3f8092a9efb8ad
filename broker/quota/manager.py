"""Kafka's ClientQuotaManager for one quota type: record an entity's usage, say how long
to hold it back.

A connection is counted in the rate of the entity that matches it (broker/quota/entity.py);
when recording makes that rate exceed the entity's bound, the answer is the throttle time
that brings it back (broker/quota/rate.py's ``throttle_time_ms``, over the same window the
rate was measured on). Nothing here knows of connections or timers: the caller mutes the
connection for that long (broker/quota/throttle.py).

Per request this is a dict lookup (the resolution is cached per (user, client id) until
the quota configuration changes) and a rate update: no work at all for a quota type
nobody configured.
"""

from __future__ import annotations

import heapq

from minibroker.broker.quota.entity import QuotaConfigs
from minibroker.broker.quota.rate import SampledRate, throttle_time_ms

# Entities kept before idle ones are first looked for, and (user, client id) resolutions
# cached: a default quota gives every new client id a rate of its own, so a client
# inventing ids must not grow the broker without bound (Kafka expires idle sensors after
# an hour). Past it the bound is twice the entities active within the rate's window.
MAX_ENTITIES = 4096


class EntityUsage:
    """One rate's sensors (Kafka's ClientSensors): usage and throttle time, by tags."""

    __slots__ = ("bound", "last_ms", "rate", "throttle_count", "throttle_ms_total")

    def __init__(self, rate: SampledRate, bound: float, now_ms: int) -> None:
        self.rate = rate
        self.bound = bound
        self.last_ms = now_ms
        self.throttle_ms_total = 0
        self.throttle_count = 0


class ClientQuotaManager:
    """Usage of one quota key (``producer_byte_rate``, ...) by every entity it binds."""

    stat: type = SampledRate  # what an entity's usage is measured with (a subclass's own)

    def __init__(self, key: str, configs: QuotaConfigs, samples: int, window_ms: int) -> None:
        self.key = key
        self.configs = configs
        self.samples = samples
        self.window_ms = window_ms
        self.usage: dict[tuple[str, str], EntityUsage] = {}
        # (user, client id) -> the usage it is counted in, or None: no bound applies.
        self._resolved: dict[tuple[str, str], EntityUsage | None] = {}
        self._version = -1
        # Entities (and cached resolutions) at which idle ones are next looked for. After a
        # look it doubles what is left: with 10,000 client ids all active, a fixed bound
        # scanned every entity for each new one (quadratic: seconds of loop at start, perf)
        # and cleared the cache every 4,096 requests, resolving nearly every request anew.
        self._scan_at = MAX_ENTITIES

    @property
    def enabled(self) -> bool:
        """Any entity has this quota: Kafka's quotasEnabled, checked before any work."""
        return self.configs.configured(self.key)

    def usage_of(self, user: str, client_id: str, now_ms: int) -> EntityUsage | None:
        """The usage (user, client_id) is counted in, or None: no entity bounds it."""
        if self._version != self.configs.version:
            self._resolved.clear()
            self._version = self.configs.version
        who = (user, client_id)
        try:
            return self._resolved[who]
        except KeyError:
            pass
        found = self.configs.resolve(self.key, user, client_id)
        usage = None
        if found is not None:
            bound, tags = found
            usage = self.usage.get(tags)
            if usage is None:
                if len(self.usage) >= self._scan_at:
                    self._drop_idle(now_ms)
                usage = self.usage[tags] = EntityUsage(
                    self.stat(self.samples, self.window_ms, now_ms), bound, now_ms
                )
            usage.bound = bound  # a changed quota applies to the rate kept so far
        if len(self._resolved) >= self._scan_at:
            self._resolved.clear()
        self._resolved[who] = usage
        return usage

    def _drop_idle(self, now_ms: int) -> None:
        """Forget entities with nothing recorded in the whole window: their rate is 0, so
        one made afresh measures the same (only their throttle counters go). The next look
        waits until as many entities again are kept: O(1) a new entity, amortized."""
        idle = self.samples * self.window_ms
        for tags in [t for t, u in self.usage.items() if now_ms - u.last_ms >= idle]:
            del self.usage[tags]
        self._resolved.clear()  # it may hold the usages just dropped
        self._scan_at = max(MAX_ENTITIES, 2 * len(self.usage))

    def record(self, user: str, client_id: str, value: float, now_ms: int) -> int:
        """Count ``value`` for the entity; the throttle time in ms (0: within its quota)."""
        usage = self.usage_of(user, client_id, now_ms)
        if usage is None:
            return 0
        rate = usage.rate
        usage.last_ms = now_ms
        rate.record(value, now_ms)
        observed, window = rate.measure(now_ms)
        throttle = throttle_time_ms(observed, usage.bound, window)
        if throttle:
            usage.throttle_ms_total += throttle
            usage.throttle_count += 1
        return throttle

    def stats(self, now_ms: int, top: int | None = None) -> list[dict]:
        """Per entity: its bound, observed rate and throttling so far; with ``top``, only the
        ``top`` entities given the most throttle time. A broker's stats answer is built on
        its loop: with 10,000 client ids under a default quota, every entity's rate was a
        115 ms stall of every connection (bench quotas --sockets 10000: answer lateness p99
        216 ms, the mid-run stats read). The Prometheus scrape asks for all of them, on its
        own thread."""
        usage = list(self.usage.items())
        if top is not None and len(usage) > top:
            usage = heapq.nlargest(top, usage, key=lambda entity: entity[1].throttle_ms_total)
        return [
            {
                "user": user,
                "client_id": client_id,
                "quota": entity.bound,
                **self._figures(entity, now_ms),
                "throttle_time_ms_total": entity.throttle_ms_total,
                "throttled": entity.throttle_count,
            }
            for (user, client_id), entity in usage
        ]

    def _figures(self, usage: EntityUsage, now_ms: int) -> dict:
        """What this quota type measures of an entity: its rate over the windows."""
        return {"rate": round(usage.rate.peek(now_ms), 1)}
