"""Topic-level configs: the one list of their names, bounds and broker defaults.

The controller validates CreateTopics configs against it and the replica manager
builds a partition's LogConfig from it, so a key or a bound changes in one place.
Names and bounds are Kafka's (``TopicConfig`` / ``LogConfig``), including KIP-1030's
4.0 minimum of 1 MiB for ``segment.bytes``; ``internal.segment.bytes`` is Kafka's
testing-only override that still allows tiny segments. INT configs stop at 2^31-1:
a segment's index holds positions and relative offsets as signed 32-bit integers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1


# Kafka's cleanup.policy is a list of "delete" and/or "compact"; these are its spellings.
CLEANUP_POLICIES = ("delete", "compact", "compact,delete", "delete,compact")


_REPLICAS = re.compile(r"^(\*|\d+:\d+(,\d+:\d+)*)?$")


def throttled_replicas_error(value: Any) -> str | None:
    """None if ``value`` is Kafka's throttled-replicas form: empty, ``*``, or
    ``partition:broker,...`` (leader/follower.replication.throttled.replicas)."""
    if isinstance(value, str) and _REPLICAS.match(value.replace(" ", "")):
        return None
    return f"expected '*' or a list of partition:broker (e.g. 0:1,1:2), got {_short(value)}"


@dataclass(frozen=True, slots=True)
class TopicConfigDef:
    name: str
    broker_key: str | None  # the broker setting a topic without this key inherits
    min: int
    max: int
    doc: str
    kind: type = int  # int, float (a ratio) or str (one of ``choices``)
    choices: tuple[str, ...] = ()

    def check(self, value: Any) -> tuple[Any, str | None]:
        """``(parsed value, None)`` or ``(None, a one-line problem naming key and range)``."""
        if self.kind is list:  # a list of replicas (the replication throttles)
            problem = throttled_replicas_error(value)
            if problem is not None:
                return None, f"topic config '{self.name}': {problem}"
            return str(value).replace(" ", ""), None
        if self.kind is str:
            text = str(value).replace(" ", "")
            if text not in self.choices:
                return None, (
                    f"topic config '{self.name}' = {_short(value)} is not one of "
                    f"{', '.join(self.choices)}"
                )
            return text, None
        try:
            number = self.kind(str(value).replace("_", "")) if not isinstance(value, bool) else None
        except ValueError:
            number = None
        if number is None:
            kind = "an integer" if self.kind is int else "a number"
            return None, f"topic config '{self.name}' must be {kind}, got {_short(value)}"
        if not self.min <= number <= self.max:
            return None, (
                f"topic config '{self.name}' = {number} is outside the allowed range "
                f"[{self.min}, {self.max}]"
            )
        return number, None


def _def(name: str, broker_key: str | None, lo: int, hi: int, doc: str) -> TopicConfigDef:
    return TopicConfigDef(name, broker_key, lo, hi, doc)


TOPIC_CONFIGS: dict[str, TopicConfigDef] = {
    d.name: d
    for d in (
        _def("min.insync.replicas", "min.insync.replicas", 1, INT_MAX, "acks=all needs this many in-sync replicas."),
        _def("retention.ms", "log.retention.ms", -1, LONG_MAX, "Delete segments older than this (-1: forever)."),
        _def("retention.bytes", "log.retention.bytes", -1, LONG_MAX, "Delete old segments past this size (-1: no limit)."),
        _def("segment.bytes", "log.segment.bytes", 1048576, INT_MAX, "Roll a segment at this size."),
        _def("internal.segment.bytes", None, 14, INT_MAX, "Testing only: segment.bytes below its 1 MiB minimum."),
        _def("segment.ms", "log.roll.ms", 1, LONG_MAX, "Roll a segment at this age."),
        _def("max.message.bytes", "message.max.bytes", 0, INT_MAX, "Largest batch accepted."),
        _def("flush.messages", "log.flush.interval.messages", 1, LONG_MAX, "fsync after this many records."),
        _def("index.interval.bytes", "log.index.interval.bytes", 0, INT_MAX, "Bytes between index entries."),
        TopicConfigDef("cleanup.policy", "log.cleanup.policy", 0, 0, "delete (retention), compact (latest per key) or both.", str, CLEANUP_POLICIES),
        TopicConfigDef("min.cleanable.dirty.ratio", "log.cleaner.min.cleanable.ratio", 0, 1, "Clean once this share of the log is dirty.", float),
        _def("delete.retention.ms", "log.cleaner.delete.retention.ms", 0, LONG_MAX, "Keep tombstones this long in a compacted log."),
        _def("min.compaction.lag.ms", "log.cleaner.min.compaction.lag.ms", 0, LONG_MAX, "Never clean records younger than this."),
        _def("message.timestamp.difference.max.ms", "log.message.timestamp.difference.max.ms", 0, LONG_MAX, "Deprecated: the default of the two below."),
        _def("message.timestamp.before.max.ms", "log.message.timestamp.before.max.ms", 0, LONG_MAX, "A record's timestamp at most this far before the broker's clock."),
        TopicConfigDef("leader.replication.throttled.replicas", None, 0, 0, "Replicas (partition:broker, or *) whose leader throttles replication to leader.replication.throttled.rate.", list),
        TopicConfigDef("follower.replication.throttled.replicas", None, 0, 0, "Replicas (partition:broker, or *) whose follower throttles its fetching to follower.replication.throttled.rate.", list),
        TopicConfigDef("compression.type", "compression.type", 0, 0, "Codec of stored batches; producer keeps the producer's.", str, ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
        _def("message.timestamp.after.max.ms", "log.message.timestamp.after.max.ms", 0, LONG_MAX, "A record's timestamp at most this far after the broker's clock."),
    )
}  # fmt: skip


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def topic_configs_error(configs: Mapping[str, Any]) -> str | None:
    """The first problem with a CreateTopics config map, or None when all are valid."""
    for key, value in configs.items():
        definition = TOPIC_CONFIGS.get(key)
        if definition is None:
            return f"unknown topic config {_short(key)}"
        _, problem = definition.check(value)
        if problem is not None:
            return problem
    return None


def topic_value(key: str, overrides: Mapping[str, Any] | None, broker: Mapping[str, Any]) -> Any:
    """A topic's effective value: its own valid override, else the broker's setting.

    A stored override that no longer passes (saved by an older version) falls back to
    the broker default rather than stopping the broker from loading the topic.
    """
    definition = TOPIC_CONFIGS[key]
    if overrides and key in overrides:
        value, problem = definition.check(overrides[key])
        if problem is None and value is not None:
            return value
    if definition.broker_key is None:
        raise KeyError(f"topic config '{key}' has no broker default")
    return broker[definition.broker_key]


# LogConfig field <- topic config: what a partition's log is built from.
LOG_CONFIG_FIELDS = {
    "segment_bytes": "segment.bytes",
    "retention_bytes": "retention.bytes",
    "retention_ms": "retention.ms",
    "index_interval_bytes": "index.interval.bytes",
    "flush_interval_messages": "flush.messages",
    "max_message_bytes": "max.message.bytes",
    "segment_ms": "segment.ms",
    "cleanup_policy": "cleanup.policy",
    "min_cleanable_dirty_ratio": "min.cleanable.dirty.ratio",
    "delete_retention_ms": "delete.retention.ms",
    "min_compaction_lag_ms": "min.compaction.lag.ms",
    "message_timestamp_difference_max_ms": "message.timestamp.difference.max.ms",
    "message_timestamp_before_max_ms": "message.timestamp.before.max.ms",
    "message_timestamp_after_max_ms": "message.timestamp.after.max.ms",
    "compression_type": "compression.type",
}


def log_config_values(
    broker: Mapping[str, Any], overrides: Mapping[str, Any] | None
) -> dict[str, Any]:
    """LogConfig keyword arguments for a topic: its overrides over the broker's settings."""
    values = {
        field: topic_value(key, overrides, broker) for field, key in LOG_CONFIG_FIELDS.items()
    }
    if overrides and "internal.segment.bytes" in overrides:  # Kafka's testing-only override
        tiny, problem = TOPIC_CONFIGS["internal.segment.bytes"].check(
            overrides["internal.segment.bytes"]
        )
        if problem is None and tiny is not None:
            values["segment_bytes"] = tiny
    return values


def offsets_topic_configs(segment_bytes: int) -> dict[str, str]:
    """``__consumer_offsets`` as Kafka creates it: compacted (each group's latest offsets and
    metadata stay, whatever their age) with ``offsets.topic.segment.bytes`` segments; a
    value below segment.bytes' minimum goes as the testing override, as Kafka allows it."""
    key = (
        "segment.bytes"
        if segment_bytes >= TOPIC_CONFIGS["segment.bytes"].min
        else "internal.segment.bytes"
    )
    return {"cleanup.policy": "compact", key: str(segment_bytes)}
