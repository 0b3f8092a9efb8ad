"""The data source's options, spelled as spark-sql-kafka spells them, checked at planning time.

Spark hands a data source its options as a case-insensitive str -> str mapping and
calls our planning hooks (``reader()``, ``streamReader()``, ``writer()``) before any
task runs. Everything is parsed and validated here, so a typo or a bad value fails
the query before it starts, with a message naming the option; the executors only
ever see the parsed, picklable result. This module imports neither pyspark nor
pyarrow: it is plain Python and unit-testable without a JVM.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minibroker.client.config import SETTINGS, load_config
from minibroker.client.records import TopicPartition
from minibroker.client.spark import kafka_keys

EARLIEST = -2  # Kafka's JSON spelling of "earliest" in startingOffsets
LATEST = -1  # ... and of "latest" in startingOffsets / endingOffsets

# Options a Kafka user may bring along that this source does not implement (yet).
UNSUPPORTED = {
    "groupidprefix": "groupIdPrefix",
    "fetchoffset.numretries": "fetchOffset.numRetries",
    "fetchoffset.retryintervalms": "fetchOffset.retryIntervalMs",
    "kafkaconsumer.polltimeoutms": "kafkaConsumer.pollTimeoutMs",
}
_READ_KEYS = {
    "bootstrap.servers": "bootstrap.servers",
    "subscribe": "subscribe",
    "subscribepattern": "subscribePattern",
    "assign": "assign",
    "startingoffsets": "startingOffsets",
    "endingoffsets": "endingOffsets",
    "maxoffsetspertrigger": "maxOffsetsPerTrigger",
    "failondataloss": "failOnDataLoss",
    "minpartitions": "minPartitions",
    "includeheaders": "includeHeaders",
    "startingtimestamp": "startingTimestamp",
    "startingoffsetsbytimestamp": "startingOffsetsByTimestamp",
    "startingoffsetsbytimestampstrategy": "startingOffsetsByTimestampStrategy",
    "endingtimestamp": "endingTimestamp",
    "endingoffsetsbytimestamp": "endingOffsetsByTimestamp",
    "minoffsetspertrigger": "minOffsetsPerTrigger",
    "maxtriggerdelay": "maxTriggerDelay",
}
_WRITE_KEYS = {
    "bootstrap.servers": "bootstrap.servers",
    "topic": "topic",
    "exactlyonce": "exactlyOnce",
    "txnappid": "txnAppId",
    "txnversion": "txnVersion",
}
# Set by Spark itself on some paths; not ours to judge.
_SPARK_KEYS = {"path", "checkpointlocation", "queryname"}
# Sink defaults that differ from the plain client's: Spark tasks push many records at once.
SINK_PRODUCER_DEFAULTS = {"batch.size": 262144, "linger.ms": 5}


class OptionError(ValueError):
    """A missing, unknown or malformed option; the message names the option."""


@dataclass(frozen=True)
class Subscription:
    """Which partitions to read: exactly one of subscribe, subscribePattern or assign."""

    kind: str  # "subscribe" | "subscribePattern" | "assign"
    topics: tuple[str, ...] = ()
    pattern: str = ""
    assigned: tuple[TopicPartition, ...] = ()

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribePattern":
            return re.fullmatch(self.pattern, topic) is not None
        if self.kind == "assign":
            return any(tp.topic == topic for tp in self.assigned)
        return topic in self.topics


# "earliest" / "latest", or {TopicPartition: offset} with EARLIEST/LATEST allowed as values.
OffsetSpec = str | dict[TopicPartition, int]
# By time: one timestamp (ms) for every partition, or {TopicPartition: timestamp}.
TimeSpec = int | dict[TopicPartition, int]


@dataclass(frozen=True)
class ReadOptions:
    client_config: dict[str, Any]
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    min_partitions: int | None
    include_headers: bool
    streaming: bool
    # startingTimestamp / startingOffsetsByTimestamp (they win over startingOffsets, as in
    # spark-sql-kafka), endingTimestamp / endingOffsetsByTimestamp (batch), and what a
    # starting time with no record at or after it does: "error" or "latest".
    starting_time: TimeSpec | None = None
    ending_time: TimeSpec | None = None
    starting_time_strategy: str = "error"
    # Streaming: hold a trigger until this many new offsets, or max_trigger_delay_ms passed.
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000


@dataclass(frozen=True)
class WriteOptions:
    client_config: dict[str, Any]
    topic: str | None
    # Tasks send with a derived producer identity so reruns store nothing twice
    # (client/spark/exactly_once.py); off: spark-sql-kafka's at-least-once.
    exactly_once: bool = True
    # foreachBatch's names for one write (txnAppId, txnVersion), as Delta Lake's.
    txn: tuple[str, int] | None = None


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.7)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _split(options: Mapping[str, str], known: dict[str, str], role: str) -> tuple[dict, dict]:
    """Sort options into ours and ``kafka.*`` client settings; refuse anything else."""
    ours: dict[str, str] = {}
    client: dict[str, str] = {}
    for raw_key, value in options.items():
        key = raw_key.lower()
        if key in _SPARK_KEYS:
            continue
        if key == "kafka.bootstrap.servers":
            key = "bootstrap.servers"
        if key in UNSUPPORTED:
            raise OptionError(
                f"option '{UNSUPPORTED[key]}' is not supported by the minibroker source"
            )
        if key in known:
            if key in ours:
                raise OptionError(
                    "give only one of 'bootstrap.servers' and 'kafka.bootstrap.servers'"
                )
            ours[key] = value
        elif key.startswith("kafka."):
            client[raw_key[len("kafka.") :]] = value
        else:
            where = "reading" if role == "consumer" else "writing"
            raise OptionError(
                f"unknown option '{raw_key}' for {where}{_suggest(key, list(known.values()))}"
            )
    if "bootstrap.servers" not in ours:
        raise OptionError("option 'kafka.bootstrap.servers' (or 'bootstrap.servers') is required")
    return ours, client


def _client_config(
    role: str, bootstrap: str, client: dict[str, str], defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``kafka.*`` settings as the client's config: ours honoured, the other role's and
    Kafka's that mean nothing here accepted with a warning (client/spark/kafka_keys.py)."""
    honoured = {key for key, setting in SETTINGS.items() if role in setting.roles}
    kept: dict[str, str] = {}
    for key, value in client.items():
        if key.lower() in SETTINGS and key.lower() not in honoured:
            other = "consumer" if role == "producer" else "producer"
            doing = "writing" if role == "producer" else "reading"
            kafka_keys.log.warning(
                f"option 'kafka.{key}' is a {other} setting: accepted and ignored when {doing}"
            )
        else:
            kept[key] = value
    try:
        kept = kafka_keys.screen(kept, honoured)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    settings = {**(defaults or {}), **kept}
    try:
        return load_config(role, settings, {"bootstrap.servers": bootstrap})
    except ValueError as exc:
        raise OptionError(f"kafka.* client setting: {exc}") from None


