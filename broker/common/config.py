"""Broker configuration: Kafka's key names, documented defaults, validated at start.

Sources, later ones winning: defaults, a TOML file (flat quoted keys like
``"log.segment.bytes" = 1048576`` or nested tables ``[log.segment] bytes = ...``),
then ``--set key=value``. An unknown key or a bad value raises ConfigError naming it,
and the broker refuses to start.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration key or value the broker cannot run with."""


@dataclass(frozen=True, slots=True)
class ConfigDef:
    type: type
    default: Any
    doc: str
    min: int | None = None
    choices: tuple | None = None
    max: int | None = None


_LONG_MAX = 2**63 - 1
# Kafka's INT configs; for segments also the most a 32-bit index position can address.
_INT_MAX = 2**31 - 1

DEFS: dict[str, ConfigDef] = {
    # storage
    "log.segment.bytes": ConfigDef(
        int,
        1073741824,
        "Roll a new segment once the active one reaches this size.",
        1048576,  # Kafka 4.0's minimum (KIP-1030); the maximum is the index's 32-bit position
        max=_INT_MAX,
    ),
    "log.retention.bytes": ConfigDef(
        int, -1, "Delete old segments while a partition is larger than this (-1: no limit).", -1
    ),
    "log.retention.ms": ConfigDef(
        int,
        604800000,
        "Delete segments whose newest record is older than this (-1: keep forever).",
        -1,
    ),
    "log.retention.check.interval.ms": ConfigDef(int, 300000, "How often retention runs.", 1),
    "log.cleanup.policy": ConfigDef(
        str,
        "delete",
        "A topic's default cleanup.policy: delete (retention), compact or compact,delete.",
        choices=("delete", "compact", "compact,delete", "delete,compact"),
    ),
    "compression.type": ConfigDef(
        str,
        "producer",
        "A topic's default compression.type: the codec stock clients' batches are stored "
        "with (re-encoded on the leader's append), or producer to keep theirs.",
        choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
    ),
    "log.cleaner.enable": ConfigDef(
        bool, True, "Run the log cleaner that compacts cleanup.policy=compact topics."
    ),
    "log.cleaner.backoff.ms": ConfigDef(
        int, 15000, "How long the cleaner sleeps when no log needs cleaning.", 0
    ),
    "log.cleaner.min.cleanable.ratio": ConfigDef(
        float,
        0.5,
        "Clean a log once its dirty (not yet cleaned) bytes are this share of it.",
        0,
        max=1,
    ),
    "log.cleaner.delete.retention.ms": ConfigDef(
        int, 86400000, "How long a compacted log keeps a tombstone (delete.retention.ms).", 0
    ),
    "log.cleaner.min.compaction.lag.ms": ConfigDef(
        int, 0, "Records younger than this are never compacted (min.compaction.lag.ms).", 0
    ),
    "log.cleaner.io.buffer.size": ConfigDef(
        int,
        524288,
        "Memory the log cleaner reads and writes through: half holds the records it re-encodes "
        "at a time, half bounds a compressed batch's records it decompresses at a time.",
        0,
        max=_INT_MAX,
    ),
    "log.cleaner.dedupe.buffer.size": ConfigDef(
        int,
        134217728,
        "Memory for the cleaner's key -> latest offset map; when it fills, a pass cleans up "
        "to the offset reached and the next pass goes on from there.",
        1024,
        max=_INT_MAX,
    ),
    "log.roll.ms": ConfigDef(
        int, 604800000, "Roll a segment once it is this old, even if not full.", 1
    ),
    "log.index.interval.bytes": ConfigDef(
        int, 4096, "Bytes between sparse offset index entries.", 0, max=_INT_MAX
    ),
    "log.flush.interval.messages": ConfigDef(
        int,
        _LONG_MAX,
        "fsync after this many records (durability comes mainly from replication).",
        1,
    ),
    "log.flush.offset.checkpoint.interval.ms": ConfigDef(
        int,
        60000,
        "How often each partition's recovery point is checkpointed.",
        1,
        max=_INT_MAX,
    ),
    "message.max.bytes": ConfigDef(
        int, 1048588, "Largest record batch the broker accepts.", 0, max=_INT_MAX
    ),
    "message.max.decompressed.bytes": ConfigDef(
        int,
        64 * 1024 * 1024,
        "Largest size a compressed record batch may inflate to; the leader validates "
        "every record of a batch in a fixed window, and refuses one above this "
        "(MESSAGE_TOO_LARGE) rather than spend the time on a decompression bomb.",
        1,
    ),
    "log.message.timestamp.difference.max.ms": ConfigDef(
        int,
        _LONG_MAX,
        "Deprecated in Kafka 3.6: the default of before.max.ms and after.max.ms.",
        0,
    ),
    "log.message.timestamp.before.max.ms": ConfigDef(
        int,
        _LONG_MAX,
        "How far before the broker's clock a CreateTime record's timestamp may be "
        "(INVALID_TIMESTAMP beyond).",
        0,
    ),
    "log.message.timestamp.after.max.ms": ConfigDef(
        int,
        3600000,
        "How far after the broker's clock a CreateTime record's timestamp may be "
        "(INVALID_TIMESTAMP beyond; Kafka 4.0's default, one hour).",
        0,
    ),
    "socket.request.max.bytes": ConfigDef(
        int, 104857600, "Largest request frame; a bigger announced frame closes the connection.", 1
    ),
    "connections.max.idle.ms": ConfigDef(
        int, 600000, "Close connections that send nothing for this long.", 1
    ),
    "metrics.port": ConfigDef(
        int,
        0,
        "Serve Prometheus metrics on 127.0.0.1 at this port (0: off).",
        0,
        max=65535,
    ),
    "max.connections": ConfigDef(
        int,
        -1,
        "Connections the broker holds at once; at the limit it stops accepting until one "
        "closes, as Kafka's acceptor does. -1: all the open-file limit allows after the broker's "
        "own descriptors (112, plus 5 per other broker), the partitions open now and a headroom "
        "of 1/64 of the rest (at least 16) for partitions to come; a configured value above "
        "that is refused at start (broker/common/descriptors.py).",
        -1,
    ),
    "max.connections.per.ip": ConfigDef(
        int,
        2147483647,
        "Connections from one IP address; one over it is closed at once.",
        1,
    ),
    "fetch.max.bytes": ConfigDef(
        int,
        57671680,
        "Most bytes of records one fetch response carries (and one partition within it), "
        "whatever the client asks; the first batch still goes out whole so a consumer progresses.",
        1024,
    ),
    "socket.poller": ConfigDef(
        str,
        "auto",
        "How the broker watches its connections: auto (epoll on Linux, kqueue on macOS and "
        "BSD, else poll), epoll, kqueue or poll; $MINIBROKER_POLLER overrides it.",
        choices=("auto", "epoll", "kqueue", "poll"),
    ),
    "queued.max.response.bytes": ConfigDef(
        int,
        33554432,
        "Per connection: bytes of responses waiting to be sent, plus the most its parked fetches "
        "may answer; past it the broker reads no more of that connection's requests until it drains.",
        1024,
    ),
    "connections.max.send.stall.ms": ConfigDef(
        int,
        60000,
        "Close a connection whose responses make no progress for this long (the client stopped reading).",
        1,
    ),
    # topics
    "num.partitions": ConfigDef(int, 1, "Partitions of a topic created without a count.", 1),
    "default.replication.factor": ConfigDef(
        int, 1, "Replication factor of a topic created without one.", 1
    ),
    "auto.create.topics.enable": ConfigDef(
        bool,
        False,
        "Create a topic on first produce/metadata request (off: UNKNOWN_TOPIC_OR_PARTITION).",
    ),
    "delete.topic.enable": ConfigDef(
        bool, True, "Allow DeleteTopics (off: TOPIC_DELETION_DISABLED), as Kafka."
    ),
    # replication
    "min.insync.replicas": ConfigDef(
        int, 1, "acks=all needs at least this many in-sync replicas.", 1
    ),
    # client quotas (broker/quota): the rate an entity is measured at, Kafka's defaults
    "quota.window.num": ConfigDef(
        int, 11, "Samples kept of a client's rate for its quota (Kafka's default).", 2
    ),
    "quota.window.size.seconds": ConfigDef(
        int, 1, "Length of each sample of a client's rate for its quota.", 1
    ),
    # replication quotas (broker/quota/replication.py): Kafka's names and defaults
    "leader.replication.throttled.rate": ConfigDef(
        int,
        _LONG_MAX,
        "Bytes/s this broker sends as leader to followers of throttled replicas.",
        1,
    ),
    "follower.replication.throttled.rate": ConfigDef(
        int,
        _LONG_MAX,
        "Bytes/s this broker fetches as follower for throttled replicas.",
        1,
    ),
    "replication.quota.window.num": ConfigDef(
        int, 11, "Samples kept of the replication rates (Kafka's default).", 2
    ),
    "replication.quota.window.size.seconds": ConfigDef(
        int, 1, "Length of each sample of the replication rates.", 1
    ),
    "replica.lag.time.max.ms": ConfigDef(
        int, 30000, "A follower not caught up for this long leaves the ISR.", 1
    ),
    "replica.fetch.wait.max.ms": ConfigDef(int, 500, "Long-poll time of a follower's fetch.", 0),
    "replica.fetch.min.bytes": ConfigDef(int, 1, "Bytes a follower fetch waits for.", 0),
    "replica.fetch.max.bytes": ConfigDef(
        int, 1048576, "Bytes per partition a follower fetch asks for.", 1
    ),
    "replica.fetch.response.max.bytes": ConfigDef(
        int,
        10485760,
        "Bytes a follower's fetch asks for in all, over every partition it follows from "
        "one leader (one request per leader).",
        1,
    ),
    "replica.fetch.backoff.ms": ConfigDef(int, 1000, "Pause after a failed follower fetch.", 0),
    "controller.id": ConfigDef(
        int, -1, "Ignored: the active controller is whichever voter leads the metadata quorum.", -1
    ),
    "kafka.listener": ConfigDef(
        str,
        "",
        "host:port of the Kafka-protocol listener for stock Kafka clients (empty: off).",
    ),
    "controller.quorum.voters": ConfigDef(
        str,
        "",
        "id@host:port,... of every broker of a cluster (empty: a single broker that is its own controller).",
    ),
    "controller.quorum.election.timeout.ms": ConfigDef(
        int,
        1000,
        "A voter without a leader starts an election after this (randomized up to 2x).",
        1,
    ),
    "controller.quorum.fetch.timeout.ms": ConfigDef(
        int,
        1000,
        "A follower voter with no answer from the quorum leader this long (plus up to a "
        "random quarter of it) starts an election. Kafka's default is 2000; on one machine "
        "1000 keeps controller failover under 2 s.",
        1,
    ),
    "controller.quorum.election.backoff.max.ms": ConfigDef(
        int, 1000, "Longest random wait before a lost election is retried.", 1
    ),
    "controller.quorum.request.timeout.ms": ConfigDef(
        int,
        2000,
        "A quorum request (Vote, BeginQuorumEpoch, ...) unanswered this long is resent.",
        1,
    ),
    "controller.quorum.retry.backoff.ms": ConfigDef(
        int, 20, "Pause before a failed quorum fetch is retried.", 0
    ),
    "controller.max.partitions.per.request": ConfigDef(
        int,
        10000,
        "Most partitions one CreateTopics or CreatePartitions may add (over all its topics); "
        "a larger one is "
        "refused with POLICY_VIOLATION. A request is one change of the metadata log, applied "
        "whole by every broker, so its size bounds what one change holds up the controller.",
        1,
    ),
    "cluster.secret.file": ConfigDef(
        str,
        "",
        "Path of the cluster's shared secret (a 0600 file `cluster up` writes); brokers prove "
        "membership with it. Required when controller.quorum.voters lists other brokers.",
    ),
    "broker.session.timeout.ms": ConfigDef(
        int, 9000, "A broker that misses heartbeats this long is fenced.", 1
    ),
    "broker.heartbeat.interval.ms": ConfigDef(
        int, 2000, "How often a broker heartbeats to the controller.", 1
    ),
    "producer.id.expiration.ms": ConfigDef(
        int,
        86400000,
        "Forget an idempotent producer's sequence state after it has been silent this long.",
        1,
    ),
    "producer.id.expiration.check.interval.ms": ConfigDef(
        int, 600000, "How often expired producer ids are looked for.", 1
    ),
    "unclean.leader.election.enable": ConfigDef(
        bool, False, "Allow a leader from outside the ISR (may lose data)."
    ),
    "auto.leader.rebalance.enable": ConfigDef(
        bool,
        True,
        "The active controller moves leadership back to each partition's preferred replica "
        "(the first listed) once it is alive and in the ISR again.",
    ),
    "leader.imbalance.check.interval.seconds": ConfigDef(
        int, 300, "How often the active controller checks for leader imbalance.", 1
    ),
    "leader.imbalance.per.broker.percentage": ConfigDef(
        int,
        10,
        "Rebalance a broker's preferred partitions once more than this percentage of them "
        "are led by another broker.",
        0,
        max=100,
    ),
    # purgatory
    "purgatory.purge.interval.requests": ConfigDef(
        int,
        1000,
        "Purge watcher lists once this many completed ops may linger (both purgatories).",
        1,
    ),
    "max.incremental.fetch.session.cache.slots": ConfigDef(
        int,
        1000,
        "Incremental fetch sessions (KIP-227) the Kafka listener keeps for stock consumers "
        "(0: every fetch is a full one).",
        0,
    ),
    "fetch.purgatory.purge.interval.requests": ConfigDef(
        int, 1000, "Purge interval of the fetch purgatory.", 1
    ),
    "producer.purgatory.purge.interval.requests": ConfigDef(
        int, 1000, "Purge interval of the produce purgatory.", 1
    ),
    "timer.tick.ms": ConfigDef(int, 1, "Tick of the purgatory's timing wheel.", 1),
    "timer.wheel.size": ConfigDef(int, 20, "Buckets per timing wheel.", 2),
    # consumer groups (broker/coordinator)
    "offsets.topic.num.partitions": ConfigDef(
        int,
        5,
        "Partitions of __consumer_offsets, fixed when it is first created. Kafka's default is "
        "50; 5 is its integration tests' value: every partition is a log and a replica fetcher "
        "on each replica, and one machine runs every broker.",
        1,
    ),
    "offsets.topic.replication.factor": ConfigDef(
        int, 3, "Replicas of __consumer_offsets (capped at the live brokers when created).", 1
    ),
    "offsets.topic.segment.bytes": ConfigDef(
        int,
        104857600,
        "segment.bytes of __consumer_offsets, fixed when it is first created: small segments "
        "are compacted sooner (the active segment never is).",
        14,
        max=_INT_MAX,
    ),
    "offsets.retention.minutes": ConfigDef(
        int,
        10080,
        "Committed offsets of a group without members expire this long after it became "
        "empty (KIP-211), or after their commit for a group that never had members.",
        1,
    ),
    "offsets.retention.check.interval.ms": ConfigDef(
        int, 600000, "How often the coordinator looks for expired offsets.", 1
    ),
    # transactions (broker/transaction)
    "transaction.state.log.num.partitions": ConfigDef(
        int, 50, "Partitions of __transaction_state, fixed when it is first created.", 1
    ),
    "transaction.state.log.replication.factor": ConfigDef(
        int, 3, "Replicas of __transaction_state (capped at the live brokers when created).", 1
    ),
    "transaction.state.log.min.isr": ConfigDef(
        int,
        2,
        "min.insync.replicas of __transaction_state (capped at its replication factor).",
        1,
    ),
    "transaction.state.log.segment.bytes": ConfigDef(
        int,
        104857600,
        "segment.bytes of __transaction_state, fixed when it is first created.",
        14,
        max=_INT_MAX,
    ),
    "transaction.max.timeout.ms": ConfigDef(
        int,
        900000,
        "The longest transaction.timeout.ms a producer may ask for "
        "(INVALID_TRANSACTION_TIMEOUT beyond it).",
        1,
        max=_INT_MAX,
    ),
    "transactional.id.expiration.ms": ConfigDef(
        int,
        604800000,
        "A transactional id with no transaction for this long is removed.",
        1,
        max=_INT_MAX,
    ),
    "transaction.remove.expired.transaction.cleanup.interval.ms": ConfigDef(
        int, 3600000, "How often the coordinator looks for expired transactional ids.", 1
    ),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": ConfigDef(
        int,
        10000,
        "How long a timed-out transaction's abort waits when a change to it is still "
        "being written (the timeout itself is a timer task per transaction).",
        1,
    ),
    "add.partitions.to.txn.retry.backoff.max.ms": ConfigDef(
        int,
        100,
        "Longest the coordinator holds an AddPartitionsToTxn/AddOffsetsToTxn that finds the "
        "previous transaction still completing (or another change being written) before "
        "answering CONCURRENT_TRANSACTIONS; 0: answer at once.",
        0,
    ),
    "transaction.marker.retry.backoff.ms": ConfigDef(
        int,
        100,
        "Wait before writing a transaction's markers again to partitions whose leader "
        "answered with a retriable error (or did not answer).",
        1,
    ),
    "offsets.commit.timeout.ms": ConfigDef(
        int, 5000, "How long an offset commit waits for every in-sync replica.", 1
    ),
    "offset.metadata.max.bytes": ConfigDef(
        int, 4096, "Longest metadata string a commit may carry.", 0
    ),
    "group.min.session.timeout.ms": ConfigDef(
        int, 6000, "Shortest session.timeout.ms a member may ask for.", 0
    ),
    "group.max.session.timeout.ms": ConfigDef(
        int, 1800000, "Longest session.timeout.ms a member may ask for.", 0
    ),
    "group.initial.rebalance.delay.ms": ConfigDef(
        int, 3000, "A new group's first rebalance waits this long for more members to join.", 0
    ),
    "group.max.size": ConfigDef(int, _INT_MAX, "Most members a group may have.", 1),
    # operations
    "faults.enable": ConfigDef(bool, False, "Accept fault-injection requests (tests only)."),
    "log.level": ConfigDef(
        str, "info", "Broker log level.", choices=("debug", "info", "warning", "error")
    ),
    "log.format": ConfigDef(
        str,
        "console",
        "Log rendering: console key=value or json lines.",
        choices=("console", "json"),
    ),
}


