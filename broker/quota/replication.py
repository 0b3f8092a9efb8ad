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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

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

    def __init__(
        self,
        side_key: str,
        broker_id: int,
        bound: int,
        *,
        samples: int,
        window_ms: int,
        now_ms: Callable[[], int],
    ) -> None:
        self.side_key = side_key  # the topic config listing this side's throttled replicas
        self.broker_id = broker_id
        self.bound = bound
        self.now_ms = now_ms
        self.rate = SampledRate(samples, window_ms, now_ms())
        self._parsed: dict[str, frozenset[int] | None] = {}  # config text -> partitions
        self.throttled_ms = 0  # time replication waited here, in all (stats)

    @property
    def enabled(self) -> bool:
        return self.bound < NO_LIMIT

    def throttles(self, topic_configs: Mapping[str, str] | None, partition: int) -> bool:
        """Whether this side throttles ``partition`` of a topic with ``topic_configs``."""
        if not topic_configs:
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
    broker_id: int, config: Mapping, now_ms: Callable[[], int]
) -> tuple[ReplicationQuota | None, ReplicationQuota | None]:
    """The leader and follower quotas the broker config asks for (None: no limit, so the
    fetch paths pay nothing)."""
    samples = config["replication.quota.window.num"]
    window_ms = config["replication.quota.window.size.seconds"] * 1000
    out = []
    for side, key in ((LEADER_REPLICAS, "leader"), (FOLLOWER_REPLICAS, "follower")):
        bound = config[f"{key}.replication.throttled.rate"]
        out.append(
            None
            if bound >= NO_LIMIT
            else ReplicationQuota(
                side, broker_id, bound, samples=samples, window_ms=window_ms, now_ms=now_ms
            )
        )
    return out[0], out[1]
