"""Kafka client settings a ported spark-sql-kafka job carries as ``kafka.*`` options.

The rule (issue 17): every Kafka client key is accepted. One the minibroker client
implements is passed to it and honoured (client/config.py checks its value). One with no
meaning here is accepted with a one-line warning in the driver log saying why, even when
the plain client has it (a consumer's group settings: the source never joins a group).
``group.id`` is the exception that means something: a streaming query records its
progress into that group's committed offsets (source.py). A *value*
that cannot be honoured (TLS, SASL, a compression codec) fails with a message that says
so, and key/value (de)serializers stay refused, as spark-sql-kafka refuses them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("minibroker.spark")

# key -> why it changes nothing here (the warning's text).
_NO_MEANING_HERE = {
    "group.instance.id": "the source never joins a group (no static membership either)",
    "client.rack": "no racks: one machine",
    "client.dns.lookup": "brokers are addressed as given",
    "reconnect.backoff.ms": "reconnects follow retry.backoff.ms",
    "reconnect.backoff.max.ms": "reconnects follow retry.backoff.ms",
    "retry.backoff.max.ms": "the backoff is retry.backoff.ms, not exponential",
    "send.buffer.bytes": "the OS default socket buffers are used",
    "receive.buffer.bytes": "the OS default socket buffers are used",
    "connections.max.idle.ms": "the client keeps its connections for its life",
    "metadata.max.idle.ms": "metadata is kept for every topic in use",
    "socket.connection.setup.timeout.max.ms": "socket.connection.setup.timeout.ms is fixed",
    "default.api.timeout.ms": "request.timeout.ms bounds every call",
    "interceptor.classes": "no Java interceptors in a Python client",
    "metric.reporters": "no Java metric reporters in a Python client",
    "metrics.num.samples": "client metrics are not collected",
    "metrics.sample.window.ms": "client metrics are not collected",
    "metrics.recording.level": "client metrics are not collected",
    "auto.include.jmx.reporter": "no JMX",
    "enable.metrics.push": "client metrics are not collected",
    "enable.auto.commit": "the source never joins a group; with kafka.group.id a streaming "
    "query commits its progress after each micro-batch (spark-sql-kafka sets it false)",
    "auto.commit.interval.ms": "progress is committed after each micro-batch, if at all",
    "session.timeout.ms": "the source never joins a group",
    "heartbeat.interval.ms": "the source never joins a group",
    "max.poll.interval.ms": "the source never joins a group",
    "partition.assignment.strategy": "partitions are assigned by the query, not a group",
    "group.protocol": "the source never joins a group",
    "group.remote.assignor": "the source never joins a group",
    "exclude.internal.topics": "subscriptions never include __minibroker_health",
    "allow.auto.create.topics": "the broker's auto.create.topics.enable decides",
    "check.crcs": "every batch's CRC is always checked",
    "fetch.max.bytes": "the source's fetch size is its own",
    "security.providers": "no TLS or SASL",
    "partitioner.class": "the sink partitions with murmur2 like Kafka's default",
    "partitioner.adaptive.partitioning.enable": "the sink partitions with murmur2",
    "partitioner.availability.timeout.ms": "the sink partitions with murmur2",
    "partitioner.ignore.keys": "the sink partitions with murmur2",
    "transaction.timeout.ms": "no transactions",
    "compression.gzip.level": "batches are not compressed",
    "compression.lz4.level": "batches are not compressed",
    "compression.zstd.level": "batches are not compressed",
    "security.protocol": "minibroker listens on plaintext loopback",
    "sasl.mechanism": "no SASL (security.protocol is PLAINTEXT)",
}
# key -> allowed values (lowercase); any other value cannot be honoured.
_HONOURABLE_VALUES = {
    "security.protocol": ("plaintext",),
    "isolation.level": ("read_uncommitted", "read_committed"),
    "compression.type": ("none",),
}
_WHY_NOT = {
    "security.protocol": "minibroker has no TLS and no SASL: use PLAINTEXT",
    "isolation.level": "it is read_uncommitted or read_committed",
    "compression.type": "minibroker batches are not compressed: use none",
}
# spark-sql-kafka refuses these: keys and values are bytes, (de)serialize in the DataFrame.
_REFUSED = {
    "key.serializer": "keys are serialized as bytes: cast or encode the 'key' column",
    "value.serializer": "values are serialized as bytes: cast or encode the 'value' column",
    "key.deserializer": "keys are read as bytes: use DataFrame operations to deserialize them",
    "value.deserializer": "values are read as bytes: use DataFrame operations to deserialize",
    "transactional.id": "no transactions (the sink's producer is idempotent)",
}


def _is_ssl_or_sasl(key: str) -> bool:
    return key.startswith(("ssl.", "sasl."))


def screen(
    settings: dict[str, str], honoured: set[str], *, warn: Callable[[str], None] = log.warning
) -> dict[str, str]:
    """The ``kafka.*`` settings (prefix removed) the client should get; warns about or
    refuses the rest (ValueError naming the key)."""
    passed: dict[str, str] = {}
    for key, value in settings.items():
        name = key.lower()
        if name in _REFUSED:
            raise ValueError(f"option 'kafka.{key}' is not supported: {_REFUSED[name]}")
        allowed = _HONOURABLE_VALUES.get(name)
        if allowed is not None and str(value).strip().lower() not in allowed:
            raise ValueError(f"option 'kafka.{key}={value}' cannot be honoured: {_WHY_NOT[name]}")
        if name in _NO_MEANING_HERE:  # first: the client may have it, the source ignores it
            warn(f"option 'kafka.{key}' is accepted and ignored: {_NO_MEANING_HERE[name]}")
        elif name in honoured:
            passed[key] = value
        elif name == "compression.type":
            pass  # "none" (the only value let through above): what minibroker does anyway
        elif _is_ssl_or_sasl(name):
            warn(f"option 'kafka.{key}' is accepted and ignored: no TLS or SASL here")
        else:
            passed[key] = value  # the client names an unknown key (with a suggestion)
    return passed
