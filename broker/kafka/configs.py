"""The Kafka listener's config APIs (DescribeConfigs, IncrementalAlterConfigs and
AlterConfigs) and its what-a-broker-holds APIs (DescribeLogDirs, DescribeProducers), each
translated onto the native API (broker/metadata/config_view.py answers
describes, the controller decides alterations: broker/controller/configs.py).

AlterConfigs is the native IncrementalAlterConfigs with ``replace`` (the given set becomes
the resource's whole dynamic config, Kafka's legacy semantics); a request-wide failure
(no controller, the deadline) is named on every resource.
"""

from __future__ import annotations

from typing import Any

from minibroker.broker.network.pending import then
from minibroker.protocol import ApiKey
from minibroker.protocol.kafka import KafkaApi

_DEFAULT_CONFIG = 5  # ConfigSource: what v0's is_default says
_SET = 0


class ConfigApis:
    """Mixed into KafkaRequestHandler (``_native``, ``_controller_change``)."""

    _native: Any
    _controller_change: Any

    def config_handlers(self) -> dict[int, Any]:
        return {
            KafkaApi.DESCRIBE_CONFIGS: self.describe_configs,
            KafkaApi.INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
            KafkaApi.ALTER_CONFIGS: self.alter_configs,
            KafkaApi.DESCRIBE_LOG_DIRS: self.describe_log_dirs,
            KafkaApi.DESCRIBE_PRODUCERS: self.describe_producers,
        }

    def describe_configs(self, header, body, session) -> Any:
        native = {
            "resources": [
                {
                    "resource_type": r["resource_type"],
                    "resource_name": r["resource_name"],
                    "configuration_keys": r["configuration_keys"],
                }
                for r in body["resources"]
            ],
            "include_synonyms": body.get("include_synonyms", False),
            "include_documentation": body.get("include_documentation", False),
        }
        result = self._native(header, ApiKey.DESCRIBE_CONFIGS, native, session)

        def answer(a: dict) -> dict:
            results = a.get("results")
            if results is None:  # a request-wide refusal: named on every resource
                error = {"error_code": a["error_code"], "error_message": a.get("error_message")}
                results = [{**r, **error, "configs": []} for r in native["resources"]]
            for r in results:
                r["configs"] = [
                    {**c, "is_default": c["config_source"] == _DEFAULT_CONFIG}
                    for c in r.get("configs", ())
                ]
            return {"throttle_time_ms": 0, "results": results}

        return then(result, answer)

    def incremental_alter_configs(self, header, body, session) -> Any:
        resources = [
            {
                "resource_type": r["resource_type"],
                "resource_name": r["resource_name"],
                "configs": [
                    {"name": c["name"], "config_operation": c["config_operation"], "value": c["value"]}
                    for c in r["configs"]
                ],
            }
            for r in body["resources"]
        ]  # fmt: skip
        return self._alter(header, session, resources, body["validate_only"], False)

    def alter_configs(self, header, body, session) -> Any:
        resources = [
            {
                "resource_type": r["resource_type"],
                "resource_name": r["resource_name"],
                "configs": [
                    {"name": c["name"], "config_operation": _SET, "value": c["value"]}
                    for c in r["configs"]
                ],
            }
            for r in body["resources"]
        ]
        return self._alter(header, session, resources, body["validate_only"], True)

    def _alter(self, header, session, resources: list, validate_only: bool, replace: bool) -> Any:
        native = {
            "resources": resources,
            "validate_only": validate_only,
            "replace": replace,
            "timeout_ms": 30000,
        }
        result: Any = {"responses": []}
        if resources:
            result = self._controller_change(
                header, ApiKey.INCREMENTAL_ALTER_CONFIGS, native, session, "the config change",
                "describe the configs",
            )  # fmt: skip

        def answer(a: dict) -> dict:
            responses = a.get("responses")
            if responses is None:
                error = {"error_code": a["error_code"], "error_message": a.get("error_message")}
                responses = [
                    {"resource_type": r["resource_type"], "resource_name": r["resource_name"], **error}
                    for r in resources
                ]  # fmt: skip
            return {"throttle_time_ms": 0, "responses": responses}

        return then(result, answer)

    # --- what a broker holds: Kafka's shapes already, so only the request-wide refusal ------

    def describe_log_dirs(self, header, body, session) -> Any:
        topics = body["topics"]
        native = {
            "topics": None
            if topics is None
            else [{"topic": t["topic"], "partitions": t["partitions"]} for t in topics]
        }
        result = self._native(header, ApiKey.DESCRIBE_LOG_DIRS, native, session)

        def answer(a: dict) -> dict:
            if "results" not in a:
                return {"throttle_time_ms": 0, "error_code": a["error_code"], "results": []}
            return {"throttle_time_ms": 0, "error_code": 0, "results": a["results"]}

        return then(result, answer)

    def describe_producers(self, header, body, session) -> Any:
        native = {
            "topics": [
                {"name": t["name"], "partition_indexes": t["partition_indexes"]}
                for t in body["topics"]
            ]
        }
        result = self._native(header, ApiKey.DESCRIBE_PRODUCERS, native, session)

        def answer(a: dict) -> dict:
            topics = a.get("topics")
            if topics is None:  # a request-wide refusal, named on every partition
                error = {"error_code": a["error_code"], "error_message": a.get("error_message")}
                topics = [
                    {
                        "name": t["name"],
                        "partitions": [
                            {"partition_index": i, **error, "active_producers": []}
                            for i in t["partition_indexes"]
                        ],
                    }
                    for t in native["topics"]
                ]
            for t in topics:
                for p in t["partitions"]:
                    p.setdefault("active_producers", [])
                    p.setdefault("error_message", None)
            return {"throttle_time_ms": 0, "topics": topics}

        return then(result, answer)
