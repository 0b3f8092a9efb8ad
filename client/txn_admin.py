"""Transactions seen from outside (Kafka's Admin listTransactions and describeTransactions,
KIP-664), as Admin's methods call them.

Every broker coordinates the transactional ids of the ``__transaction_state`` partitions it
leads, so a listing asks every broker (ListTransactions) and a description asks each id's
coordinator (FindCoordinator key_type 1, then DescribeTransactions), as Kafka's handlers do.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from minibroker.client.cluster import Cluster
from minibroker.client.coordinator import COORDINATOR_ERRORS, TRANSACTION, CoordinatorRoute
from minibroker.client.records import TopicPartition
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, error_class

# Kafka's org.apache.kafka.clients.admin.TransactionState names (the coordinator's own,
# as ListTransactions filters by them and DescribeTransactions answers them). "Dead" is
# the broker's state of an expired id, which Kafka's client reads as Unknown.
TRANSACTION_STATES = (
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "PrepareEpochFence",
    "Dead",
)


@dataclass(frozen=True)
class TransactionListing:
    """Kafka's TransactionListing, with the broker that coordinates the id (what
    ListTransactionsResult.allByBrokerId keys it by, and kafka-transactions.sh shows)."""

    transactional_id: str
    producer_id: int
    state: str
    coordinator_id: int


@dataclass(frozen=True)
class TransactionDescription:
    """Kafka's TransactionDescription (transaction_start_time_ms None: none is open)."""

    transactional_id: str
    coordinator_id: int
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int | None
    topic_partitions: list[TopicPartition] = field(default_factory=list)


async def list_transactions(
    cluster: Cluster,
    config: Mapping[str, Any],
    state_filters: Iterable[str] = (),
    producer_id_filters: Iterable[int] = (),
    duration_filter_ms: int = -1,
) -> list[TransactionListing]:
    """Every broker's transactions, filtered by state, producer id and how long they have
    been open (KIP-994; -1: any), sorted by transactional id.

    A broker still loading a ``__transaction_state`` partition is asked again after
    retry.backoff.ms (Kafka's handler retries COORDINATOR_LOAD_IN_PROGRESS) until
    request.timeout.ms; any other error is raised, naming the broker.
    """
    states = list(state_filters)
    unknown = [s for s in states if s not in TRANSACTION_STATES]
    if unknown:
        raise ValueError(
            f"unknown transaction state(s) {', '.join(unknown)}: use one of "
            + ", ".join(TRANSACTION_STATES)
        )
    body = {
        "state_filters": states,
        "producer_id_filters": list(producer_id_filters),
        "duration_filter": duration_filter_ms,
    }
    await cluster.refresh(())
    out: list[TransactionListing] = []
    for node in sorted(cluster.brokers):
        answer = await _until_loaded(
            config, lambda n=node: cluster.request(n, ApiKey.LIST_TRANSACTIONS, body)
        )
        code = ErrorCode.parse(answer["error_code"])
        if code is not ErrorCode.NONE:
            raise error_class(code)(f"ListTransactions sent to broker {node}")
        out += [
            TransactionListing(
                t["transactional_id"], t["producer_id"], t["transaction_state"], node
            )
            for t in answer["transaction_states"]
        ]
    return sorted(out, key=lambda t: t.transactional_id)


async def describe_transactions(
    cluster: Cluster, config: Mapping[str, Any], transactional_ids: Iterable[str]
) -> dict[str, TransactionDescription]:
    """Each id's transaction, from its coordinator. An id the coordinator does not know
    raises TransactionalIdNotFound (Kafka's TRANSACTIONAL_ID_NOT_FOUND); a coordinator that
    moved or is loading is found and asked again until request.timeout.ms."""
    return {t: await _describe(cluster, config, t) for t in transactional_ids}


async def _describe(
    cluster: Cluster, config: Mapping[str, Any], transactional_id: str
) -> TransactionDescription:
    route = CoordinatorRoute(cluster, transactional_id, TRANSACTION, config)
    body = {"transactional_ids": [transactional_id]}

    async def ask() -> dict:
        answer = await route.call(ApiKey.DESCRIBE_TRANSACTIONS, body)
        entry = answer["transaction_states"][0]
        if ErrorCode.parse(entry["error_code"]) in COORDINATOR_ERRORS:
            route.coordinator = None  # moved, or loading: find it again
        return entry

    s = await _until_loaded(config, ask)
    code = ErrorCode.parse(s["error_code"])
    if code is not ErrorCode.NONE:
        raise error_class(code)(f"transactional.id '{transactional_id}'")
    assert route.coordinator is not None  # it answered
    return TransactionDescription(
        transactional_id,
        route.coordinator,
        s["transaction_state"],
        s["producer_id"],
        s["producer_epoch"],
        s["transaction_timeout_ms"],
        None if s["transaction_start_time_ms"] < 0 else s["transaction_start_time_ms"],
        [TopicPartition(t["name"], p) for t in s["topics"] for p in t["partitions"]],
    )


async def _until_loaded(config: Mapping[str, Any], ask: Callable[[], Awaitable[dict]]) -> dict:
    """``await ask()`` again after retry.backoff.ms while its answer is a coordinator
    error (loading, moved), for up to request.timeout.ms; then the last answer."""
    deadline = trio.current_time() + config["request.timeout.ms"] / 1000
    while True:
        answer = await ask()
        code = ErrorCode.parse(answer["error_code"])
        if code not in COORDINATOR_ERRORS or trio.current_time() >= deadline:
            return answer
        await trio.sleep(config["retry.backoff.ms"] / 1000)
