"""`minibroker configs describe|alter`: kafka-configs.sh's shape.

    minibroker configs describe --entity-type topics --entity-name orders [--all]
    minibroker configs alter --entity-type topics --entity-name orders \\
        --add-config retention.ms=60000,cleanup.policy=[compact,delete] --delete-config segment.ms
    minibroker configs alter --entity-type brokers --entity-default --add-config log.retention.ms=1000

An entity type is one row of ENTITY_TYPES: how to describe and how to alter an entity of
that type. Topics and brokers are configs (DescribeConfigs, IncrementalAlterConfigs);
client quotas (``--entity-type clients|users``, where a (user, client-id) entity gives
both types, each with its name) are handed whole to deploy/quota_configs_cli.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from minibroker.client import Admin, AlterConfigOp, ConfigResource
from minibroker.deploy import quota_configs_cli
from minibroker.deploy.client_cli import CliError, _cmd, _common, _settings

# describe(admin, entity name or None for the default, every config?) -> lines to print
Describe = Callable[[Admin, str | None, bool], Awaitable[list[str]]]
# alter(admin, entity name or None, {key: value} to set, keys to delete)
Alter = Callable[[Admin, str | None, dict[str, str], list[str]], Awaitable[None]]


@dataclass(frozen=True)
class EntityType:
    describe: Describe
    alter: Alter
    default_allowed: bool  # --entity-default means something for this type
    what: str  # how an entity is named in messages


def _resource(kind: str, name: str | None) -> ConfigResource:
    return ConfigResource(kind, "" if name is None else name)


def _config_type(kind: str) -> tuple[Describe, Alter]:
    """Describe and alter for an entity type that is a ConfigResource type."""

    async def describe(admin: Admin, name: str | None, everything: bool) -> list[str]:
        resource = _resource(kind, name)
        entries = (await admin.describe_configs([resource]))[resource]
        lines = []
        for entry in entries.values():
            dynamic = entry.source.startswith("DYNAMIC_")
            if everything or dynamic:
                lines.append(f"  {entry.name}={entry.value} ({entry.source})")
        return lines

    async def alter(admin: Admin, name: str | None, add: dict[str, str], delete: list[str]) -> None:
        ops = [AlterConfigOp(k, v) for k, v in add.items()]
        ops += [AlterConfigOp(k, None, "delete") for k in delete]
        await admin.incremental_alter_configs({_resource(kind, name): ops})

    return describe, alter


ENTITY_TYPES: dict[str, EntityType] = {
    "topics": EntityType(*_config_type("topic"), default_allowed=False, what="topic"),
    "brokers": EntityType(*_config_type("broker"), default_allowed=True, what="broker"),
}


def parse_add_config(text: str) -> dict[str, str]:
    """``k=v,k2=[a,b]`` -> ``{"k": "v", "k2": "a,b"}`` (kafka-configs.sh's brackets group a
    list value's commas)."""
    out: dict[str, str] = {}
    items: list[str] = []
    depth, current = 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    items.append(current)
    for item in filter(None, (i.strip() for i in items)):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise CliError(f"--add-config: expected key=value, got {item!r}")
        out[key.strip()] = value.strip().removeprefix("[").removesuffix("]")
    return out


def add_arguments(configs: argparse.ArgumentParser) -> None:
    sub = configs.add_subparsers(dest="configs_command", required=True, metavar="ACTION")
    describe = sub.add_parser("describe", help="an entity's dynamic configs (--all: every one)")
    describe.add_argument("--all", action="store_true", help="every config with its source")
    describe.set_defaults(func=_cmd(_describe))
    alter = sub.add_parser("alter", help="set or delete an entity's dynamic configs")
    alter.add_argument(
        "--add-config", default="", metavar="K=V[,K=V]", help="configs to set ([a,b]: a list)"
    )
    alter.add_argument(
        "--delete-config",
        action="append",
        default=[],
        metavar="K[,K]",
        help="configs to remove (repeatable)",
    )
    alter.set_defaults(func=_cmd(_alter))
    for p in (describe, alter):
        p.add_argument(
            "--entity-type",
            action="append",
            required=True,
            choices=sorted(ENTITY_TYPES) + sorted(quota_configs_cli.QUOTA_ENTITY_TYPES),
            help="topics, brokers, clients or users; users and clients both (each with its "
            "name) for a (user, client-id) quota entity",
        )
        p.add_argument(
            "--entity-name",
            action="append",
            help="topic name, broker id, client id or user (in the order of the types)",
        )
        p.add_argument(
            "--entity-default",
            action="store_true",
            help="the default entity: the cluster-wide broker default, or <default> of the "
            "(last) quota type",
        )
        _common(p)


def _quotas(args: argparse.Namespace) -> bool:
    """Every type given is a client-quota type: the whole command is quota_configs_cli's."""
    return set(args.entity_type) <= set(quota_configs_cli.QUOTA_ENTITY_TYPES)


def _entity(args: argparse.Namespace) -> tuple[EntityType, str | None, str]:
    if len(args.entity_type) != 1 or args.entity_type[0] not in ENTITY_TYPES:
        raise CliError("give one --entity-type for topics or brokers (not mixed with quotas)")
    kind = ENTITY_TYPES[args.entity_type[0]]
    names = args.entity_name or []
    if len(names) + args.entity_default != 1:
        raise CliError("give one --entity-name, or --entity-default")
    if args.entity_default and not kind.default_allowed:
        raise CliError(f"--entity-default is not valid for --entity-type {args.entity_type[0]}")
    name = None if args.entity_default else names[0]
    label = f"default {kind.what}" if name is None else f"{kind.what} {name}"
    return kind, name, label


async def _describe(args: argparse.Namespace) -> int:
    if _quotas(args):
        return await quota_configs_cli.run(args)
    kind, name, label = _entity(args)
    async with Admin(config=_settings(args)) as admin:
        lines = await kind.describe(admin, name, args.all)
    print(f"{'All' if args.all else 'Dynamic'} configs for {label} are:")
    for line in lines:
        print(line)
    return 0


async def _alter(args: argparse.Namespace) -> int:
    if _quotas(args):
        return await quota_configs_cli.run(args)
    kind, name, label = _entity(args)
    add = parse_add_config(args.add_config)
    delete = [k.strip() for d in args.delete_config for k in d.split(",") if k.strip()]
    if not add and not delete:
        raise CliError("nothing to change: give --add-config and/or --delete-config")
    async with Admin(config=_settings(args)) as admin:
        await kind.alter(admin, name, add, delete)
    print(f"Completed updating config for {label}.")
    return 0
