"""Transactions seen from outside (Kafka's Admin describeTransactions, KIP-664): each
transactional id is asked of its own coordinator, found as the producer finds it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import trio

from minibroker.client.cluster import Cluster
from minibroker.client.coordinator import COORDINATOR_ERRORS, TRANSACTION, CoordinatorRoute
from minibroker.client.records import TopicPartition
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, error_class


@dataclass(frozen=True)
class TransactionDescription:
    """Kafka's TransactionDescription: the coordinator's view of one transactional id."""

    transactional_id: str
    coordinator_id: int
    state: str  # Empty, Ongoing, PrepareCommit, CompleteCommit, ...
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int  # -1: no transaction open
    topic_partitions: list[TopicPartition] = field(default_factory=list)


async def _describe_one(
    cluster: Cluster, transactional_id: str, config: Mapping
) -> TransactionDescription:
    """The id's state as its coordinator answers now (a coordinator that moved or is still
    loading is found again, within request.timeout.ms); TRANSACTIONAL_ID_NOT_FOUND and
    the like raise."""
    route = CoordinatorRoute(cluster, transactional_id, TRANSACTION, config)
    deadline = time.monotonic() + config["request.timeout.ms"] / 1000
    while True:
        body = await route.call(
            ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": [transactional_id]}
        )
        s = body["transaction_states"][0]
        code = ErrorCode.parse(s["error_code"])
        # The answer's error is per id, so the route does not see a coordinator that
        # moved or is still loading its partition: look again, as the route would.
        if code not in COORDINATOR_ERRORS or time.monotonic() > deadline:
            break
        route.coordinator = None
        await trio.sleep(route.backoff)
    if code is not ErrorCode.NONE:
        raise error_class(code)(f"describing transactional id {transactional_id}")
    return TransactionDescription(
        transactional_id,
        -1 if route.coordinator is None else route.coordinator,
        s["transaction_state"],
        s["producer_id"],
        s["producer_epoch"],
        s["transaction_timeout_ms"],
        s["transaction_start_time_ms"],
        [TopicPartition(t["name"], p) for t in s["topics"] for p in t["partitions"]],
    )


async def describe_transactions(
    cluster: Cluster, transactional_ids: Iterable[str], config: Mapping
) -> dict[str, TransactionDescription]:
    return {t: await _describe_one(cluster, t, config) for t in transactional_ids}
