"""Broker configs altered at runtime (Kafka's DynamicBrokerConfig), and where each value of a
described config comes from.

A broker's settings are layered, as Kafka's: a per-broker dynamic value (IncrementalAlter-
Configs on broker resource "<id>") over the cluster-wide dynamic default (resource "") over
the broker's own file (static) over the built-in default. The dynamic layers live in the
metadata log (ConfigRecords), so every broker reads the same ones and a restart keeps them.

Only the keys in DYNAMIC_BROKER_KEYS may be altered: Kafka's dynamically reconfigurable
log settings (DynamicLogConfig: the broker defaults of topic configs) and the few others we
apply live. ``DynamicBrokerConfig`` is the BrokerConfig every subsystem holds: reconfigured
in place when the metadata changes, so a lookup costs what it did (one dict read).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from minibroker.broker.common.config import DEFS, BrokerConfig, ConfigError, _coerce
from minibroker.broker.common.topic_config import TOPIC_CONFIGS

# Kafka's ConfigSource numbers (DescribeConfigs v1+).
DYNAMIC_TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# The broker default of every topic config (Kafka's DynamicLogConfig.ReconfigurableConfigs),
# applied live to every log without its own override; plus the cluster's own.
DYNAMIC_BROKER_KEYS = frozenset(
    {d.broker_key for d in TOPIC_CONFIGS.values() if d.broker_key}
    | {"unclean.leader.election.enable"}  # read by the controller at each election
    # Kafka's DynamicConfig.Broker: read by the replication quotas at every check.
    | {"leader.replication.throttled.rate", "follower.replication.throttled.rate"}
) & frozenset(DEFS)

# A broker resource named "" is the cluster-wide default (Kafka's <default> entity).
CLUSTER_DEFAULT = ""


def broker_config_error(key: str, value: str | None) -> str | None:
    """Why ``key = value`` cannot be set on a broker resource (None: it can; ``value`` None:
    a deletion, which only needs the key to be alterable)."""
    if key not in DEFS:
        return f"unknown broker config '{key}'"
    if key not in DYNAMIC_BROKER_KEYS:
        return (
            f"broker config '{key}' cannot be altered dynamically: set it in the broker's "
            "config file (alterable: see docs/admin.md)"
        )
    if value is None:
        return None
    try:
        _coerce(key, DEFS[key], value)
    except ConfigError as exc:
        return str(exc)
    return None


class DynamicBrokerConfig(BrokerConfig):
    """A BrokerConfig whose dynamic layers the metadata sets (``reconfigure``)."""

    def __init__(self, static: BrokerConfig) -> None:
        self.static = static
        self.explicit = static.explicit
        self._values = dict(static._values)
        self.cluster_default: dict[str, str] = {}
        self.per_broker: dict[str, str] = {}

    def reconfigure(
        self, cluster_default: Mapping[str, str], per_broker: Mapping[str, str]
    ) -> set[str]:
        """Take the metadata's dynamic layers; the keys whose effective value changed.
        A stored value that no longer passes (an older version's) is skipped, never fatal."""
        values = dict(self.static._values)
        for layer in (cluster_default, per_broker):
            for key, text in layer.items():
                if key in DYNAMIC_BROKER_KEYS:
                    try:
                        values[key] = _coerce(key, DEFS[key], text)
                    except ConfigError:
                        continue
        changed = {k for k, v in values.items() if self._values.get(k) != v}
        self.cluster_default = dict(cluster_default)
        self.per_broker = dict(per_broker)
        self._values = values
        return changed

    def source(self, key: str) -> int:
        """Kafka's ConfigSource of ``key``'s effective value on this broker."""
        if key in self.per_broker:
            return DYNAMIC_BROKER_CONFIG
        if key in self.cluster_default:
            return DYNAMIC_DEFAULT_BROKER_CONFIG
        if key in self.static.explicit:
            return STATIC_BROKER_CONFIG
        return DEFAULT_CONFIG

    def synonyms(self, key: str) -> list[tuple[str, Any, int]]:
        """Every layer that sets ``key``, the winning one first (Kafka's synonyms)."""
        out: list[tuple[str, Any, int]] = []
        if key in self.per_broker:
            out.append((key, self.per_broker[key], DYNAMIC_BROKER_CONFIG))
        if key in self.cluster_default:
            out.append((key, self.cluster_default[key], DYNAMIC_DEFAULT_BROKER_CONFIG))
        if key in self.static.explicit:
            out.append((key, self.static[key], STATIC_BROKER_CONFIG))
        out.append((key, DEFS[key].default, DEFAULT_CONFIG))
        return out


def config_text(value: Any) -> str:
    """A config value as Kafka shows it (booleans lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