def _flatten(table: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, name + ".")
        else:
            yield name, value


def _coerce(key: str, definition: ConfigDef, value: Any) -> Any:
    """Accept the TOML-typed value or the string form from --set."""
    if definition.type is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"config '{key}': expected true or false, got {value!r}")
    if definition.type is float:
        try:
            value = float(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            value = None
        if value is None or not (definition.min or 0) <= value <= (definition.max or value):
            raise ConfigError(
                f"config '{key}': expected a number in [{definition.min}, {definition.max}]"
            )
        return value
    if definition.type is int:
        if isinstance(value, bool):
            raise ConfigError(f"config '{key}': expected an integer, got {value!r}")
        if isinstance(value, str):
            try:
                value = int(value.replace("_", ""))
            except ValueError:
                raise ConfigError(f"config '{key}': expected an integer, got {value!r}") from None
        if not isinstance(value, int):
            raise ConfigError(f"config '{key}': expected an integer, got {value!r}")
        if definition.min is not None and value < definition.min:
            raise ConfigError(
                f"config '{key}': {value} is below the minimum {definition.min}{_range(definition)}"
            )
        if definition.max is not None and value > definition.max:
            raise ConfigError(
                f"config '{key}': {value} is above the maximum {definition.max}{_range(definition)}"
            )
        return value
    if not isinstance(value, str):
        raise ConfigError(f"config '{key}': expected a string, got {value!r}")
    if definition.choices and value not in definition.choices:
        raise ConfigError(
            f"config '{key}': {value!r} is not one of {', '.join(definition.choices)}"
        )
    return value


def _range(definition: ConfigDef) -> str:
    low = "" if definition.min is None else definition.min
    high = "" if definition.max is None else definition.max
    return f" (allowed: [{low}, {high}])" if definition.max is not None else ""


class BrokerConfig(Mapping[str, Any]):
    """Validated, complete broker settings, read by Kafka name: ``config["min.insync.replicas"]``."""

    def __init__(self, overrides: Mapping[str, Any] | None = None) -> None:
        values = {key: d.default for key, d in DEFS.items()}
        explicit = set()
        for key, value in (overrides or {}).items():
            definition = DEFS.get(key)
            if definition is None:
                raise ConfigError(f"unknown config key '{key}'{_suggest(key)}")
            values[key] = _coerce(key, definition, value)
            explicit.add(key)
        # The 0.8-era shared purge interval applies to both purgatories unless they are set.
        if "purgatory.purge.interval.requests" in explicit:
            for key in (
                "fetch.purgatory.purge.interval.requests",
                "producer.purgatory.purge.interval.requests",
            ):
                if key not in explicit:
                    values[key] = values["purgatory.purge.interval.requests"]
        if values["broker.heartbeat.interval.ms"] >= values["broker.session.timeout.ms"]:
            raise ConfigError(
                f"config 'broker.heartbeat.interval.ms' ({values['broker.heartbeat.interval.ms']}) must be "
                f"less than 'broker.session.timeout.ms' ({values['broker.session.timeout.ms']}), or live "
                "brokers get fenced between heartbeats"
            )
        if values["max.connections"] == 0:
            raise ConfigError(
                "config 'max.connections': 0 would refuse every client; use -1 (derived) or >= 1"
            )
        self._values = values
        self.explicit = frozenset(explicit)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def overrides(self) -> dict[str, Any]:
        return {key: self._values[key] for key in sorted(self.explicit)}


def _suggest(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, DEFS, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def parse_set_options(items: Iterable[str]) -> dict[str, str]:
    """``["a.b=1", ...]`` -> ``{"a.b": "1"}``; a malformed item raises ConfigError."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def load_config(
    path: str | Path | None = None, sets: Mapping[str, Any] | None = None
) -> BrokerConfig:
    """Defaults, then the TOML file, then --set values."""
    merged: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                merged.update(_flatten(tomllib.load(fh)))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    merged.update(sets or {})
    return BrokerConfig(merged)


def describe_defaults() -> list[tuple[str, Any, str]]:
    """(key, default, doc) for every key: the documentation of the config surface."""
    return [(key, d.default, d.doc) for key, d in DEFS.items()]


Validator = Callable[[Any], Any]