def parse_bool(name: str, value: str) -> bool:
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise OptionError(f"option '{name}' must be true or false, got {value!r}")
    return text == "true"


def parse_positive_int(name: str, value: str) -> int:
    text = str(value).strip()
    if not text.isdigit() or int(text) < 1:
        raise OptionError(f"option '{name}' must be a positive integer, got {value!r}")
    return int(text)


def _json(name: str, value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as exc:
        raise OptionError(f"option '{name}' is not valid JSON ({exc}): {value!r}") from None


def parse_subscription(ours: Mapping[str, str]) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if k in ours]
    if len(given) != 1:
        names = ", ".join(_READ_KEYS[k] for k in given) if given else "none"
        raise OptionError(
            f"give exactly one of the options 'subscribe', 'subscribePattern', 'assign' (got {names})"
        )
    kind = given[0]
    value = ours[kind]
    if kind == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise OptionError(
                f"option 'subscribe' needs a comma-separated topic list, got {value!r}"
            )
        return Subscription("subscribe", topics=topics)
    if kind == "subscribepattern":
        try:
            re.compile(value)
        except re.error as exc:
            raise OptionError(
                f"option 'subscribePattern' is not a valid regex ({exc}): {value!r}"
            ) from None
        return Subscription("subscribePattern", pattern=value)
    spec = _json("assign", value)
    if not isinstance(spec, dict) or not spec:
        raise OptionError(f"option 'assign' must be JSON like {{\"topic\": [0, 1]}}, got {value!r}")
    assigned = []
    for topic, parts in spec.items():
        if not isinstance(parts, list) or not all(type(p) is int and p >= 0 for p in parts):
            raise OptionError(
                f"option 'assign': partitions of '{topic}' must be a list of ints >= 0"
            )
        assigned += [TopicPartition(topic, p) for p in parts]
    return Subscription("assign", assigned=tuple(dict.fromkeys(assigned)))


