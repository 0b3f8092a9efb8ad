"""Client quotas through the admin client (Kafka's Admin.alterClientQuotas and
describeClientQuotas): an entity is ``{"user": name, "client-id": name}`` with either
part absent, and a ``None`` name for the ``<default>`` entity."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping

from minibroker.protocol import ApiKey
from minibroker.protocol.errors import error_class

Entity = Mapping[str, str | None]
ANY = object()  # a describe filter matching every name of an entity type
Request = Callable[[int, dict, float], Awaitable[dict]]


def _wire_entity(entity: Entity) -> list[dict]:
    return [{"entity_type": t, "entity_name": n} for t, n in entity.items()]


async def alter_client_quotas(
    request: Request,
    entity: Entity,
    add: Mapping[str, float] | None = None,
    delete: Iterable[str] = (),
    *,
    validate_only: bool = False,
    timeout: float = 30.0,
) -> None:
    """Set ``add``'s values and remove ``delete``'s keys on ``entity``; raises the broker's
    error (InvalidRequest naming the bad key or value) if it refused the change."""
    ops = [{"key": k, "value": float(v), "remove": False} for k, v in (add or {}).items()]
    ops += [{"key": k, "value": 0.0, "remove": True} for k in delete]
    body = {
        "entries": [{"entity": _wire_entity(entity), "ops": ops}],
        "validate_only": validate_only,
    }
    answer = await request(ApiKey.ALTER_CLIENT_QUOTAS, body, timeout)
    for entry in answer["entries"]:
        if entry["error_code"]:
            raise error_class(entry["error_code"])(entry.get("error_message") or str(entity))


async def describe_client_quotas(
    request: Request,
    components: Mapping[str, object],
    *,
    strict: bool = False,
    timeout: float = 30.0,
) -> list[tuple[dict[str, str | None], dict[str, float]]]:
    """Entities matching ``components`` (``{entity type: name, None (the default) or
    ANY}``) with their quota values."""
    wire = []
    for kind, name in components.items():
        if name is ANY:
            wire.append({"entity_type": kind, "match_type": 2, "match": None})
        elif name is None:
            wire.append({"entity_type": kind, "match_type": 1, "match": None})
        else:
            wire.append({"entity_type": kind, "match_type": 0, "match": name})
    answer = await request(
        ApiKey.DESCRIBE_CLIENT_QUOTAS, {"components": wire, "strict": strict}, timeout
    )
    if answer["error_code"]:
        raise error_class(answer["error_code"])(answer.get("error_message") or "")
    return [
        ({e["entity_type"]: e["entity_name"] for e in entry["entity"]}, dict(entry["values"]))
        for entry in answer["entries"] or ()
    ]
