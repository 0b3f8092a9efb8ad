"""Client quota entities, their configured values and Kafka's order of precedence.

An entity is a user, a client id, or a (user, client id) pair; either name may be the
default (``None`` here, ``<default>`` on the command line, a null name in Kafka's
ClientQuotaRecord). A connection is matched by the most specific entity configured for
a quota type, in Kafka's order (ClientQuotaManager's DefaultQuotaCallback):

1. users/<user>/clients/<client-id>      5. users/<default>/clients/<default>
2. users/<user>/clients/<default>        6. users/<default>
3. users/<user>                          7. clients/<client-id>
4. users/<default>/clients/<client-id>   8. clients/<default>

The matched entity also names the *rate* the connection is counted in: every client id
under clients/<default> has a rate of its own, as in Kafka (its metric tags), while all
client ids of users/<user> share the user's.
"""

from __future__ import annotations

from dataclasses import dataclass

USER = "user"
CLIENT_ID = "client-id"
DEFAULT = "<default>"  # how the command line and describe output name a default entity

# Kafka's QuotaConfig keys, with the kind of number each takes (ClientQuotaControlManager).
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
QUOTA_KEYS = {
    PRODUCER_BYTE_RATE: int,
    CONSUMER_BYTE_RATE: int,
    REQUEST_PERCENTAGE: float,
    CONTROLLER_MUTATION_RATE: float,
}
_LONG_MAX = 2**63 - 1


class QuotaError(ValueError):
    """An entity or quota value Kafka refuses with INVALID_REQUEST; the message says why."""


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """``user``/``client_id``: a name, None for the default, or absent (``has_*`` False)."""

    user: str | None = None
    client_id: str | None = None
    has_user: bool = False
    has_client_id: bool = False

    @classmethod
    def of(cls, parts: dict[str, str | None]) -> QuotaEntity:
        """From ``{entity_type: name or None}`` (the wire's entity list)."""
        unknown = set(parts) - {USER, CLIENT_ID}
        if unknown:
            raise QuotaError(f"unsupported quota entity type(s): {', '.join(sorted(unknown))}")
        if not parts:
            raise QuotaError("Invalid empty client quota entity")
        for kind, name in parts.items():
            if name is not None and not name:
                raise QuotaError(f"an entity name for {kind} may not be empty (default: null)")
        return cls(parts.get(USER), parts.get(CLIENT_ID), USER in parts, CLIENT_ID in parts)

    def parts(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        if self.has_user:
            out[USER] = self.user
        if self.has_client_id:
            out[CLIENT_ID] = self.client_id
        return out

    def __str__(self) -> str:
        return "/".join(
            f"{'users' if kind == USER else 'clients'}/{DEFAULT if name is None else name}"
            for kind, name in self.parts().items()
        )


def validate_quota(key: str, value: float) -> float | int:
    """The value as stored, or QuotaError with Kafka's wording."""
    kind = QUOTA_KEYS.get(key)
    if kind is None:
        raise QuotaError(f"Invalid configuration key {key}")
    if not value > 0.0:
        raise QuotaError(f"Quota {key} must be greater than 0")
    if kind is int:
        if value > _LONG_MAX:
            raise QuotaError(f"Proposed value for {key} is too large for a LONG.")
        if abs(value % 1.0) > 1e-6:
            raise QuotaError(f"{key} cannot be a fractional value.")
        return int(value)
    return float(value)


def _u(user: str | None) -> QuotaEntity:
    return QuotaEntity(user=user, has_user=True)


def _c(client_id: str | None) -> QuotaEntity:
    return QuotaEntity(client_id=client_id, has_client_id=True)


def _uc(user: str | None, client_id: str | None) -> QuotaEntity:
    return QuotaEntity(user, client_id, True, True)


def candidates(user: str, client_id: str) -> tuple[tuple[QuotaEntity, tuple[str, str]], ...]:
    """The entities that may match (user, client_id), most specific first, each with the
    (user, client id) tags of the rate a match is counted in."""
    both = (user, client_id)
    return (
        (_uc(user, client_id), both),
        (_uc(user, None), both),
        (_u(user), (user, "")),
        (_uc(None, client_id), both),
        (_uc(None, None), both),
        (_u(None), (user, "")),
        (_c(client_id), ("", client_id)),
        (_c(None), ("", client_id)),
    )


class QuotaConfigs:
    """Every configured client quota, by entity: what metadata records put here.

    ``version`` moves on every change, so a manager caches resolutions per connection
    identity and drops them when it changes.
    """

    def __init__(self) -> None:
        self.by_entity: dict[QuotaEntity, dict[str, float | int]] = {}
        self.version = 0
        # Quota keys with at least one entity: a key nobody configured costs nothing.
        self._count: dict[str, int] = {}

    def set(self, entity: QuotaEntity, key: str, value: float | int | None) -> None:
        """Set (``value``) or remove (None) one quota of one entity."""
        values = self.by_entity.get(entity)
        had = values is not None and key in values
        if value is None:
            if not had:
                return
            del values[key]
            if not values:
                del self.by_entity[entity]
            self._count[key] -= 1
        else:
            if values is None:
                values = self.by_entity[entity] = {}
            values[key] = value
            if not had:
                self._count[key] = self._count.get(key, 0) + 1
        self.version += 1

    def configured(self, key: str) -> bool:
        return self._count.get(key, 0) > 0

    def resolve(self, key: str, user: str, client_id: str) -> tuple[float, tuple[str, str]] | None:
        """The bound for ``key`` on a connection of (user, client_id), with the tags of the
        rate it is counted in, or None when no entity sets it."""
        by_entity = self.by_entity
        for entity, tags in candidates(user, client_id):
            values = by_entity.get(entity)
            if values is not None:
                bound = values.get(key)
                if bound is not None:
                    return float(bound), tags
        return None

    def describe(
        self, components: list[tuple[str, int, str | None]], strict: bool
    ) -> list[tuple[QuotaEntity, dict[str, float | int]]]:
        """DescribeClientQuotas' filter: each component is (entity type, match type, name)
        with Kafka's match types 0 = exact name, 1 = the default, 2 = any specified."""
        out = []
        for entity, values in self.by_entity.items():
            parts = entity.parts()
            if strict and set(parts) != {c[0] for c in components}:
                continue
            if all(_matches(parts, *component) for component in components):
                out.append((entity, dict(values)))
        return out


def _matches(parts: dict[str, str | None], kind: str, match: int, name: str | None) -> bool:
    if kind not in parts:
        return False
    if match == 0:
        return parts[kind] == name
    if match == 1:
        return parts[kind] is None
    return True  # 2: any name given for it
