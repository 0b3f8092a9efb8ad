"""Admin's transaction calls (client/txn_admin.py) against a scripted cluster: a listing
asks every broker and asks again one still loading its state; a description follows its
id's coordinator when it moves; the state names are the coordinator's."""

from __future__ import annotations

import pytest
import trio

from minibroker.broker.transaction.metadata import TxnState
from minibroker.client.config import load_config
from minibroker.client.records import TopicPartition
from minibroker.client.txn_admin import (
    TRANSACTION_STATES,
    describe_transactions,
    list_transactions,
)
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, TransactionalIdNotFound

CONFIG = load_config("admin", {})


class Connection:
    versions: dict = {}


class ScriptedCluster:
    """Brokers 0 and 1; ``answers[(node, api_key)]`` is the list of bodies each is to give,
    in order; every request is recorded in ``asked``."""

    def __init__(self, answers: dict, coordinators: list[int]) -> None:
        self.brokers = {0: None, 1: None}
        self.answers = answers
        self.coordinators = coordinators  # FindCoordinator's answers, in order
        self.asked: list[tuple[int, int, dict]] = []

    async def refresh(self, topics=()) -> dict:
        return {}

    async def any_request(self, api_key: int, body: dict, timeout=None) -> dict:
        assert api_key == ApiKey.FIND_COORDINATOR and body["key_type"] == 1
        return {"error_code": 0, "node_id": self.coordinators.pop(0)}

    async def connection(self, node: int) -> Connection:
        return Connection()

    async def request(self, node: int, api_key: int, body: dict, **_: object) -> dict:
        self.asked.append((node, api_key, body))
        return self.answers[(node, api_key)].pop(0)


def listing(code: ErrorCode, *states: tuple[str, int, str]) -> dict:
    return {
        "error_code": int(code),
        "unknown_state_filters": [],
        "transaction_states": [
            {"transactional_id": t, "producer_id": p, "transaction_state": s} for t, p, s in states
        ],
    }


def test_the_state_names_are_the_coordinators():
    assert {s.value for s in TxnState} == set(TRANSACTION_STATES)


async def test_a_listing_asks_every_broker_and_again_one_still_loading(autojump_clock):
    cluster = ScriptedCluster(
        {
            (0, ApiKey.LIST_TRANSACTIONS): [listing(ErrorCode.NONE, ("b", 7, "Ongoing"))],
            (1, ApiKey.LIST_TRANSACTIONS): [
                listing(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
                listing(ErrorCode.NONE, ("a", 9, "Ongoing")),
            ],
        },
        [],
    )
    started = trio.current_time()
    found = await list_transactions(cluster, CONFIG, ["Ongoing"], [7, 9])  # type: ignore[arg-type]
    assert [(t.transactional_id, t.coordinator_id, t.producer_id) for t in found] == [
        ("a", 1, 9),
        ("b", 0, 7),
    ]
    assert trio.current_time() - started >= CONFIG["retry.backoff.ms"] / 1000
    assert all(
        body == {"state_filters": ["Ongoing"], "producer_id_filters": [7, 9], "duration_filter": -1}
        for _, _, body in cluster.asked
    )


async def test_an_unknown_state_is_refused_before_asking():
    cluster = ScriptedCluster({}, [])
    with pytest.raises(ValueError, match="Ongoing"):
        await list_transactions(cluster, CONFIG, ["Running"])  # type: ignore[arg-type]
    assert cluster.asked == []


def described(code: ErrorCode, state: str = "") -> dict:
    return {
        "transaction_states": [
            {
                "error_code": int(code),
                "transactional_id": "t",
                "transaction_state": state,
                "transaction_timeout_ms": 60000,
                "transaction_start_time_ms": 1234 if state else -1,
                "producer_id": 5,
                "producer_epoch": 2,
                "topics": [{"name": "x", "partitions": [0, 3]}] if state else [],
            }
        ]
    }


async def test_a_description_follows_its_coordinator_when_it_moves(autojump_clock):
    cluster = ScriptedCluster(
        {
            (0, ApiKey.DESCRIBE_TRANSACTIONS): [described(ErrorCode.NOT_COORDINATOR)],
            (1, ApiKey.DESCRIBE_TRANSACTIONS): [described(ErrorCode.NONE, "Ongoing")],
        },
        [0, 1],
    )
    d = (await describe_transactions(cluster, CONFIG, ["t"]))["t"]  # type: ignore[arg-type]
    assert (d.coordinator_id, d.state, d.producer_id, d.producer_epoch) == (1, "Ongoing", 5, 2)
    assert d.topic_partitions == [TopicPartition("x", 0), TopicPartition("x", 3)]
    assert d.transaction_start_time_ms == 1234


async def test_an_unknown_id_raises_transactional_id_not_found():
    cluster = ScriptedCluster(
        {(0, ApiKey.DESCRIBE_TRANSACTIONS): [described(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND)]},
        [0],
    )
    with pytest.raises(TransactionalIdNotFound, match="'t'"):
        await describe_transactions(cluster, CONFIG, ["t"])  # type: ignore[arg-type]
