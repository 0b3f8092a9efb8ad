"""`minibroker transactions list|describe`: Kafka's kafka-transactions.sh, with its columns.

``list`` asks every broker for the transactional ids it coordinates (ListTransactions);
``describe`` asks one id's coordinator (DescribeTransactions), so it shows what that
coordinator has decided: a commit still writing its markers is PrepareCommit.
"""

from __future__ import annotations

import argparse
import time

from minibroker.client import Admin
from minibroker.client.txn_admin import TRANSACTION_STATES
from minibroker.deploy.client_cli import _cmd, _common, _settings
from minibroker.deploy.tables import print_table
from minibroker.protocol.errors import TransactionalIdNotFound

LIST_HEADER = ("TransactionalId", "Coordinator", "ProducerId", "TransactionState")
DESCRIBE_HEADER = (
    "CoordinatorId",
    "TransactionalId",
    "ProducerId",
    "ProducerEpoch",
    "TransactionState",
    "TransactionTimeoutMs",
    "CurrentTransactionStartTimeMs",
    "TransactionDurationMs",
    "TopicPartitions",
)


def add_arguments(transactions: argparse.ArgumentParser) -> None:
    """`minibroker transactions list|describe` (the parser is made by deploy/cli.py)."""
    sub = transactions.add_subparsers(dest="transactions_command", required=True, metavar="ACTION")
    lst = sub.add_parser("list", help="every transactional id, its coordinator and state")
    lst.add_argument(
        "--state",
        action="append",
        default=[],
        choices=TRANSACTION_STATES,
        metavar="STATE",
        help="only ids in this state (repeatable): " + ", ".join(TRANSACTION_STATES),
    )
    lst.add_argument(
        "--producer-id",
        action="append",
        default=[],
        type=int,
        metavar="ID",
        help="only ids with this producer id (repeatable)",
    )
    lst.add_argument(
        "--duration-filter",
        type=int,
        default=-1,
        metavar="MS",
        help="only transactions open longer than MS milliseconds; -1: every id",
    )
    lst.set_defaults(func=_cmd(_list))
    describe = sub.add_parser(
        "describe", help="one transactional id's producer, state, timeout and partitions"
    )
    describe.add_argument(
        "--transactional-id", required=True, metavar="ID", help="the producer's transactional.id"
    )
    describe.set_defaults(func=_cmd(_describe))
    for p in (lst, describe):
        _common(p)


async def _list(args: argparse.Namespace) -> int:
    async with Admin(config=_settings(args)) as admin:
        listings = await admin.list_transactions(args.state, args.producer_id, args.duration_filter)
    print_table(
        LIST_HEADER,
        [(t.transactional_id, t.coordinator_id, t.producer_id, t.state) for t in listings],
    )
    return 0


async def _describe(args: argparse.Namespace) -> int:
    transactional_id = args.transactional_id
    async with Admin(config=_settings(args)) as admin:
        try:
            d = (await admin.describe_transactions([transactional_id]))[transactional_id]
        except TransactionalIdNotFound:
            raise TransactionalIdNotFound(
                f"transactional.id '{transactional_id}' is not known to its coordinator "
                "(never initialised, or expired): 'minibroker transactions list' shows the ids"
            ) from None
    start = d.transaction_start_time_ms
    print_table(
        DESCRIBE_HEADER,
        [
            (
                d.coordinator_id,
                d.transactional_id,
                d.producer_id,
                d.producer_epoch,
                d.state,
                d.transaction_timeout_ms,
                start,
                None if start is None else int(time.time() * 1000) - start,
                ",".join(f"{tp.topic}-{tp.partition}" for tp in d.topic_partitions) or None,
            )
        ],
    )
    return 0
