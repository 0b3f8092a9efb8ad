"""AlterClientQuotas on the controller (Kafka's ClientQuotaControlManager): each entry is
validated whole, then its values are set or removed on the draft metadata, so the
change goes to every broker as ClientQuotaRecords (broker/metadata/records.py).

An entry with any bad op changes nothing and answers INVALID_REQUEST naming the op, as
Kafka's; the other entries of the request are applied.
"""

from __future__ import annotations

from minibroker.broker.metadata.image import QuotaKey, quota_key
from minibroker.broker.quota import QuotaEntity, QuotaError, validate_quota
from minibroker.protocol.errors import ErrorCode


def entry_changes(entry: dict) -> tuple[QuotaKey, list[tuple[str, float | None]]]:
    """The entity and its (key, value or None to remove) changes; QuotaError if refused."""
    parts: dict[str, str | None] = {}
    for e in entry["entity"]:
        if e["entity_type"] in parts:
            raise QuotaError(f"entity type {e['entity_type']} appears twice")
        parts[e["entity_type"]] = e["entity_name"]
    QuotaEntity.of(parts)  # the checks on types and names
    changes: list[tuple[str, float | None]] = []
    seen = set()
    for op in entry["ops"]:
        key = op["key"]
        if key in seen:
            raise QuotaError(f"configuration key {key} appears twice")
        seen.add(key)
        if op["remove"]:
            validate_quota(key, 1.0)  # the key must still be one of Kafka's
            changes.append((key, None))
        else:
            changes.append((key, float(validate_quota(key, op["value"]))))
    return quota_key(parts.items()), changes


def apply_entries(quotas: dict, entries: list[dict], validate_only: bool) -> tuple[list, bool]:
    """Apply ``entries`` to ``quotas`` (the draft's client_quotas): the per-entry results
    (Kafka's AlterClientQuotas answer) and whether anything changed."""
    results = []
    changed = False
    for entry in entries:
        result = {"entity": entry["entity"], "error_code": 0, "error_message": None}
        try:
            entity, changes = entry_changes(entry)
        except QuotaError as exc:
            result["error_code"] = int(ErrorCode.INVALID_REQUEST)
            result["error_message"] = str(exc)
            results.append(result)
            continue
        if not validate_only:
            values = dict(quotas.get(entity, {}))
            for key, value in changes:
                if value is None:
                    values.pop(key, None)
                else:
                    values[key] = value
            if values != quotas.get(entity, {}):
                changed = True
                if values:
                    quotas[entity] = values
                else:
                    quotas.pop(entity, None)
        results.append(result)
    return results, changed
