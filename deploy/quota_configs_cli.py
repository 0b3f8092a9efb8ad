"""`minibroker configs ... --entity-type clients|users`: client quotas, as kafka-configs.sh
alters and describes them.

    minibroker configs alter --entity-type clients --entity-name app \\
        --add-config producer_byte_rate=1048576,consumer_byte_rate=2097152
    minibroker configs alter --entity-type users --entity-default --delete-config request_percentage
    minibroker configs describe --entity-type users --entity-name u --entity-type clients --entity-name app

``--entity-type`` and ``--entity-name`` (or ``--entity-default``) pair up in order, so a
(user, client-id) entity is both types given; the ``configs`` command (deploy/configs_cli.py)
hands every clients|users entity here (``run``).
"""

from __future__ import annotations

import argparse

from minibroker.client import Admin
from minibroker.client.quota_admin import ANY
from minibroker.deploy.client_cli import CliError, _settings

# kafka-configs.sh's entity types -> the quota entity types on the wire.
QUOTA_ENTITY_TYPES = {"clients": "client-id", "users": "user"}


def entity_of(args: argparse.Namespace, *, describe: bool) -> dict[str, object]:
    """The entity named by the command line: ``{wire type: name, None (default) or ANY}``.

    Names pair with types in order; ``--entity-default`` stands for one name (the
    ``<default>`` entity). ``describe`` may leave the names out: every entity of the type.
    """
    types = args.entity_type or []
    names: list[object] = list(args.entity_name or [])
    if args.entity_default:
        names.append(None)
    if not types:
        raise CliError("--entity-type clients|users is needed")
    if len(set(types)) != len(types):
        raise CliError("each --entity-type may be given once")
    if describe and not names:
        names = [ANY] * len(types)
    if len(names) != len(types):
        raise CliError(
            f"{len(types)} --entity-type but {len(names)} --entity-name/--entity-default: "
            "give one name (or --entity-default) per type"
        )
    return {QUOTA_ENTITY_TYPES[t]: n for t, n in zip(types, names, strict=True)}


def parse_quota_config(text: str | None) -> dict[str, float]:
    """``k=v,k=v`` as kafka-configs.sh's --add-config takes it."""
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"--add-config {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            raise CliError(f"--add-config {key.strip()}: {value!r} is not a number") from None
    return out


def _show(entity: dict[str, str | None]) -> str:
    kinds = {"user": "user-principal", "client-id": "client-id"}
    return ", ".join(
        f"{kinds.get(k, k)} '{'<default>' if n is None else n}'" for k, n in entity.items()
    )


async def run(args: argparse.Namespace) -> int:
    """``configs alter`` or ``describe`` for a clients|users entity."""
    async with Admin(config=_settings(args)) as admin:
        if args.configs_command == "alter":
            entity = entity_of(args, describe=False)
            add = parse_quota_config(args.add_config)
            delete = [k.strip() for d in args.delete_config or [] for k in d.split(",") if k]
            if not add and not delete:
                raise CliError("nothing to change: give --add-config and/or --delete-config")
            await admin.alter_client_quotas(entity, add, delete)
            print(f"Completed updating config for {_show(entity)}.")
            return 0
        found = await admin.describe_client_quotas(
            entity_of(args, describe=True),
            strict=bool(args.entity_name) or args.entity_default,
        )
    for entity, values in found:
        shown = ",".join(f"{k}={v}" for k, v in sorted(values.items()))
        print(f"Quota configs for {_show(entity)} are {shown}")
    return 0
