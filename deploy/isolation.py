"""A network partition between brokers, made of the per-broker ``isolate`` fault.

Each broker drops (never answers) requests from the peers it is told to isolate, so
cutting broker N off from brokers S takes one fault on N (drop S) and one on each
member of S (drop N): then no request crosses the cut in either direction, controller
and replication traffic alike, while clients still reach every broker. Lifting it
undoes both sides. Used by ``minibroker faults``, the pytest plugin and the nemesis.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from minibroker.client import Admin
from minibroker.protocol.errors import KafkaError


class IsolationError(ValueError):
    """An isolate that names no peers, unknown brokers, or the broker itself."""


async def broker_ids(admin: Admin) -> list[int]:
    brokers, _controller = await admin.describe_cluster()
    return [b.node_id for b in brokers]


def peers_for(broker: int, known: Iterable[int], peers: Iterable[int] | None) -> list[int]:
    """The peers to cut ``broker`` off from (default: every other known broker), checked."""
    known = set(known)
    if broker not in known:
        raise IsolationError(f"broker {broker} is not in the cluster ({sorted(known)})")
    chosen = known - {broker} if peers is None else set(peers)
    if broker in chosen:
        raise IsolationError(f"broker {broker} cannot be isolated from itself")
    if unknown := chosen - known:
        raise IsolationError(
            f"unknown broker(s) {sorted(unknown)}; the cluster has {sorted(known)}"
        )
    if not chosen:
        raise IsolationError(f"nothing to isolate broker {broker} from")
    return sorted(chosen)


async def isolate(
    admin: Admin, broker: int, peers: Iterable[int] | None = None
) -> dict[int, list[dict[str, Any]]]:
    """Cut ``broker`` off from ``peers`` (default: all others), both ways; faults per broker."""
    cut = peers_for(broker, await broker_ids(admin), peers)
    active = {broker: await admin.faults(broker, "isolate", brokers=cut)}
    for peer in cut:
        active[peer] = await admin.faults(peer, "isolate", brokers=[broker])
    return active


async def clear(
    admin: Admin, broker: int | None = None, among: Iterable[int] | None = None
) -> tuple[dict[int, list[dict[str, Any]]], dict[int, KafkaError]]:
    """Every fault on every broker; or every fault on ``broker`` and the others' isolation
    from it (so clearing the broker one isolated heals both sides of the cut).

    Sent to ``among`` (default: every broker in the metadata); a broker that cannot be
    reached (dead, paused) does not stop the others. Returns (active faults, errors) per broker.
    """
    ids = await broker_ids(admin)
    targets = ids if among is None else sorted(among)
    if broker is not None and broker not in ids:
        raise IsolationError(f"broker {broker} is not in the cluster ({sorted(ids)})")
    active: dict[int, list[dict[str, Any]]] = {}
    errors: dict[int, KafkaError] = {}
    for target in targets:
        spec = {} if broker in (None, target) else {"brokers": [broker]}
        try:
            active[target] = await admin.faults(target, "clear", **spec)
        except KafkaError as exc:
            errors[target] = exc
    return active, errors
