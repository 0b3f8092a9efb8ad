"""Client settings by their Kafka names, with Kafka's defaults, validated up front.

A typo or a bad value is a ``ValueError`` that names the key at construction time,
not a surprise deep inside a send. Values may be given typed (``{"linger.ms": 5}``)
or as strings (``--property linger.ms=5`` on the command line).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
ROLES = ("producer", "consumer", "admin")
_INT32_MAX = 2147483647


@dataclass(frozen=True)
class Setting:
    parse: Callable[[str, Any], Any]
    default: Any
    roles: tuple[str, ...]
    doc: str


def parse_bootstrap(key: str, value: Any) -> list[tuple[str, int]]:
    """``"h1:9092,h2:9093"`` (or a list of such strings) -> ``[("h1", 9092), ("h2", 9093)]``."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ValueError(f"config '{key}': expected HOST:PORT[,HOST:PORT...], got {value!r}")
    out = []
    for item in items:
        if isinstance(item, tuple) and len(item) == 2:
            host, port = item
            item = f"{host}:{port}"
        text = str(item).strip()
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"config '{key}': expected HOST:PORT, got {text!r}")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError(f"config '{key}': at least one HOST:PORT is needed")
    return out


def _int(minimum: int = 0, maximum: int = 2**63 - 1) -> Callable[[str, Any], int]:
    def parse(key: str, value: Any) -> int:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value.strip())
        if type(value) is not int:
            raise ValueError(f"config '{key}': expected an integer, got {value!r}")
        if not minimum <= value <= maximum:
            raise ValueError(f"config '{key}': {value} is outside [{minimum}, {maximum}]")
        return value

    return parse


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def parse(key: str, value: Any) -> str:
        if not isinstance(value, str) or value.lower() not in choices:
            raise ValueError(f"config '{key}': {value!r} is not one of {', '.join(choices)}")
        return value.lower()

    return parse


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"config '{key}': expected a string, got {value!r}")
    return value


def _callable(key: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise ValueError(f"config '{key}': expected a function, got {value!r}")
    return value


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"config '{key}': expected true or false, got {value!r}")


# Kafka's protocol names, and what its class names (ConsumerConfig accepts those) reduce to.
_ASSIGNOR_NAMES = {
    "range": "range",
    "roundrobin": "roundrobin",
    "cooperative-sticky": "cooperative-sticky",
    "cooperativesticky": "cooperative-sticky",
}


def _assignors(key: str, value: Any) -> list[str]:
    """``"range,roundrobin"`` (or a list): the group protocols a consumer offers, by Kafka's
    short names (``range``, ``roundrobin``, ``cooperative-sticky``; the class names, e.g.
    ``org.apache.kafka.clients.consumer.CooperativeStickyAssignor``, are accepted too)."""
    known = "range, roundrobin, cooperative-sticky"
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ValueError(f"config '{key}': expected a list of {known}")
    out = []
    for item in items:
        name = str(item).strip().lower().rsplit(".", 1)[-1].removesuffix("assignor")
        if name not in _ASSIGNOR_NAMES:
            raise ValueError(f"config '{key}': {item!r} is not one of {known}")
        out.append(_ASSIGNOR_NAMES[name])
    return out


def parse_acks(key: str, value: Any) -> int:
    """Kafka spells acks as all, -1, 0 or 1; the wire wants -1, 0 or 1."""
    text = str(value).strip().lower()
    if text == "all":
        return -1
    if text in ("-1", "0", "1"):
        return int(text)
    raise ValueError(f"config '{key}': {value!r} is not one of all, -1, 0, 1")


_ALL = ROLES
_P = ("producer",)
_C = ("consumer",)

