"""`minibroker configs alter|describe`: kafka-configs.sh's shape.

Only client quotas (``--entity-type clients|users``) are served here for now; each entity
type's handling lives in its own module (client quotas: deploy/quota_configs_cli.py), and
this command only parses the shared options and dispatches on the entity type.
"""

from __future__ import annotations

import argparse

from minibroker.deploy import quota_configs_cli
from minibroker.deploy.client_cli import CliError, _cmd, _common

ENTITY_TYPES = tuple(quota_configs_cli.QUOTA_ENTITY_TYPES)


def add_arguments(configs: argparse.ArgumentParser) -> None:
    """`minibroker configs alter|describe` (the `configs` parser is made by deploy/cli.py)."""
    sub = configs.add_subparsers(dest="configs_command", required=True, metavar="ACTION")
    alter = sub.add_parser("alter", help="add or delete configs of an entity")
    describe = sub.add_parser("describe", help="show configs of an entity (or every one)")
    for p in (alter, describe):
        p.add_argument(
            "--entity-type",
            action="append",
            choices=ENTITY_TYPES,
            help="clients or users; both (each with its name) for a (user, client-id) entity",
        )
        p.add_argument("--entity-name", action="append", help="the entity's name (in order)")
        p.add_argument(
            "--entity-default",
            action="store_true",
            help="the <default> entity of the (last) type instead of a name",
        )
        _common(p)
        p.set_defaults(func=_cmd(_run))
    alter.add_argument("--add-config", metavar="K=V,K=V", help="e.g. producer_byte_rate=1048576")
    alter.add_argument(
        "--delete-config", action="append", metavar="K,K", help="keys to remove (repeatable)"
    )


async def _run(args: argparse.Namespace) -> int:
    types = set(args.entity_type or ())
    if types <= set(quota_configs_cli.QUOTA_ENTITY_TYPES):
        return await quota_configs_cli.run(args)
    raise CliError(f"--entity-type {', '.join(sorted(types))} is not served")
