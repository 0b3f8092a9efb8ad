"""The Kafka listener's transaction APIs: each a translation onto the native API of the same
key, answered by the same transaction coordinator (broker/transaction) or, for
TxnOffsetCommit, the group coordinator.

What differs between versions is shape only, plus one code: PRODUCER_FENCED (KIP-588) is
answered INVALID_PRODUCER_EPOCH to a client asking in a version from before it
(InitProducerId < 4, AddPartitionsToTxn/AddOffsetsToTxn/EndTxn < 2, TxnOffsetCommit < 3),
as Kafka's KafkaApis does, since such a client does not know the newer code.
"""

from __future__ import annotations

from typing import Any

from minibroker.broker.kafka.groups import native_commits
from minibroker.broker.network.pending import then
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode

_FENCED = int(ErrorCode.PRODUCER_FENCED)
_OLD_EPOCH_ERROR = int(ErrorCode.INVALID_PRODUCER_EPOCH)
# The first version of each API that knows PRODUCER_FENCED.
_FENCED_FROM = {
    ApiKey.INIT_PRODUCER_ID: 4,
    ApiKey.ADD_PARTITIONS_TO_TXN: 2,
    ApiKey.ADD_OFFSETS_TO_TXN: 2,
    ApiKey.END_TXN: 2,
    ApiKey.TXN_OFFSET_COMMIT: 3,
}


def _code(header: Any, code: int) -> int:
    if code == _FENCED and header.api_version < _FENCED_FROM.get(header.api_key, 0):
        return _OLD_EPOCH_ERROR
    return code


def _partition_results(header: Any, answer: dict, asked: list[dict], key: str) -> list[dict]:
    """``[{name, partitions: [{partition, error_code}]}]`` from a native answer (a bare error
    body fails every asked partition with its code)."""
    code = answer.get("error_code", 0) if key not in answer else 0
    if code:
        return [
            {"name": t["name"], "partitions": [(p, code) for p in t["partitions"]]} for t in asked
        ]
    return [
        {
            "name": t["name"],
            "partitions": [(p["partition"], p["error_code"]) for p in t["partitions"]],
        }
        for t in answer[key]
    ]


class TransactionApis:
    """Mixed into KafkaRequestHandler (``_native``)."""

    _native: Any

    def transaction_handlers(self) -> dict[int, Any]:
        return {
            ApiKey.INIT_PRODUCER_ID: self.init_producer_id,
            ApiKey.ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
            ApiKey.ADD_OFFSETS_TO_TXN: self.add_offsets_to_txn,
            ApiKey.END_TXN: self.end_txn,
            ApiKey.TXN_OFFSET_COMMIT: self.txn_offset_commit,
            ApiKey.LIST_TRANSACTIONS: self.list_transactions,
            ApiKey.DESCRIBE_TRANSACTIONS: self.describe_transactions,
        }

    def init_producer_id(self, header, body, session) -> Any:
        native = {
            "transactional_id": body["transactional_id"],
            "transaction_timeout_ms": body["transaction_timeout_ms"],
            # v3+ (KIP-360): the producer names itself to have its epoch bumped
            "producer_id": body.get("producer_id", -1),
            "producer_epoch": body.get("producer_epoch", -1),
        }
        result = self._native(header, ApiKey.INIT_PRODUCER_ID, native, session)
        return then(
            result,
            lambda a: {
                "error_code": _code(header, a["error_code"]),
                "producer_id": a.get("producer_id", -1),
                "producer_epoch": a.get("producer_epoch", -1),
            },
        )

    def add_partitions_to_txn(self, header, body, session) -> Any:
        asked = [
            {"name": t["name"], "partitions": t["partitions"]} for t in body["v3_and_below_topics"]
        ]
        native = {
            "transactional_id": body["v3_and_below_transactional_id"],
            "producer_id": body["v3_and_below_producer_id"],
            "producer_epoch": body["v3_and_below_producer_epoch"],
            "topics": asked,
        }
        result = self._native(header, ApiKey.ADD_PARTITIONS_TO_TXN, native, session)
        return then(
            result,
            lambda a: {
                "results_by_topic_v3_and_below": [
                    {
                        "name": t["name"],
                        "results_by_partition": [
                            {"partition_index": p, "partition_error_code": _code(header, c)}
                            for p, c in t["partitions"]
                        ],
                    }
                    for t in _partition_results(header, a, asked, "results")
                ]
            },
        )

    def _producer(self, body: dict) -> dict:
        return {
            "transactional_id": body["transactional_id"],
            "producer_id": body["producer_id"],
            "producer_epoch": body["producer_epoch"],
        }

    def add_offsets_to_txn(self, header, body, session) -> Any:
        native = {**self._producer(body), "group_id": body["group_id"]}
        result = self._native(header, ApiKey.ADD_OFFSETS_TO_TXN, native, session)
        return then(result, lambda a: {"error_code": _code(header, a["error_code"])})

    def end_txn(self, header, body, session) -> Any:
        native = {**self._producer(body), "committed": body["committed"]}
        result = self._native(header, ApiKey.END_TXN, native, session)
        return then(result, lambda a: {"error_code": _code(header, a["error_code"])})

    def txn_offset_commit(self, header, body, session) -> Any:
        asked = [
            {"name": t["name"], "partitions": [p["partition_index"] for p in t["partitions"]]}
            for t in body["topics"]
        ]
        native = {
            **self._producer(body),
            "group_id": body["group_id"],
            # v3+ (KIP-447): the consumer's generation, so a zombie's commit is fenced
            "generation_id": body.get("generation_id", -1),
            "member_id": body.get("member_id", ""),
            "group_instance_id": body.get("group_instance_id"),
            "topics": native_commits(body["topics"]),
        }
        result = self._native(header, ApiKey.TXN_OFFSET_COMMIT, native, session)
        return then(
            result,
            lambda a: {
                "topics": [
                    {
                        "name": t["name"],
                        "partitions": [
                            {"partition_index": p, "error_code": _code(header, c)}
                            for p, c in t["partitions"]
                        ],
                    }
                    for t in _partition_results(header, a, asked, "topics")
                ]
            },
        )

    def list_transactions(self, header, body, session) -> Any:
        native = {
            "state_filters": body["state_filters"],
            "producer_id_filters": body["producer_id_filters"],
            "duration_filter": body.get("duration_filter", -1),
        }
        result = self._native(header, ApiKey.LIST_TRANSACTIONS, native, session)
        return then(
            result,
            lambda a: {
                "error_code": a["error_code"],
                "unknown_state_filters": a.get("unknown_state_filters", []),
                "transaction_states": a.get("transaction_states", []),
            },
        )

    def describe_transactions(self, header, body, session) -> Any:
        native = {"transactional_ids": body["transactional_ids"]}
        result = self._native(header, ApiKey.DESCRIBE_TRANSACTIONS, native, session)

        def answer(a: dict) -> dict:
            if "transaction_states" not in a:  # a bare error: every id gets it
                states = [
                    {"error_code": a["error_code"], "transactional_id": t, "topics": []}
                    for t in body["transactional_ids"]
                ]
            else:
                states = [
                    {
                        **s,
                        "topics": [
                            {"topic": t["name"], "partitions": t["partitions"]} for t in s["topics"]
                        ],
                    }
                    for s in a["transaction_states"]
                ]
            return {"transaction_states": states}

        return then(result, answer)
