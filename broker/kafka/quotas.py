"""The Kafka listener's AlterClientQuotas and DescribeClientQuotas: the native APIs have
Kafka's shapes, so the translation is a rename of a few fields (Describe's values are a
list of key/value pairs on Kafka's wire, a map on ours)."""

from __future__ import annotations

from typing import Any

from minibroker.broker.network.pending import then
from minibroker.protocol import ApiKey
from minibroker.protocol.kafka import KafkaApi


class QuotaApis:
    """Mixed into KafkaRequestHandler (``_native``)."""

    _native: Any

    def quota_handlers(self) -> dict[int, Any]:
        return {
            KafkaApi.ALTER_CLIENT_QUOTAS: self.alter_client_quotas,
            KafkaApi.DESCRIBE_CLIENT_QUOTAS: self.describe_client_quotas,
        }

    def alter_client_quotas(self, header, body, session) -> Any:
        native = {"entries": body["entries"], "validate_only": body["validate_only"]}
        result = self._native(header, ApiKey.ALTER_CLIENT_QUOTAS, native, session)

        def answer(out: dict) -> dict:
            if "entries" in out:
                return {"entries": out["entries"]}
            # The whole request refused (bad body, no controller): every entry says why.
            error = {"error_code": out["error_code"], "error_message": out.get("error_message")}
            return {"entries": [{"entity": e["entity"], **error} for e in body["entries"]]}

        return then(result, answer)

    def describe_client_quotas(self, header, body, session) -> Any:
        native = {"components": body["components"], "strict": body["strict"]}
        result = self._native(header, ApiKey.DESCRIBE_CLIENT_QUOTAS, native, session)

        def answer(out: dict) -> dict:
            entries = out.get("entries")
            return {
                "error_code": out["error_code"],
                "error_message": out.get("error_message"),
                "entries": None
                if entries is None
                else [
                    {
                        "entity": e["entity"],
                        "values": [{"key": k, "value": v} for k, v in e["values"].items()],
                    }
                    for e in entries
                ],
            }

        return then(result, answer)
