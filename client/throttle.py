"""The throttle a broker gave this client (KIP-219): what Kafka's clients do with a
response's ``throttle_time_ms``.

The broker answers at once and stops reading the connection for that long; the client
also waits that long before its next request to that broker (a request sent meanwhile
would only sit in the muted socket), tells the application (librdkafka's ``throttle_cb``,
here the ``throttle_cb`` setting) and keeps metrics (Kafka's produce-throttle-time-avg
and -max, per broker here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ThrottleEvent:
    """librdkafka's ThrottleEvent: which broker held the client back, and for how long."""

    broker_name: str  # host:port
    throttle_time: float  # seconds, as confluent-kafka's

    def __str__(self) -> str:
        return f"{self.broker_name} throttled for {round(self.throttle_time * 1000)} ms"


class ThrottleMetrics:
    """Per broker address: how often and how long the client was throttled."""

    __slots__ = ("callback", "per_broker")

    def __init__(self, callback: Callable[[ThrottleEvent], None] | None = None) -> None:
        self.callback = callback
        self.per_broker: dict[str, list[int]] = {}  # address -> [count, total ms, max ms]

    def throttled(self, address: str, throttle_ms: int) -> None:
        """A response from ``address`` carried ``throttle_ms`` > 0."""
        entry = self.per_broker.get(address)
        if entry is None:
            entry = self.per_broker[address] = [0, 0, 0]
        entry[0] += 1
        entry[1] += throttle_ms
        entry[2] = max(entry[2], throttle_ms)
        if self.callback is not None:
            self.callback(ThrottleEvent(address, throttle_ms / 1000))

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Per broker: throttles, throttle-time-avg and -max in ms (Kafka's metric names)."""
        return {
            address: {
                "throttles": count,
                "throttle-time-avg": total / count,
                "throttle-time-max": peak,
            }
            for address, (count, total, peak) in self.per_broker.items()
        }
