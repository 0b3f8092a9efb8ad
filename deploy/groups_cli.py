"""`minibroker groups list|describe|delete|reset-offsets`: Kafka's kafka-consumer-groups."""

from __future__ import annotations

import argparse
from typing import Any

from minibroker.client import Admin
from minibroker.client.records import TopicPartition
from minibroker.deploy.client_cli import CliError, _cmd, _common, _settings
from minibroker.deploy.tables import print_table
from minibroker.protocol import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from minibroker.protocol.errors import GroupIdNotFound


def add_arguments(groups: argparse.ArgumentParser) -> None:
    sub = groups.add_subparsers(dest="groups_command", required=True, metavar="ACTION")
    lst = sub.add_parser("list", help="every group with its state")
    lst.set_defaults(func=_cmd(_list))
    describe = sub.add_parser(
        "describe", help="members, assignment, committed offset, log end and lag per partition"
    )
    describe.add_argument("group", help="the group's id (group.id)")
    describe.set_defaults(func=_cmd(_describe))
    delete = sub.add_parser("delete", help="delete an empty group and its offsets")
    delete.add_argument("group", help="the group's id; it must have no members")
    delete.set_defaults(func=_cmd(_delete))
    reset = sub.add_parser("reset-offsets", help="set an empty group's committed offsets")
    reset.add_argument("group", help="the group's id; it must have no members")
    reset.add_argument("--topic", required=True, help="reset this topic's partitions (all of them)")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="to each partition's log start")
    to.add_argument("--to-latest", action="store_true", help="to each partition's log end")
    to.add_argument("--to-offset", type=int, metavar="N", help="to offset N in every partition")
    reset.set_defaults(func=_cmd(_reset))
    for p in (lst, describe, delete, reset):
        _common(p)


async def _list(args: argparse.Namespace) -> int:
    async with Admin(config=_settings(args)) as admin:
        groups = await admin.list_consumer_groups()
    for g in groups:
        print(f"{g.group_id}\t{g.state}")
    return 0


async def describe_rows(admin: Admin, group_id: str) -> tuple[Any, list[dict]]:
    """The group and one row per partition with a commit or an owner (the CLI's table)."""
    desc = await admin.describe_consumer_group(group_id)
    committed = await admin.list_consumer_group_offsets(group_id)
    owners = {tp: m for m in desc.members for tp in m.assignment}
    partitions = sorted(set(committed) | set(owners))
    ends = await _offsets(admin, partitions, LATEST_TIMESTAMP)
    rows = []
    for tp in partitions:
        offset = committed.get(tp, -1)
        end = ends.get(tp, -1)
        member = owners.get(tp)
        rows.append(
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "current_offset": offset if offset >= 0 else None,
                "log_end_offset": end,
                "lag": end - offset if offset >= 0 and end >= 0 else None,
                "consumer_id": member.member_id if member else None,
                "host": member.host if member else None,
                "client_id": member.client_id if member else None,
                "group_instance_id": member.group_instance_id if member else None,
            }
        )
    return desc, rows


async def _describe(args: argparse.Namespace) -> int:
    async with Admin(config=_settings(args)) as admin:
        desc, rows = await describe_rows(admin, args.group)
    if desc.state == "Dead" and not desc.members and not rows:
        # DescribeGroups answers Dead for a group it has never heard of; with no members
        # and no committed offsets there is nothing to describe (kafka-consumer-groups
        # says the same: "Consumer group ... does not exist").
        raise GroupIdNotFound(
            f"group '{args.group}' does not exist: 'minibroker groups list' shows the groups"
        )
    print(
        f"GROUP {desc.group_id}  STATE {desc.state}  PROTOCOL {desc.protocol or '-'}  "
        f"MEMBERS {len(desc.members)}"
    )
    header = (
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
        "CONSUMER-ID",
        "HOST",
        "CLIENT-ID",
        "GROUP-INSTANCE-ID",
    )
    keys = (
        "topic",
        "partition",
        "current_offset",
        "log_end_offset",
        "lag",
        "consumer_id",
        "host",
        "client_id",
        "group_instance_id",
    )
    print_table(header, [[r[k] for k in keys] for r in rows])
    return 0


async def _delete(args: argparse.Namespace) -> int:
    async with Admin(config=_settings(args)) as admin:
        error = (await admin.delete_consumer_groups([args.group]))[args.group]
    if error is not None:
        raise error
    print(f"Deleted group {args.group}.")
    return 0


async def _offsets(admin: Admin, partitions: list[TopicPartition], ts: int) -> dict:
    if not partitions:
        return {}
    found = await admin.list_offsets({tp: ts for tp in partitions})
    return {tp: r.offset for tp, r in found.items()}


async def _reset(args: argparse.Namespace) -> int:
    async with Admin(config=_settings(args)) as admin:
        topics = await admin.describe_topics([args.topic])
        if args.topic not in topics:
            raise CliError(f"topic '{args.topic}' does not exist")
        partitions = [
            TopicPartition(args.topic, p.partition) for p in topics[args.topic].partitions
        ]
        if args.to_offset is not None:
            target = {tp: args.to_offset for tp in partitions}
        else:
            ts = EARLIEST_TIMESTAMP if args.to_earliest else LATEST_TIMESTAMP
            target = await _offsets(admin, partitions, ts)
        await admin.alter_consumer_group_offsets(args.group, dict(target))
    for tp, offset in sorted(target.items()):
        print(f"{args.group}\t{tp.topic}\t{tp.partition}\t{offset}")
    return 0
