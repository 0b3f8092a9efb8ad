"""Replication quotas (Kafka's ReplicationQuotaManager): a broker-wide byte rate for the
replicas a topic names as throttled, on the leader's answers and on the follower's fetches.

``leader.replication.throttled.rate`` bounds what this broker, as leader, sends to
followers of the partitions listed in the topic's ``leader.replication.throttled.replicas``
(entries ``partition:broker`` naming this broker, or ``*``); once the rate is over the
bound, those partitions' records are left out of follower answers. The follower side is
the mirror: ``follower.replication.throttled.rate`` over the partitions of
``follower.replication.throttled.replicas`` naming this broker, whose fetches wait while
the rate is over. A replica held back this way falls behind and leaves the ISR after
``replica.lag.time.max.ms``, like any slow follower: that is the point (Kafka's use:
keep a reassignment from starving clients; ours also: make replication slow on purpose).

Both rates are dynamic broker configs (Kafka's DynamicConfig.Broker): ``minibroker configs
alter --entity-type brokers`` sets or deletes them live, and each side reads its bound from
the broker's DynamicBrokerConfig at every check, so a change applies at the next fetch
(Kafka's ReplicationQuotaManager.updateQuota, without the listener: the config is the
registry). The measured rate is kept across a change, as Kafka's sensor is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from minibroker.broker.common.topic_config import throttled_replicas_error
from minibroker.broker.quota.rate import SampledRate, throttle_time_ms

LEADER_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS = "follower.replication.throttled.replicas"
NO_LIMIT = 2**63 - 1  # Kafka's default rate: Long.MAX_VALUE, no throttle
__all__ = ["ReplicationQuota", "throttled_partitions", "throttled_replicas_error"]


def throttled_partitions(value: str, broker_id: int) -> frozenset[int] | None:
    """The partitions ``value`` throttles on ``broker_id``; None means every one (``*``)."""
    text = str(value).replace(" ", "")
    if text == "*":
        return None
    out = set()
    for item in filter(None, text.split(",")):
        partition, _, broker = item.partition(":")
        if int(broker) == broker_id:
            out.add(int(partition))
    return frozenset(out)


class ReplicationQuota:
    """One side's rate (leader or follower) and which partitions it applies to."""

    __slots__ = (
        "_parsed",
        "broker_id",
        "config",
        "now_ms",
        "rate",
        "rate_key",
        "side_key",
        "throttled_ms",
    )

    def __init__(
        self,
        side_key: str,
        rate_key: str,
        broker_id: int,
        config: Mapping[str, Any],
        *,
        now_ms: Callable[[], int],
    ) -> None:
        self.side_key = side_key  # the topic config listing this side's throttled replicas
        self.rate_key = rate_key  # the broker config bounding this side's rate
        self.broker_id = broker_id
        self.config = config  # the broker's DynamicBrokerConfig: the bound, read live
        self.now_ms = now_ms
        samples = config["replication.quota.window.num"]
        window_ms = config["replication.quota.window.size.seconds"] * 1000
        self.rate = SampledRate(samples, window_ms, now_ms())
        self._parsed: dict[str, frozenset[int] | None] = {}  # config text -> partitions
        self.throttled_ms = 0  # time replication waited here, in all (stats)

    @property
    def bound(self) -> int:
        """Bytes/s: the rate config's effective value now (dynamic layers included)."""
        return self.config[self.rate_key]

    @property
    def enabled(self) -> bool:
        """A bound is set: without one the fetch paths neither check nor record."""
        return self.config[self.rate_key] < NO_LIMIT

    def throttles(self, topic_configs: Mapping[str, str] | None, partition: int) -> bool:
        """Whether this side throttles ``partition`` of a topic with ``topic_configs``
        (never while no rate is set: then nothing is checked or recorded)."""
        if not topic_configs or self.config[self.rate_key] >= NO_LIMIT:
            return False
        text = topic_configs.get(self.side_key)
        if not text:
            return False
        parsed = self._parsed.get(text, False)
        if parsed is False:
            if len(self._parsed) > 1024:
                self._parsed.clear()
            parsed = self._parsed[text] = throttled_partitions(text, self.broker_id)
        return parsed is None or partition in parsed

    def exceeded(self) -> bool:
        """Kafka's isQuotaExceeded: the rate so far is over the bound."""
        return self.rate.rate(self.now_ms()) > self.bound

    def wait_ms(self) -> int:
        """How long until the rate is back at the bound if nothing more is recorded."""
        observed, window = self.rate.measure(self.now_ms())
        return throttle_time_ms(observed, self.bound, window)

    def record(self, nbytes: int) -> None:
        if nbytes:
            self.rate.record(nbytes, self.now_ms())

    def stats(self) -> dict:
        return {
            "bound": self.bound,
            "rate": round(self.rate.peek(self.now_ms()), 1),
            "throttled_ms": self.throttled_ms,
        }


def replication_quotas(
    broker_id: int, config: Mapping[str, Any], now_ms: Callable[[], int]
) -> tuple[ReplicationQuota, ReplicationQuota]:
    """The leader's and the follower's quota, bound by the (dynamic) broker config: made
    whether or not a rate is set now, since one may be set at any time."""
    leader, follower = (
        ReplicationQuota(
            side, f"{key}.replication.throttled.rate", broker_id, config, now_ms=now_ms
        )
        for side, key in ((LEADER_REPLICAS, "leader"), (FOLLOWER_REPLICAS, "follower"))
    )
    return leader, follower