def parse_offsets(name: str, value: str, *, allowed: tuple[str, ...], json_min: int) -> OffsetSpec:
    """``earliest`` / ``latest`` or ``{"t": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest)."""
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        if text.lower() not in allowed:
            raise OptionError(
                f"option '{name}' cannot be '{text.lower()}' here (use {' or '.join(allowed)} or JSON)"
            )
        return text.lower()
    return _per_partition(
        name,
        text,
        json_min,
        f'{" / ".join(allowed)} or JSON like {{"t": {{"0": 5}}}}',
        f"an offset >= {json_min}",
    )


def _per_partition(name: str, text: str, minimum: int, shape: str, what: str) -> dict:
    """``{"topic": {"partition": number}}`` JSON -> ``{TopicPartition: number}``, checked."""
    spec = _json(name, text)
    if not isinstance(spec, dict) or not all(isinstance(v, dict) for v in spec.values()):
        raise OptionError(f"option '{name}' must be {shape}")
    out: dict[TopicPartition, int] = {}
    for topic, parts in spec.items():
        for part, number in parts.items():
            if not str(part).isdigit() or type(number) is not int or number < minimum:
                raise OptionError(
                    f"option '{name}': '{topic}' partition {part!r} -> {number!r} must map a "
                    f"partition number to {what}"
                )
            out[TopicPartition(topic, int(part))] = number
    return out


