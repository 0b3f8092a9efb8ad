"""IncrementalAlterConfigs and AlterConfigs on the active controller (Kafka's
ConfigurationControlManager): topic configs and dynamic broker configs.

Every resource of one request that passes is one change (one metadata log entry of Config
records, records.py). A topic's config is checked against the topic config list
(broker/common/topic_config.py), a broker's against the dynamic registry
(broker/common/dynamic_config.py); a problem is INVALID_CONFIG naming the key, and leaves
that resource unchanged. ``replace`` is AlterConfigs: the given set becomes the resource's
whole dynamic config (keys left out are removed), as Kafka's legacy API does.

Each broker applies the committed configs live: its logs' LogConfig, its dynamic broker
layers (replication's metadata publisher).
"""

from __future__ import annotations

from typing import Any

from minibroker.broker.common.dynamic_config import CLUSTER_DEFAULT, broker_config_error
from minibroker.broker.common.topic_config import TOPIC_CONFIGS
from minibroker.broker.metadata.image import ClusterMetadata
from minibroker.broker.metadata.records import RESOURCE_BROKER, RESOURCE_TOPIC
from minibroker.broker.network.pending import PendingResponse
from minibroker.protocol.errors import ErrorCode

# Kafka's AlterConfigOp.OpType
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
_LIST_CONFIGS = frozenset({"cleanup.policy"})  # Kafka's LIST-typed topic configs we serve


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def alter_configs(
    controller: Any, resources: list[dict], validate_only: bool, replace: bool
) -> dict | PendingResponse:
    """``{"responses": [{resource_type, resource_name, error_code, error_message}]}``, sent
    once the change commits."""
    results = []
    with controller._change() as draft:
        for resource in resources:
            try:
                target = _target(draft, resource)
                updated = _applied(resource, target, replace)
            except _Refused as refused:
                results.append(_result(resource, refused.code, refused.message))
                continue
            results.append(_result(resource, ErrorCode.NONE, None))
            if validate_only or updated == target:
                continue
            target.clear()
            target.update(updated)
            if resource["resource_type"] == RESOURCE_BROKER and not target:
                draft.broker_configs.pop(resource["resource_name"], None)
            controller.commit()
            controller.log.info(
                "configs_altered",
                resource_type=resource["resource_type"],
                resource_name=resource["resource_name"],
                configs=updated,
            )
        for entity in [e for e, configs in draft.broker_configs.items() if not configs]:
            del draft.broker_configs[entity]  # a broker's map looked up but never set
    lost = {
        "responses": [
            _result(
                r,
                ErrorCode.REQUEST_TIMED_OUT,
                f"broker {controller.broker_id} lost the controller role before the change "
                "committed; it may still commit: describe the configs before retrying",
            )
            for r in resources
        ]
    }
    return controller._reply({"responses": results}, lost)


def _target(md: ClusterMetadata, resource: dict) -> dict[str, str]:
    """The config map the resource names, in the draft (created empty for a broker)."""
    kind, name = resource["resource_type"], resource["resource_name"]
    if kind == RESOURCE_TOPIC:
        topic = md.topics.get(name)
        if topic is None:
            raise _Refused(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic '{name}' does not exist")
        return topic.configs
    if kind == RESOURCE_BROKER:
        if name != CLUSTER_DEFAULT and not name.isdigit():
            raise _Refused(
                ErrorCode.INVALID_REQUEST,
                f"broker resource '{name}': a broker id, or '' for the cluster-wide default",
            )
        return md.broker_configs.setdefault(name, {})
    raise _Refused(
        ErrorCode.INVALID_REQUEST,
        f"resource type {kind} is not served: only topics (2) and brokers (4) have configs here",
    )


def _applied(resource: dict, current: dict[str, str], replace: bool) -> dict[str, str]:
    """The resource's configs after the request's operations, every one checked."""
    ops = resource["configs"]
    names = [op["name"] for op in ops]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise _Refused(ErrorCode.INVALID_REQUEST, f"Error due to duplicate config keys: {twice}")
    is_topic = resource["resource_type"] == RESOURCE_TOPIC
    out = {} if replace else dict(current)
    for op in ops:
        key, value, kind = op["name"], op["value"], op["config_operation"]
        if kind == DELETE:
            _check(is_topic, key, None)
            out.pop(key, None)
            continue
        if kind in (APPEND, SUBTRACT):
            if not is_topic or key not in _LIST_CONFIGS:
                raise _Refused(
                    ErrorCode.INVALID_CONFIG,
                    f"config '{key}' is not a list: APPEND and SUBTRACT apply to list "
                    f"configs only ({', '.join(sorted(_LIST_CONFIGS))})",
                )
            value = _list_op(out.get(key, ""), value or "", kind)
        if value is None:
            raise _Refused(ErrorCode.INVALID_CONFIG, f"config '{key}': SET needs a value")
        _check(is_topic, key, value)
        out[key] = value
    return out


def _list_op(current: str, value: str, kind: int) -> str | None:
    items = [v for v in current.split(",") if v]
    given = [v.strip() for v in value.split(",") if v.strip()]
    if kind == APPEND:
        items += [v for v in given if v not in items]
    else:
        items = [v for v in items if v not in given]
    return ",".join(items) or None


def _check(is_topic: bool, key: str, value: str | None) -> None:
    if is_topic:
        definition = TOPIC_CONFIGS.get(key)
        if definition is None:
            raise _Refused(ErrorCode.INVALID_CONFIG, f"unknown topic config '{key}'")
        problem = None if value is None else definition.check(value)[1]
    else:
        problem = broker_config_error(key, value)
    if problem is not None:
        raise _Refused(ErrorCode.INVALID_CONFIG, problem)


def _result(resource: dict, code: ErrorCode, message: str | None) -> dict:
    return {
        "resource_type": resource["resource_type"],
        "resource_name": resource["resource_name"],
        "error_code": int(code),
        "error_message": message,
    }
