"""The Kafka listener's transaction APIs on a broker built whole: each version's request
reaches the native handler and the answer comes back in that version's shape, with
PRODUCER_FENCED spelled INVALID_PRODUCER_EPOCH for clients from before KIP-588."""

from __future__ import annotations

import pytest
import structlog

from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.network.session import ConnectionSession
from minibroker.broker.server import Broker
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode
from minibroker.protocol.kafka import KafkaRequestHeader

FENCED = int(ErrorCode.PRODUCER_FENCED)
OLD = int(ErrorCode.INVALID_PRODUCER_EPOCH)
PRODUCER = {"transactional_id": "tx", "producer_id": 1, "producer_epoch": 0}


@pytest.fixture
def kafka(tmp_path):
    broker = Broker(
        0,
        "127.0.0.1",
        19092,
        tmp_path,
        BrokerConfig({"faults.enable": True}),
        structlog.get_logger(),
    )
    broker.cache.ready.set()  # answered at once (no catch-up wait in a unit test)
    yield broker
    broker.replica_manager.close()


def fenced_answer(broker, api: ApiKey, version: int, body: dict) -> dict:
    """Answer one request while the native API is failed with PRODUCER_FENCED."""
    session = ConnectionSession("127.0.0.1:1")
    fault = {"action": "fail-api", "api_key": int(api), "error_code": FENCED, "count": 1}
    broker.connections.dispatcher.fault_injector.apply(fault)
    header = KafkaRequestHeader(int(api), version, 1, "client")
    return broker.kafka_handler.handle(header, body, session)


@pytest.mark.parametrize(("version", "code"), [(0, OLD), (1, OLD), (2, FENCED), (3, FENCED)])
def test_end_txn_and_add_offsets(kafka, version, code):
    answer = fenced_answer(kafka, ApiKey.END_TXN, version, {**PRODUCER, "committed": True})
    assert answer == {"error_code": code}
    body = {**PRODUCER, "group_id": "g"}
    assert fenced_answer(kafka, ApiKey.ADD_OFFSETS_TO_TXN, version, body) == {"error_code": code}


@pytest.mark.parametrize(("version", "code"), [(3, OLD), (4, FENCED)])
def test_init_producer_id(kafka, version, code):
    body = {"transactional_id": "tx", "transaction_timeout_ms": 60000}
    answer = fenced_answer(kafka, ApiKey.INIT_PRODUCER_ID, version, body)
    assert answer["error_code"] == code


@pytest.mark.parametrize(("version", "code"), [(1, OLD), (3, FENCED)])
def test_add_partitions_answers_each_partition(kafka, version, code):
    body = {
        "v3_and_below_transactional_id": "tx",
        "v3_and_below_producer_id": 1,
        "v3_and_below_producer_epoch": 0,
        "v3_and_below_topics": [{"name": "t", "partitions": [0, 1]}],
    }
    answer = fenced_answer(kafka, ApiKey.ADD_PARTITIONS_TO_TXN, version, body)
    assert answer == {
        "results_by_topic_v3_and_below": [
            {
                "name": "t",
                "results_by_partition": [
                    {"partition_index": 0, "partition_error_code": code},
                    {"partition_index": 1, "partition_error_code": code},
                ],
            }
        ]
    }


@pytest.mark.parametrize(("version", "code"), [(2, OLD), (3, FENCED)])
def test_txn_offset_commit(kafka, version, code):
    body = {
        **PRODUCER,
        "group_id": "g",
        "topics": [
            {
                "name": "t",
                "partitions": [
                    {"partition_index": 0, "committed_offset": 5, "committed_metadata": None}
                ],
            }
        ],
    }
    answer = fenced_answer(kafka, ApiKey.TXN_OFFSET_COMMIT, version, body)
    assert answer["topics"][0]["partitions"] == [{"partition_index": 0, "error_code": code}]


def test_describe_and_list_answer_for_the_ids_this_broker_coordinates(kafka):
    session = ConnectionSession("127.0.0.1:1")
    header = KafkaRequestHeader(int(ApiKey.DESCRIBE_TRANSACTIONS), 0, 1, "client")
    answer = kafka.kafka_handler.handle(header, {"transactional_ids": ["tx"]}, session)
    (state,) = answer["transaction_states"]
    assert (state["transactional_id"], state["error_code"]) == ("tx", ErrorCode.NOT_COORDINATOR)
    header = KafkaRequestHeader(int(ApiKey.LIST_TRANSACTIONS), 1, 1, "client")
    body = {"state_filters": ["ongoing", "Bogus"], "producer_id_filters": [], "duration_filter": -1}
    answer = kafka.kafka_handler.handle(header, body, session)
    assert answer == {
        "error_code": 0,
        "unknown_state_filters": ["Bogus"],
        "transaction_states": [],
    }
