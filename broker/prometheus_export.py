"""The broker's figures as a Prometheus endpoint (``metrics.port``), via prometheus-client.

A custom collector reads the broker's own counters at scrape time, so the request path
pays nothing for Prometheus (its metric objects take a lock per observation). The scrape
runs on prometheus-client's HTTP thread while the trio thread keeps changing those
counters: every collection iterates over copies (``list(...)``, one C call each under
the GIL), so a scrape sees a slightly stale but never a torn structure.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import start_http_server

from minibroker.broker.common.config import ConfigError
from minibroker.broker.common.histogram import Histogram
from minibroker.broker.network.request_metrics import PHASES, RequestMetrics
from minibroker.broker.network.socket_server import ConnectionHandler
from minibroker.broker.quota import ClientQuotas
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.protocol import api_name

_PARTITION_GAUGES = (
    ("high_watermark", "The partition's high watermark on this replica."),
    ("log_end_offset", "The partition's log end offset on this replica."),
    ("log_start_offset", "The partition's log start offset on this replica."),
    ("isr_size", "Replicas in the ISR."),
    ("replicas", "Replicas assigned."),
    ("leader", "1 if this broker leads the partition."),
    ("under_min_isr", "1 if the leader's ISR is below min.insync.replicas."),
    ("producers", "Idempotent producers whose sequences this replica tracks."),
    ("log_size_bytes", "Bytes of the partition's segments on this broker."),
)


def _histogram(family: HistogramMetricFamily, labels: list[str], h: Histogram) -> None:
    family.add_metric(labels, buckets=h.cumulative(), sum_value=h.sum)


class BrokerCollector:
    """Reads the broker's request metrics, purgatories, connections and partitions."""

    def __init__(
        self,
        broker_id: int,
        request_metrics: RequestMetrics,
        replica_manager: ReplicaManager,
        connections: ConnectionHandler,
        quotas: ClientQuotas | None = None,
    ) -> None:
        self.broker = str(broker_id)
        self.request_metrics = request_metrics
        self.replica_manager = replica_manager
        self.connections = connections
        self.quotas = quotas

    def collect(self) -> Iterator[Any]:
        yield from self._requests()
        yield from self._purgatories()
        yield from self._connections()
        yield from self._partitions()
        if self.quotas is not None:
            yield from self._quotas(self.quotas)

    def _requests(self) -> Iterator[Any]:
        requests = CounterMetricFamily(
            "minibroker_requests", "Requests answered, per API.", labels=["broker", "api"]
        )
        times = HistogramMetricFamily(
            "minibroker_request_time_seconds",
            "Request time per API and phase (queue, local, remote = purgatory, total).",
            labels=["broker", "api", "phase"],
        )
        for key, m in list(self.request_metrics.apis.items()):
            name = api_name(key)
            requests.add_metric([self.broker, name], m.total.count)
            for phase in PHASES:
                _histogram(times, [self.broker, name, phase], getattr(m, phase))
        yield requests
        yield times

    def _purgatories(self) -> Iterator[Any]:
        pending = GaugeMetricFamily(
            "minibroker_purgatory_pending", "Operations parked.", labels=["broker", "purgatory"]
        )
        expired = CounterMetricFamily(
            "minibroker_purgatory_expired", "Operations expired.", labels=["broker", "purgatory"]
        )
        lateness = HistogramMetricFamily(
            "minibroker_purgatory_expiry_lateness_seconds",
            "From an operation's deadline to its answer being handed to the connection.",
            labels=["broker", "purgatory"],
        )
        rm = self.replica_manager
        for purgatory in (rm.produce_purgatory, rm.fetch_purgatory):
            stats = purgatory.stats()
            pending.add_metric([self.broker, purgatory.name], stats["pending"])
            expired.add_metric([self.broker, purgatory.name], stats["expired"])
            _histogram(lateness, [self.broker, purgatory.name], purgatory.expiry_lateness)
        yield pending
        yield expired
        yield lateness

    def _connections(self) -> Iterator[Any]:
        yield GaugeMetricFamily(
            "minibroker_connections",
            "Open client and peer connections.",
            value=self.connections.open_connections,
        )
        yield GaugeMetricFamily(
            "minibroker_connections_muted",
            "Connections not read until their queued answers drain (backpressure).",
            value=self.connections.muted_connections,
        )

    def _quotas(self, quotas: ClientQuotas) -> Iterator[Any]:
        """Per quota type and entity: the bound, the observed rate and the throttling
        (Kafka's byte-rate and throttle-time sensors), and the throttled connections."""
        labels = ["broker", "quota", "user", "client_id"]
        limit = GaugeMetricFamily("minibroker_quota_limit", "The entity's quota.", labels=labels)
        rate = GaugeMetricFamily(
            "minibroker_quota_rate", "The entity's rate over the quota windows.", labels=labels
        )
        throttle = CounterMetricFamily(
            "minibroker_quota_throttle_time_ms", "Throttle time given, in all.", labels=labels
        )
        throttles = CounterMetricFamily(
            "minibroker_quota_throttles", "Answers that carried a throttle.", labels=labels
        )
        now_ms = quotas.clock.now_ms()
        for manager in quotas.managers():
            for e in manager.stats(now_ms):
                values = [self.broker, manager.key, e["user"], e["client_id"]]
                limit.add_metric(values, e["quota"])
                if "rate" in e:  # a mutation quota's bucket has tokens instead
                    rate.add_metric(values, e["rate"])
                throttle.add_metric(values, e["throttle_time_ms_total"])
                throttles.add_metric(values, e["throttled"])
        yield from (limit, rate, throttle, throttles)
        yield GaugeMetricFamily(
            "minibroker_connections_throttled",
            "Connections muted by a quota's throttle (KIP-219).",
            value=self.connections.throttled_connections,
        )
        lateness = HistogramMetricFamily(
            "minibroker_quota_unmute_lateness_seconds",
            "From a throttle's end to its connection being read again.",
            labels=["broker"],
        )
        _histogram(lateness, [self.broker], quotas.throttler.unmute_lateness)
        yield lateness

    def _partitions(self) -> Iterator[Any]:
        families = {
            name: GaugeMetricFamily(
                f"minibroker_partition_{name}", doc, labels=["broker", "topic", "partition"]
            )
            for name, doc in _PARTITION_GAUGES
        }
        for p in list(self.replica_manager.partitions.values()):
            values = {
                "high_watermark": p.high_watermark,
                "log_end_offset": p.log.log_end_offset,
                "log_start_offset": p.log.log_start_offset,
                "isr_size": len(p.isr),
                "replicas": len(p.replicas),
                "leader": int(p.is_leader),
                "under_min_isr": int(p.is_leader and p.is_under_min_isr()),
                "producers": len(p.log.producers),
                "log_size_bytes": p.log.size_bytes,
            }
            for name, value in values.items():
                families[name].add_metric([self.broker, p.topic, str(p.index)], value)
        yield from families.values()


def serve_metrics(collector: BrokerCollector, port: int, host: str = "127.0.0.1") -> Any:
    """Start the endpoint on its own thread; returns the server (``shutdown()`` stops it).

    A port that cannot be had is a ConfigError naming ``metrics.port``: the broker's own
    port is fine, and the one-line start error must not blame it.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigError(
            f"metrics.port {port}: cannot listen on {host}:{port}: "
            f"{(exc.strerror or str(exc)).lower()}; choose another port or 0 to turn it off"
        ) from None
    return server