SETTINGS: dict[str, Setting] = {
    "bootstrap.servers": Setting(
        parse_bootstrap, DEFAULT_BOOTSTRAP, _ALL, "Brokers to ask for metadata first."
    ),
    "client.id": Setting(
        _string, "minibroker-client", _ALL, "Sent with every request; shows in broker logs."
    ),
    "throttle_cb": Setting(
        _callable,
        None,
        _ALL,
        "Called with a ThrottleEvent when a broker's quota holds this client back "
        "(librdkafka's throttle_cb).",
    ),
    "request.timeout.ms": Setting(
        _int(1, _INT32_MAX), 30000, _ALL, "How long to wait for one response."
    ),
    "retry.backoff.ms": Setting(_int(0), 100, _ALL, "Pause before retrying a failed request."),
    "metadata.max.age.ms": Setting(_int(0), 300000, _ALL, "Refresh metadata at least this often."),
    "socket.connection.setup.timeout.ms": Setting(
        _int(1), 10000, _ALL, "How long a TCP connect may take."
    ),
    "api.version.request.timeout.ms": Setting(
        _int(1, _INT32_MAX),
        2000,
        _ALL,
        "A new connection is ready once the broker answers ApiVersions within this long; "
        "a paused broker or a port where something else listens is then named at once "
        "(librdkafka's name; its default is 10000).",
    ),
    "hedge.delay.ms": Setting(
        _int(0, _INT32_MAX),
        250,
        _ALL,
        "A request any broker can answer (metadata, a producer id) also goes to the next "
        "broker after this long without an answer; the first answer wins (not a Kafka "
        "setting: Kafka waits request.timeout.ms on one broker).",
    ),
    # producer
    "acks": Setting(
        parse_acks, -1, _P, "Replicas that must have a record before it is acknowledged."
    ),
    "delivery.timeout.ms": Setting(
        _int(1, _INT32_MAX), 120000, _P, "Upper bound on send to ack, retries included."
    ),
    "retries": Setting(
        _int(0, _INT32_MAX),
        _INT32_MAX,
        _P,
        "Retries of retriable errors (bounded by delivery.timeout.ms).",
    ),
    "linger.ms": Setting(
        _int(0), 5, _P, "Wait this long for more records before sending a batch that is not full."
    ),
    "batch.size": Setting(
        _int(1),
        16384,
        _P,
        "Bytes of records per partition batch; large batches mean high throughput.",
    ),
    "max.request.size": Setting(
        _int(1), 1048576, _P, "Largest record (and batch) the producer will send."
    ),
    "enable.idempotence": Setting(
        _bool,
        True,
        _P,
        "Retries never store a record twice nor reorder (needs acks=all, retries > 0, "
        "max.in.flight.requests.per.connection <= 5; Kafka 3.x's default).",
    ),
    "transactional.id": Setting(
        _string,
        "",
        _P,
        "Makes the producer transactional (init_transactions, begin/commit/abort_transaction); "
        "implies enable.idempotence. A second producer with the same id fences the first.",
    ),
    "transaction.timeout.ms": Setting(
        _int(1, _INT32_MAX),
        60000,
        _P,
        "Longest a transaction may stay open before its coordinator aborts it (at most the "
        "broker's transaction.max.timeout.ms).",
    ),
    "max.in.flight.requests.per.connection": Setting(
        _int(1), 5, _P, "Unanswered produce requests per broker."
    ),
    "buffer.memory": Setting(
        _int(1), 33554432, _P, "Bytes of unsent records before send_nowait refuses / enqueue waits."
    ),
    "max.block.ms": Setting(
        _int(0), 60000, _P, "How long a send may wait for metadata or buffer space."
    ),
    # consumer
    "fetch.min.bytes": Setting(_int(0, _INT32_MAX), 1, _C, "Bytes a fetch waits for (long poll)."),
    "fetch.max.wait.ms": Setting(
        _int(0, _INT32_MAX), 500, _C, "Longest a fetch waits for fetch.min.bytes."
    ),
    "fetch.max.bytes": Setting(_int(0, _INT32_MAX), 52428800, _C, "Bytes per fetch response."),
    "max.partition.fetch.bytes": Setting(
        _int(0, _INT32_MAX), 1048576, _C, "Bytes per partition in a fetch response."
    ),
    "max.poll.records": Setting(_int(1), 500, _C, "Records returned by one poll()."),
    "auto.offset.reset": Setting(
        _choice("latest", "earliest", "none"),
        "latest",
        _C,
        "Where to start without a valid position (or committed offset, in a group).",
    ),
    "isolation.level": Setting(
        _choice("read_uncommitted", "read_committed"),
        "read_uncommitted",
        _C,
        "read_committed: fetches stop at the last stable offset and skip aborted "
        "transactions' records; read_uncommitted reads every record.",
    ),
    # consumer groups (Kafka's classic protocol)
    "group.id": Setting(
        _string, "", _C, "The consumer group to join on subscribe() and commit offsets for."
    ),
    "group.instance.id": Setting(
        _string,
        "",
        _C,
        "Static membership (KIP-345): a restart within session.timeout.ms gets the same "
        "partitions back without a rebalance; close() does not leave the group.",
    ),
    "session.timeout.ms": Setting(
        _int(1, _INT32_MAX), 45000, _C, "No heartbeat for this long: the group drops the member."
    ),
    "heartbeat.interval.ms": Setting(
        _int(1, _INT32_MAX), 3000, _C, "How often the member heartbeats to its coordinator."
    ),
    "max.poll.interval.ms": Setting(
        _int(1, _INT32_MAX),
        300000,
        _C,
        "Longest gap between polls before the consumer leaves its group (and rejoin timeout).",
    ),
    "enable.auto.commit": Setting(
        _bool, True, _C, "Commit the positions in the background (and on rebalance and close)."
    ),
    "auto.commit.interval.ms": Setting(
        _int(0, _INT32_MAX), 5000, _C, "How often positions are auto-committed."
    ),
    "partition.assignment.strategy": Setting(
        _assignors, ["range", "roundrobin"], _C, "Assignors in order of preference."
    ),
    "allow.auto.create.topics": Setting(
        _bool,
        True,
        _C,
        "May the consumer's metadata requests auto-create a topic (only if the broker's "
        "auto.create.topics.enable is on)? false: a missing or deleted topic stays missing.",
    ),
}


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def load_client_config(
    role: str,
    bootstrap: str | None,
    config: Mapping[str, Any] | None,
    settings: Mapping[str, Any],
) -> dict[str, Any]:
    """A client's constructor arguments as one validated config. Precedence: the config
    mapping, then keyword settings, then the bootstrap argument."""
    return load_config(
        role, config or {}, settings, {"bootstrap.servers": bootstrap} if bootstrap else {}
    )


