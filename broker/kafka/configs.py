"""The Kafka listener's config APIs: DescribeConfigs, IncrementalAlterConfigs and
AlterConfigs, each translated onto the native API (broker/metadata/config_view.py answers
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
