"""Topic and broker configs seen and changed from outside (Kafka's Admin describeConfigs,
incrementalAlterConfigs, alterConfigs), as Admin's methods call them.

A broker resource is described by that broker (each broker knows its own file's settings);
the resource named "" is the cluster-wide dynamic default. Changes go to the controller.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from minibroker.client.cluster import Cluster
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import BrokerNotAvailable, KafkaError, error_class

RESOURCE_TYPES = {"topic": 2, "broker": 4}
_TYPE_NAMES = {v: k for k, v in RESOURCE_TYPES.items()}
OPERATIONS = {"set": 0, "delete": 1, "append": 2, "subtract": 3}
# Kafka's ConfigEntry.ConfigSource, by wire number
SOURCES = {
    0: "UNKNOWN",
    1: "DYNAMIC_TOPIC_CONFIG",
    2: "DYNAMIC_BROKER_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG",
    5: "DEFAULT_CONFIG",
}


@dataclass(frozen=True)
class ConfigResource:
    """``ConfigResource("topic", "orders")``, ``ConfigResource("broker", "0")``, or
    ``ConfigResource("broker", "")`` for the cluster-wide default."""

    type: str
    name: str

    def __post_init__(self) -> None:
        if self.type not in RESOURCE_TYPES:
            raise ValueError(f"resource type must be one of {sorted(RESOURCE_TYPES)}")


@dataclass(frozen=True)
class AlterConfigOp:
    """One change: ``op`` is set, delete, append or subtract (the last two: list configs)."""

    name: str
    value: str | None = None
    op: str = "set"


@dataclass(frozen=True)
class ConfigEntry:
    name: str
    value: str | None
    source: str  # DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, ..., DEFAULT_CONFIG
    read_only: bool = False
    synonyms: list[tuple[str, str | None, str]] = field(default_factory=list)


Requester = Callable[[int, dict, float], Awaitable[dict]]


async def describe(
    cluster: Cluster, resources: Iterable[ConfigResource]
) -> dict[ConfigResource, dict[str, ConfigEntry]]:
    """Each resource's configs; a resource that cannot be described raises its error."""
    out: dict[ConfigResource, dict[str, ConfigEntry]] = {}
    for resource in resources:
        body = {
            "resources": [
                {
                    "resource_type": RESOURCE_TYPES[resource.type],
                    "resource_name": resource.name,
                    "configuration_keys": None,
                }
            ],
            "include_synonyms": True,
        }
        if resource.type == "broker" and resource.name:
            node = int(resource.name)
            if node not in cluster.brokers:
                await cluster.refresh(())
            if node not in cluster.brokers:
                raise BrokerNotAvailable(f"broker {node} is not in the cluster metadata")
            answer = await cluster.request(node, ApiKey.DESCRIBE_CONFIGS, body)
        else:
            answer = await cluster.any_request(ApiKey.DESCRIBE_CONFIGS, body)
        [result] = answer["results"]
        if result["error_code"]:
            raise error_class(result["error_code"])(result.get("error_message") or "")
        out[resource] = {
            c["name"]: ConfigEntry(
                c["name"],
                c["value"],
                SOURCES.get(c["config_source"], "UNKNOWN"),
                c["read_only"],
                [(s["name"], s["value"], SOURCES.get(s["source"], "UNKNOWN")) for s in c["synonyms"]],
            )
            for c in result["configs"]
        }  # fmt: skip
    return out


async def alter(
    request: Requester,
    changes: Mapping[ConfigResource, Iterable[AlterConfigOp]],
    *,
    validate_only: bool,
    replace: bool,
    timeout_ms: int,
    raise_errors: bool,
) -> dict[ConfigResource, KafkaError | None]:
    """Per resource: None when changed, else its error (INVALID_CONFIG naming the key)."""
    resources = list(changes)
    body = {
        "resources": [
            {
                "resource_type": RESOURCE_TYPES[r.type],
                "resource_name": r.name,
                "configs": [
                    {"name": op.name, "config_operation": OPERATIONS[op.op], "value": op.value}
                    for op in changes[r]
                ],
            }
            for r in resources
        ],
        "validate_only": validate_only,
        "replace": replace,
        "timeout_ms": timeout_ms,
    }
    answer = await request(ApiKey.INCREMENTAL_ALTER_CONFIGS, body, timeout_ms / 1000 + 5)
    outcome: dict[ConfigResource, KafkaError | None] = {}
    for r in answer["responses"]:
        resource = ConfigResource(_TYPE_NAMES.get(r["resource_type"], "topic"), r["resource_name"])
        code = r["error_code"]
        outcome[resource] = error_class(code)(r.get("error_message") or "") if code else None
    if raise_errors:
        for error in outcome.values():
            if error is not None:
                raise error
    return outcome