def load_config(role: str, *sources: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults for ``role``, overlaid with each source in order, every value validated."""
    known = [k for k, s in SETTINGS.items() if role in s.roles]
    values: dict[str, Any] = {}
    given: set[str] = set()
    for key in known:
        setting = SETTINGS[key]
        values[key] = setting.parse(key, setting.default)
    for source in sources:
        for key, raw in (source or {}).items():
            if key not in known:
                where = "" if key not in SETTINGS else f" (it is not a {role} setting)"
                raise ValueError(f"unknown config key '{key}'{where or _suggest(key, known)}")
            values[key] = SETTINGS[key].parse(key, raw)
            given.add(key)
    _check_consistency(role, values, given)
    return values


# What idempotence needs, as Kafka's ProducerConfig checks it.
_IDEMPOTENCE_NEEDS = (
    ("acks", lambda v: v == -1, "acks to all"),
    ("retries", lambda v: v > 0, "retries above 0"),
    (
        "max.in.flight.requests.per.connection",
        lambda v: v <= 5,
        "max.in.flight.requests.per.connection to at most 5",
    ),
)


def _check_consistency(role: str, values: dict[str, Any], given: set[str]) -> None:
    if role == "producer":
        transactional = bool(values["transactional.id"])
        if transactional and not values["enable.idempotence"]:
            raise ValueError(
                "config 'transactional.id': a transactional producer needs "
                "enable.idempotence=true (Kafka's rule)"
            )
        for key, ok, needed in _IDEMPOTENCE_NEEDS:
            if ok(values[key]):
                continue
            if transactional or ("enable.idempotence" in given and values["enable.idempotence"]):
                why = "a transactional producer" if transactional else "the idempotent producer"
                raise ValueError(
                    f"config '{key}': must set {needed} to use {why} "
                    "(or set enable.idempotence=false)"
                )
            # Kafka 3.2+: idempotence on by default only, so a conflicting setting turns it off.
            values["enable.idempotence"] = False
        floor = values["linger.ms"] + values["request.timeout.ms"]
        if values["delivery.timeout.ms"] < floor:
            raise ValueError(
                f"config 'delivery.timeout.ms': {values['delivery.timeout.ms']} must be at least "
                f"linger.ms + request.timeout.ms ({floor})"
            )


def parse_properties(items: list[str] | None, flag: str = "--property") -> dict[str, str]:
    """``["linger.ms=5", ...]`` (a repeatable command-line ``flag``) -> ``{"linger.ms": "5"}``."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} expects key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def describe(role: str) -> list[tuple[str, Any, str]]:
    """(key, default, doc) of every setting of ``role``: the documented config surface."""
    return [(k, s.default, s.doc) for k, s in SETTINGS.items() if role in s.roles]
