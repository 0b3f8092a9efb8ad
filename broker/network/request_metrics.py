"""Kafka's RequestMetrics: per API, how many requests and where their time went.

Phases, as Kafka splits a request's life (RequestChannel.updateRequestMetrics):

- queue:  from the bytes arriving to the handler starting (requests behind others read
  in the same burst wait here);
- local:  the handler itself, synchronously on the trio thread;
- remote: parked in a purgatory (acks=all produce, long-poll fetch) until completion;
- total:  all three, up to the answer being handed to the socket.

Handing the answer to the socket is part of ``total`` (an answer the socket takes at
once costs microseconds; one that queues behind a slow reader is counted up to the
queueing, not to its last byte leaving).
"""

from __future__ import annotations

from minibroker.broker.common.histogram import Histogram
from minibroker.protocol import api_name

PHASES = ("queue", "local", "remote", "total")


class ApiMetrics:
    __slots__ = ("local", "queue", "remote", "total")

    def __init__(self) -> None:
        self.queue = Histogram()
        self.local = Histogram()
        self.remote = Histogram()
        self.total = Histogram()


class RequestMetrics:
    def __init__(self) -> None:
        self.apis: dict[int, ApiMetrics] = {}

    def record(
        self, api_key: int, queue_s: float, local_s: float, remote_s: float, total_s: float
    ) -> None:
        m = self.apis.get(api_key)
        if m is None:
            m = self.apis[api_key] = ApiMetrics()
        m.queue.observe(queue_s)
        m.local.observe(local_s)
        m.remote.observe(remote_s)
        m.total.observe(total_s)

    def snapshot(self) -> dict[str, dict]:
        """Per API name: request count and each phase's summary (stats, the CLI)."""
        out = {}
        for key, m in sorted(list(self.apis.items())):
            out[api_name(key)] = {
                "requests": m.total.count,
                **{phase: getattr(m, phase).summary() for phase in PHASES},
            }
        return out
