"""DescribeConfigs: a topic's or a broker's configs with the source of each value (Kafka's
ConfigHelper), answered by any broker from its metadata and its own layered config.

A topic shows every topic config we serve: its own override (DYNAMIC_TOPIC_CONFIG) or the
broker setting it inherits, with that setting's source. A broker resource must name this
broker (Kafka's rule: a client asks each broker about itself) and shows every broker
setting with its source; the resource "" shows the cluster-wide dynamic defaults only.
"""

from __future__ import annotations

from typing import Any

from minibroker.broker.common.config import DEFS, BrokerConfig
from minibroker.broker.common.dynamic_config import (
    CLUSTER_DEFAULT,
    DYNAMIC_BROKER_KEYS,
    DYNAMIC_DEFAULT_BROKER_CONFIG,
    DYNAMIC_TOPIC_CONFIG,
    DynamicBrokerConfig,
    config_text,
)
from minibroker.broker.common.topic_config import TOPIC_CONFIGS
from minibroker.broker.metadata.image import ClusterMetadata
from minibroker.broker.metadata.records import RESOURCE_BROKER, RESOURCE_TOPIC
from minibroker.protocol.errors import ErrorCode

# Kafka's DescribeConfigsResponse.ConfigType
_TYPES = {bool: 1, str: 2, int: 5, float: 6}
_LIST = 7


def describe_configs(body: dict, md: ClusterMetadata, config: BrokerConfig, broker_id: int) -> dict:
    """The native DescribeConfigs answer for ``body``."""
    config = _layered(config)
    results = []
    for resource in body["resources"]:
        kind, name = resource["resource_type"], resource["resource_name"]
        out: dict[str, Any] = {"resource_type": kind, "resource_name": name, "error_code": 0}
        if kind == RESOURCE_TOPIC and name not in md.topics:
            out.update(
                error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                error_message=f"topic '{name}' does not exist",
            )
        elif kind == RESOURCE_TOPIC:
            out["configs"] = _topic_entries(md.topics[name].configs, config, body)
        elif kind == RESOURCE_BROKER and name == CLUSTER_DEFAULT:
            out["configs"] = [
                _entry(key, value, DYNAMIC_DEFAULT_BROKER_CONFIG, False, body)
                for key, value in sorted(config.cluster_default.items())
            ]
        elif kind == RESOURCE_BROKER and name == str(broker_id):
            out["configs"] = _broker_entries(config, body)
        elif kind == RESOURCE_BROKER:
            out.update(
                error_code=int(ErrorCode.INVALID_REQUEST),
                error_message=f"Unexpected broker id, expected {broker_id} or empty string, "
                f"but received {name}",
            )
        else:
            out.update(
                error_code=int(ErrorCode.INVALID_REQUEST),
                error_message=f"resource type {kind} is not served: only topics (2) and "
                "brokers (4) have configs here",
            )
        if out.get("configs") is not None and resource["configuration_keys"] is not None:
            wanted = set(resource["configuration_keys"])
            out["configs"] = [c for c in out["configs"] if c["name"] in wanted]
        results.append(out)
    return {"results": results}


def topic_config_entries(overrides: dict[str, str], config: BrokerConfig) -> list[dict]:
    """A topic's effective configs, sorted, with their sources: what CreateTopics v5+
    answers for a topic it created (Kafka's computeEffectiveTopicConfigs)."""
    plain = {"include_synonyms": False, "include_documentation": False}
    return _topic_entries(overrides, _layered(config), plain)


def _layered(config: BrokerConfig) -> DynamicBrokerConfig:
    if isinstance(config, DynamicBrokerConfig):
        return config
    return DynamicBrokerConfig(config)  # a broker built without dynamic layers


def _topic_entries(overrides: dict[str, str], config: DynamicBrokerConfig, body: dict) -> list:
    entries = []
    for key, definition in sorted(TOPIC_CONFIGS.items()):
        broker_key = definition.broker_key
        if key in overrides:
            value, source = overrides[key], DYNAMIC_TOPIC_CONFIG
        elif broker_key is not None:
            value, source = config_text(config[broker_key]), config.source(broker_key)
        else:
            continue  # a testing-only key with no broker default, not set here
        entry = _entry(key, value, source, False, body, definition.doc)
        if body["include_synonyms"]:
            synonyms = [(key, overrides[key], DYNAMIC_TOPIC_CONFIG)] if key in overrides else []
            if broker_key is not None:
                synonyms += config.synonyms(broker_key)
            entry["synonyms"] = _synonyms(synonyms)
        entry["config_type"] = _LIST if key == "cleanup.policy" else _TYPES[definition.kind]
        entries.append(entry)
    return entries


def _broker_entries(config: DynamicBrokerConfig, body: dict) -> list:
    entries = []
    for key, definition in sorted(DEFS.items()):
        entry = _entry(
            key,
            config[key],
            config.source(key),
            key not in DYNAMIC_BROKER_KEYS,
            body,
            definition.doc,
        )
        if body["include_synonyms"]:
            entry["synonyms"] = _synonyms(config.synonyms(key))
        entry["config_type"] = _TYPES.get(definition.type, 0)
        entries.append(entry)
    return entries


def _entry(key: str, value: Any, source: int, read_only: bool, body: dict, doc: str = "") -> dict:
    return {
        "name": key,
        "value": None if value is None else config_text(value),
        "read_only": read_only,
        "config_source": source,
        "is_sensitive": False,
        "synonyms": [],
        "documentation": doc if body["include_documentation"] else None,
    }


def _synonyms(layers: list[tuple[str, Any, int]]) -> list[dict]:
    return [
        {"name": name, "value": None if value is None else config_text(value), "source": source}
        for name, value, source in layers
    ]