_DURATION = re.compile(r"\s*(\d+)\s*(ms|s|m|min|h|d)?\s*", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(name: str, value: str) -> int:
    """Spark's time strings (``15m``, ``30s``, ``500ms``; a bare number is ms)."""
    match = _DURATION.fullmatch(str(value))
    if match is None:
        raise OptionError(
            f"option '{name}' must be a duration like 30s, 15m or 500ms, got {value!r}"
        )
    return int(match.group(1)) * _UNIT_MS[(match.group(2) or "ms").lower()]


def parse_time_spec(ours: Mapping[str, str], single: str, per_partition: str) -> TimeSpec | None:
    """``startingTimestamp`` (one time for all) wins over ``startingOffsetsByTimestamp``."""
    single_key, json_key = single.lower(), per_partition.lower()
    if single_key in ours:
        text = ours[single_key].strip()
        if not text.isdigit():
            raise OptionError(f"option '{single}' must be a timestamp in ms, got {text!r}")
        return int(text)
    if json_key not in ours:
        return None
    return _per_partition(
        per_partition,
        ours[json_key],
        0,
        'JSON like {"t": {"0": 1700000000000}}',
        "a timestamp in ms",
    )


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Validate everything a read needs; raise OptionError naming the first bad option."""
    ours, client = _split(options, _READ_KEYS, "consumer")
    if "endingoffsets" in ours and streaming:
        raise OptionError("option 'endingOffsets' applies to batch reads only")
    if not streaming:
        # Streaming-only options in a batch read are ignored, as spark-sql-kafka does, so a
        # job can switch between read and readStream without editing its options.
        for key in ("maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay"):
            ours.pop(key, None)
    min_offsets = ours.get("minoffsetspertrigger")
    starting: OffsetSpec = "latest" if streaming else "earliest"
    if "startingoffsets" in ours:
        allowed = ("earliest", "latest") if streaming else ("earliest",)
        json_min = LATEST if streaming else EARLIEST
        starting = parse_offsets(
            "startingOffsets", ours["startingoffsets"], allowed=allowed, json_min=json_min
        )
        if not streaming and isinstance(starting, dict) and LATEST in starting.values():
            raise OptionError(
                "option 'startingOffsets': -1 (latest) is not allowed in a batch read"
            )
    ending: OffsetSpec = "latest"
    if "endingoffsets" in ours:
        ending = parse_offsets(
            "endingOffsets", ours["endingoffsets"], allowed=("latest",), json_min=LATEST
        )
    if streaming and ("endingtimestamp" in ours or "endingoffsetsbytimestamp" in ours):
        raise OptionError(
            "options 'endingTimestamp' / 'endingOffsetsByTimestamp' apply to batch reads only"
        )
    strategy = ours.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(
            f"option 'startingOffsetsByTimestampStrategy' must be error or latest, got {strategy!r}"
        )
    limit = ours.get("maxoffsetspertrigger")
    min_parts = ours.get("minpartitions")
    client_config = _client_config("consumer", ours["bootstrap.servers"], client)
    if client_config["group.id"] and not streaming:
        kafka_keys.log.warning(
            "option 'kafka.group.id' is accepted and ignored in a batch read: only a "
            "streaming query commits its progress to the group"
        )
    return ReadOptions(
        client_config=client_config,
        subscription=parse_subscription(ours),
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=None
        if limit is None
        else parse_positive_int("maxOffsetsPerTrigger", limit),
        fail_on_data_loss=parse_bool("failOnDataLoss", ours.get("failondataloss", "true")),
        min_partitions=None
        if min_parts is None
        else parse_positive_int("minPartitions", min_parts),
        include_headers=parse_bool("includeHeaders", ours.get("includeheaders", "false")),
        streaming=streaming,
        starting_time=parse_time_spec(ours, "startingTimestamp", "startingOffsetsByTimestamp"),
        ending_time=parse_time_spec(ours, "endingTimestamp", "endingOffsetsByTimestamp"),
        starting_time_strategy=strategy,
        min_offsets_per_trigger=None
        if min_offsets is None
        else parse_positive_int("minOffsetsPerTrigger", min_offsets),
        max_trigger_delay_ms=parse_duration_ms(
            "maxTriggerDelay", ours.get("maxtriggerdelay", "15m")
        ),
    )


def include_headers(options: Mapping[str, str]) -> bool:
    """Just the option that shapes the schema (``schema()`` runs before ``reader()``)."""
    value = next((v for k, v in options.items() if k.lower() == "includeheaders"), "false")
    return parse_bool("includeHeaders", value)


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Sink options: brokers, an optional ``topic`` that overrides the topic column, kafka.*."""
    ours, client = _split(options, _WRITE_KEYS, "producer")
    topic = ours.get("topic")
    if topic is not None and not topic.strip():
        raise OptionError("option 'topic' must not be empty")
    config = _client_config("producer", ours["bootstrap.servers"], client, SINK_PRODUCER_DEFAULTS)
    idempotent = config["enable.idempotence"]
    if "exactlyonce" in ours:
        exactly_once = parse_bool("exactlyOnce", ours["exactlyonce"])
        if exactly_once and not idempotent:
            raise OptionError(
                "option 'exactlyOnce' needs the idempotent producer, which the kafka.* "
                "settings turned off (kafka.enable.idempotence, kafka.acks, kafka.retries or "
                "kafka.max.in.flight.requests.per.connection): set exactlyOnce=false for "
                "at-least-once"
            )
    else:
        exactly_once = idempotent  # as Kafka's enable.idempotence default gives way
        if not idempotent:
            kafka_keys.log.warning(
                "the kafka.* settings turned the idempotent producer off: this write is "
                "at-least-once (a retried task or replayed batch may write records twice)"
            )
    txn = _parse_txn(ours)
    if txn is not None and not exactly_once:
        raise OptionError("options 'txnAppId' and 'txnVersion' need exactlyOnce=true")
    return WriteOptions(client_config=config, topic=topic, exactly_once=exactly_once, txn=txn)


def _parse_txn(ours: Mapping[str, str]) -> tuple[str, int] | None:
    given = [k for k in ("txnappid", "txnversion") if k in ours]
    if not given:
        return None
    if len(given) == 1:
        raise OptionError(
            "give both 'txnAppId' and 'txnVersion' (the foreachBatch batch id) or neither"
        )
    app_id = ours["txnappid"].strip()
    if not app_id:
        raise OptionError("option 'txnAppId' must not be empty")
    text = str(ours["txnversion"]).strip()
    if not text.isdigit():
        raise OptionError(
            f"option 'txnVersion' must be a non-negative integer (the batch id), "
            f"got {ours['txnversion']!r}"
        )
    return app_id, int(text)
