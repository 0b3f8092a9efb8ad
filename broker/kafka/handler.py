"""The Kafka listener's APIs: each a thin translation onto the native RequestHandler.

A Kafka request becomes the native request it means and goes through
``RequestHandler.handle`` like any other: the same catch-up gate, the same fault
injection (Kafka's API keys are ours, so ``fault fail-api --api-key 0`` fails produces
from both listeners), the same partitions and purgatories. The answer, now or when its
purgatory completes it, is translated back. No rule lives here that the native path does
not also apply: a rule changes in one place for both listeners (DESIGN.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from minibroker.broker.common.clock import Clock, MonotonicClock
from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.kafka.admin import AdminApis
from minibroker.broker.kafka.batches import RefusedBatch, to_kafka, wrap_produce
from minibroker.broker.kafka.configs import ConfigApis
from minibroker.broker.kafka.fetch_session import FetchSessionCache
from minibroker.broker.kafka.groups import GroupApis
from minibroker.broker.kafka.metadata import MetadataApis
from minibroker.broker.kafka.mutation_quota import kafka_mutations
from minibroker.broker.kafka.quotas import QuotaApis
from minibroker.broker.kafka.transactions import TransactionApis
from minibroker.broker.kafka.translate import failed
from minibroker.broker.metadata.cache import MetadataCache
from minibroker.broker.metadata.check import topic_name_error
from minibroker.broker.metadata.config_view import topic_config_entries
from minibroker.broker.network.pending import PendingResponse, then
from minibroker.broker.network.session import ConnectionSession
from minibroker.broker.quota.topic_mutations import created, refusal
from minibroker.protocol import ApiKey, RequestHeader, validate_request
from minibroker.protocol.api import NEWEST_VERSIONS
from minibroker.protocol.errors import ErrorCode, InvalidRequest
from minibroker.protocol.kafka import KafkaApi, KafkaRequestHeader, api_versions_body


def _throttled(out: dict, native: dict) -> dict:
    """The native answer's quota throttle, carried to the Kafka answer (Produce and Fetch
    v1+ have the field; the codec leaves it out of older versions)."""
    throttle = native.get("throttle_time_ms")
    return {**out, "throttle_time_ms": throttle} if throttle else out


def _created_topic(config: BrokerConfig, native: dict, configs: dict[str, str]) -> dict:
    """One CreateTopics result: v5+ carry the created topic's counts and effective configs,
    v7 its id (Kafka's CreatableTopicResult; a refused topic keeps the defaults, -1/null)."""
    out = {k: native.get(k) for k in ("name", "error_code", "error_message")}
    if native["error_code"] == 0:
        out["num_partitions"] = native["num_partitions"]
        out["replication_factor"] = native["replication_factor"]
        out["configs"] = topic_config_entries(configs, config)
        if native.get("topic_id"):  # none when validate_only
            out["topic_id"] = uuid.UUID(native["topic_id"])
    return out


class KafkaRequestHandler(
    MetadataApis, GroupApis, TransactionApis, AdminApis, ConfigApis, QuotaApis
):
    """Kafka's KafkaApis for stock clients, built on the native handler."""

    def __init__(
        self, native: Any, cache: MetadataCache, config: BrokerConfig, clock: Clock | None = None
    ) -> None:
        self.native = native
        self.cache = cache
        self.fetch_sessions = FetchSessionCache(
            config["max.incremental.fetch.session.cache.slots"], clock or MonotonicClock()
        )
        self._api_versions = api_versions_body()
        self.handlers: dict[int, Callable] = {
            KafkaApi.API_VERSIONS: self.api_versions,
            KafkaApi.METADATA: self.metadata,
            KafkaApi.PRODUCE: self.produce,
            KafkaApi.FETCH: self.fetch,
            KafkaApi.LIST_OFFSETS: self.list_offsets,
            KafkaApi.CREATE_TOPICS: self.create_topics,
            KafkaApi.OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
            **self.group_handlers(),
            **self.transaction_handlers(),
            **self.admin_handlers(),
            **self.quota_handlers(),
            **self.config_handlers(),
        }

    def handle(
        self, header: KafkaRequestHeader, body: dict, session: ConnectionSession
    ) -> dict | PendingResponse | None:
        handler = self.handlers[header.api_key]
        quotas = self.native.quotas
        if quotas is not None and quotas.request.enabled and session.principal is None:
            # request_percentage over the whole Kafka request (its native parts untimed);
            # the codec leaves throttle_time_ms out of the versions without it.
            return quotas.timed(
                partial(handler, header, body, session), session, header.client_id, True
            )
        return handler(header, body, session)

    def _native(self, header: KafkaRequestHeader, key: ApiKey, body: dict, session) -> Any:
        """Run the native API, in its newest version (so every field the Kafka request
        carries, such as static membership's instance id, reaches the native handler), on a
        body we built (validated: its defaults filled in)."""
        version = NEWEST_VERSIONS[key]
        native_header = RequestHeader(int(key), version, header.correlation_id, header.client_id)
        try:
            body = self.native.prepare(native_header, validate_request(native_header, body))
        except InvalidRequest as exc:
            return {"error_code": int(exc.code), "error_message": exc.message}
        return self.native.dispatch(native_header, body, session)

    # --- APIs --------------------------------------------------------------------------------

    def api_versions(self, header, body, session) -> dict:
        return self._api_versions

    def produce(self, header, body, session) -> Any:
        refused: dict[tuple[str, int], RefusedBatch] = {}
        topics = []
        for t in body["topic_data"]:
            partitions = []
            illegal = topic_name_error(t["name"])  # never exists: refused at once
            for p in t["partition_data"]:
                try:
                    if illegal is not None:
                        raise RefusedBatch(ErrorCode.INVALID_TOPIC_EXCEPTION, illegal)
                    records = wrap_produce(p["records"])
                except RefusedBatch as exc:
                    refused[t["name"], p["index"]] = exc
                    continue
                partitions.append({"partition": p["index"], "records": records})
            if partitions:
                topics.append({"name": t["name"], "partitions": partitions})
        acks = body["acks"]
        if topics:
            native = {"acks": acks, "timeout_ms": body["timeout_ms"], "topics": topics}
            result = self._native(header, ApiKey.PRODUCE, native, session)
        else:
            result = {"topics": []}
        if acks == 0:
            return None  # no answer, whatever happened (Kafka's acks=0)
        return then(
            result, lambda answer: _throttled(self._produce_answer(body, answer, refused), answer)
        )

    @staticmethod
    def _produce_answer(request: dict, answer: dict, refused: dict) -> dict:
        code = failed(answer)
        results = {
            (t["name"], p["partition"]): p
            for t in answer.get("topics", ())
            for p in t["partitions"]
        }
        responses = []
        for t in request["topic_data"]:
            parts = []
            for p in t["partition_data"]:
                key = (t["name"], p["index"])
                out = {"index": p["index"], "base_offset": -1, "log_append_time_ms": -1}
                if key in refused:
                    out["error_code"] = int(refused[key].code)
                    out["error_message"] = refused[key].message
                elif key in results:
                    r = results[key]
                    out["error_code"] = r["error_code"]
                    out["base_offset"] = r["base_offset"]
                    out["log_start_offset"] = r.get("log_start_offset", -1)
                    out["error_message"] = r.get("error_message")
                    if r.get("record_errors"):  # Produce v8+ carries them (KIP-467)
                        out["record_errors"] = [
                            {"batch_index": e["batch_index"], "batch_index_error_message": e["message"]}
                            for e in r["record_errors"]
                        ]  # fmt: skip
                else:
                    out["error_code"] = code or int(ErrorCode.UNKNOWN_SERVER_ERROR)
                    out["error_message"] = answer.get("error_message")
                parts.append(out)
            responses.append({"name": t["name"], "partition_responses": parts})
        return {"responses": responses}

    def fetch(self, header, body, session) -> Any:
        context = self.fetch_sessions.new_context(body)  # KIP-227: broker/kafka/fetch_session.py
        if context.error:
            return context.answer({})
        native = {
            "replica_id": -1,  # a stock client is never a follower here
            "max_wait_ms": max(body["max_wait_ms"], 0),
            "min_bytes": max(body["min_bytes"], 0),
            "max_bytes": max(body["max_bytes"], 0),
            "isolation_level": body.get("isolation_level", 0),
            "topics": [
                {
                    "name": t["topic"],
                    "partitions": [
                        {
                            "partition": p["partition"],
                            "fetch_offset": p["fetch_offset"],
                            "partition_max_bytes": max(p["partition_max_bytes"], 0),
                            "current_leader_epoch": p["current_leader_epoch"],
                        }
                        for p in t["partitions"]
                    ],
                }
                for t in context.topics
            ],
        }
        result = self._native(header, ApiKey.FETCH, native, session)
        return then(
            result,
            lambda answer: _throttled(context.answer(self._fetch_answer(native, answer)), answer),
        )

    @staticmethod
    def _fetch_answer(request: dict, answer: dict) -> dict:
        code = failed(answer)
        if code:
            topics = [
                {
                    "name": t["name"],
                    "partitions": [
                        {
                            "partition": p["partition"],
                            "error_code": code,
                            "high_watermark": -1,
                            "records": b"",
                        }
                        for p in t["partitions"]
                    ],
                }
                for t in request["topics"]
            ]
        else:
            topics = answer["topics"]
        return {
            "session_id": 0,  # the fetch context sets the session (fetch_session.py)
            "responses": [
                {
                    "topic": t["name"],
                    "partitions": [
                        {
                            "partition_index": p["partition"],
                            "error_code": p["error_code"],
                            "high_watermark": p["high_watermark"],
                            "last_stable_offset": p.get("last_stable_offset", -1),
                            "log_start_offset": p.get("log_start_offset", -1),
                            # null for read_uncommitted, as Kafka answers
                            "aborted_transactions": p.get("aborted_transactions"),
                            "preferred_read_replica": -1,
                            "records": to_kafka(p["records"]),
                        }
                        for p in t["partitions"]
                    ],
                }
                for t in topics
            ],
        }

    def list_offsets(self, header, body, session) -> Any:
        native = {
            "isolation_level": body.get("isolation_level", 0),
            "topics": [
                {
                    "name": t["name"],
                    "partitions": [
                        {"partition": p["partition_index"], "timestamp": p["timestamp"]}
                        for p in t["partitions"]
                    ],
                }
                for t in body["topics"]
            ],
        }
        result = self._native(header, ApiKey.LIST_OFFSETS, native, session)
        return then(result, lambda answer: self._list_offsets_answer(native, answer))

    @staticmethod
    def _list_offsets_answer(request: dict, answer: dict) -> dict:
        code = failed(answer)
        topics = answer.get("topics") or [
            {
                "name": t["name"],
                "partitions": [
                    {"partition": p["partition"], "error_code": code, "timestamp": -1, "offset": -1}
                    for p in t["partitions"]
                ],
            }
            for t in request["topics"]
        ]
        return {
            "topics": [
                {
                    "name": t["name"],
                    "partitions": [
                        {
                            "partition_index": p["partition"],
                            "error_code": p["error_code"],
                            "timestamp": p["timestamp"],
                            "offset": p["offset"],
                            "leader_epoch": p.get("leader_epoch", -1),
                        }
                        for p in t["partitions"]
                    ],
                }
                for t in topics
            ]
        }

    def create_topics(self, header, body, session) -> Any:
        topics = []
        refused = []
        mutations = kafka_mutations(self.native.quotas, header, session)
        metadata = self.cache.metadata
        for t in body["topics"]:
            assignments = None
            if t["assignments"]:
                # Kafka's map by partition index: indexes 0..n-1, each once.
                by_index = {a["partition_index"]: a["broker_ids"] for a in t["assignments"]}
                if sorted(by_index) != list(range(len(t["assignments"]))):
                    refused.append(
                        {
                            "name": t["name"],
                            "error_code": int(ErrorCode.INVALID_REPLICA_ASSIGNMENT),
                            "error_message": "Partitions should be numbered consecutively "
                            "from 0, each once",
                        }
                    )
                    continue
                assignments = [by_index[i] for i in range(len(by_index))]
            topic = {
                "name": t["name"],
                "assignments": assignments,
                "num_partitions": t["num_partitions"],
                "replication_factor": t["replication_factor"],
                "configs": {c["name"]: c["value"] for c in t["configs"] if c["value"] is not None},
            }
            if mutations.admit(created(topic, metadata, self.native.config["num.partitions"])):
                topics.append(topic)
            else:
                refused.append(refusal(t["name"]))
        native = {
            "topics": topics,
            "timeout_ms": max(body["timeout_ms"], 0),
            "validate_only": body.get("validate_only", False),
        }
        configs = {t["name"]: t["configs"] for t in topics}
        created_topic = partial(_created_topic, self.native.config)
        result = (
            self._native(header, ApiKey.CREATE_TOPICS, native, session)
            if topics
            else {"topics": []}
        )

        def answer(native_answer: dict) -> dict:
            code = failed(native_answer)
            out = [created_topic(t, configs[t["name"]]) for t in native_answer.get("topics", ())]
            if code:
                out = [
                    {
                        "name": t["name"],
                        "error_code": code,
                        "error_message": native_answer.get("error_message"),
                    }
                    for t in topics
                ]
            return mutations.answer({"topics": out + refused})

        return then(result, answer)

    def offset_for_leader_epoch(self, header, body, session) -> Any:
        native = {
            "replica_id": -1,
            "topics": [
                {
                    "name": t["topic"],
                    "partitions": [
                        {"partition": p["partition"], "leader_epoch": p["leader_epoch"]}
                        for p in t["partitions"]
                    ],
                }
                for t in body["topics"]
            ],
        }
        result = self._native(header, ApiKey.OFFSET_FOR_LEADER_EPOCH, native, session)

        def answer(a: dict) -> dict:
            code = failed(a)
            topics = a.get("topics") or [
                {
                    "name": t["name"],
                    "partitions": [
                        {
                            "partition": p["partition"],
                            "error_code": code,
                            "leader_epoch": -1,
                            "end_offset": -1,
                        }
                        for p in t["partitions"]
                    ],
                }
                for t in native["topics"]
            ]
            return {
                "topics": [
                    {
                        "topic": t["name"],
                        "partitions": [
                            {
                                "partition": p["partition"],
                                "error_code": p["error_code"],
                                "leader_epoch": p["leader_epoch"],
                                "end_offset": p["end_offset"],
                            }
                            for p in t["partitions"]
                        ],
                    }
                    for t in topics
                ]
            }

        return then(result, answer)
