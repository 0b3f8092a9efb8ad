"""The Kafka listener's admin APIs beyond CreateTopics: DeleteTopics, ElectLeaders and
DescribeCluster, each translated onto the native API of the same key (the controller
decides, as for our own client), with Kafka's per-topic errors and request deadline.

A DeleteTopics answer waits, within the request's timeout_ms, until every reachable
broker's metadata has dropped the topics, as our own Admin does (client/admin.py): a stock
client's next Metadata, to any broker, no longer names them. Kafka itself promises less
(its brokers learn of a deletion a moment after the answer); a test that deletes and then
lists should not have to poll.
"""

from __future__ import annotations

import uuid
from typing import Any

import trio

from minibroker.broker.kafka.mutation_quota import kafka_mutations
from minibroker.broker.kafka.translate import within
from minibroker.broker.network.pending import PendingResponse, then
from minibroker.broker.quota.topic_mutations import (
    THROTTLED,
    THROTTLED_MESSAGE,
    added,
    deleted,
    refusal,
)
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, KafkaError
from minibroker.protocol.kafka import KafkaApi
from minibroker.protocol.kafka.acl_operations import CLUSTER_OPERATIONS, authorized

CLUSTER_ID = "minibroker"
_ZERO_UUID = uuid.UUID(int=0)
_ENDPOINT_BROKERS = 1  # DescribeCluster's EndpointType: 1 brokers, 2 controllers


def _deleted(name: str | None, topic_id: uuid.UUID, code: int, message: str | None = None) -> dict:
    """One DeleteTopics result (topic_id and error_message are dropped by versions that
    lack them)."""
    return {"name": name, "topic_id": topic_id, "error_code": int(code), "error_message": message}


class AdminApis:
    """Mixed into KafkaRequestHandler (``_native``, ``_kafka_brokers``, ``native``, ``cache``)."""

    _native: Any
    _kafka_brokers: Any
    native: Any
    cache: Any

    def admin_handlers(self) -> dict[int, Any]:
        return {
            KafkaApi.DELETE_TOPICS: self.delete_topics,
            KafkaApi.ELECT_LEADERS: self.elect_leaders,
            KafkaApi.DESCRIBE_CLUSTER: self.describe_cluster,
            KafkaApi.CREATE_PARTITIONS: self.create_partitions,
            KafkaApi.DELETE_RECORDS: self.delete_records,
        }

    def _controller_change(
        self, header, key: ApiKey, native: dict, session, what: str, check: str
    ) -> Any:
        """The native API's answer (the controller decides) within the request's own
        ``timeout_ms``, else REQUEST_TIMED_OUT saying ``what`` may still complete."""
        result = self._native(header, key, native, session)
        return within(result, native["timeout_ms"], self.native.link.tasks, what, check)

    def delete_topics(self, header, body, session) -> Any:
        """Kafka's ControllerApis.deleteTopics: names (v0-5) or names and ids (v6+) in, one
        result per topic out; duplicates and ids that name nothing are refused per topic, the
        rest deleted by the controller (answered once the deletion commits) within timeout_ms."""
        version = header.api_version
        refused: list[dict] = []
        asked: list[tuple[str, uuid.UUID]] = []  # (name, the id it was named by or zero)
        by_id = {t.topic_id: t.name for t in self.cache.metadata.topics.values() if t.topic_id}
        for t in body["topics"] if version >= 6 else ({"name": n} for n in body["topic_names"]):
            name, topic_id = t["name"], t.get("topic_id") or _ZERO_UUID
            if name is not None and topic_id != _ZERO_UUID:
                refused.append(_deleted(name, topic_id, ErrorCode.INVALID_REQUEST,
                                        "You may not specify both topic name and topic id."))  # fmt: skip
            elif name is None and topic_id == _ZERO_UUID:
                refused.append(_deleted(None, topic_id, ErrorCode.INVALID_REQUEST,
                                        "Neither topic name nor id were specified."))  # fmt: skip
            elif name is None and (name := by_id.get(topic_id.hex)) is None:
                refused.append(_deleted(None, topic_id, ErrorCode.UNKNOWN_TOPIC_ID,
                                        f"topic id {topic_id} does not exist"))  # fmt: skip
            else:
                asked.append((name, topic_id))
        counts: dict[str, int] = {}
        for name, _ in asked:
            counts[name] = counts.get(name, 0) + 1
        for name, topic_id in asked:
            if counts[name] > 1:
                refused.append(_deleted(name, topic_id, ErrorCode.INVALID_REQUEST,
                                        "Duplicate topic name."))  # fmt: skip
        ids = dict(asked)
        names = []
        mutations = kafka_mutations(self.native.quotas, header, session)
        for name in (name for name in counts if counts[name] == 1):
            if mutations.admit(deleted(name, self.cache.metadata)):
                names.append(name)
            else:
                refused.append(_deleted(name, ids[name], THROTTLED, THROTTLED_MESSAGE))
        timeout_ms = max(body["timeout_ms"], 0)
        result: Any = {"responses": []}
        if names:
            native = {"topic_names": names, "timeout_ms": timeout_ms}
            result = self._controller_change(
                header, ApiKey.DELETE_TOPICS, native, session, "the deletion", "list the topics"
            )
            result = self._after_removal(result, trio.current_time() + timeout_ms / 1000)

        def answer(native_answer: dict) -> dict:
            code = 0 if "responses" in native_answer else native_answer.get("error_code", 0)
            if code:
                message = native_answer.get("error_message")
                rows = [{"name": n, "error_code": code, "error_message": message} for n in names]
            else:
                rows = native_answer["responses"]
            out = []
            for r in rows:
                code = r["error_code"]
                if code == ErrorCode.TOPIC_DELETION_DISABLED and version < 3:
                    code = int(ErrorCode.INVALID_REQUEST)  # Kafka: before v3 clients lack the code
                out.append(_deleted(r["name"], ids.get(r["name"], _ZERO_UUID), code,
                                    r.get("error_message")))  # fmt: skip
            return mutations.answer({"responses": out + refused})

        return then(result, answer)

    def _after_removal(self, result: Any, deadline: float) -> Any:
        """``result`` (a native DeleteTopics answer) once no reachable broker's metadata
        names the topics it deleted, or at ``deadline``: each broker drops them as it
        applies the committed metadata log, a moment after the controller's answer."""
        if not isinstance(result, PendingResponse):
            return result
        out = PendingResponse()
        link = self.native.link

        async def wait(answer: dict) -> None:
            names = [r["name"] for r in answer.get("responses", ()) if r["error_code"] == 0]
            with trio.move_on_at(deadline):
                pending = {*link.voters, link.me.node_id} if names else set()
                while pending:
                    for broker in sorted(pending):
                        if await self._forgot(broker, names):
                            pending.discard(broker)
                    if pending:
                        await trio.sleep(0.01)
            out.set(answer)

        result.add_done_callback(lambda answer: link.tasks.start_soon(wait, answer))
        return out

    async def _forgot(self, broker: int, names: list[str]) -> bool:
        """Whether ``broker``'s metadata names none of ``names`` (or it cannot be asked: it
        drops them when it catches up)."""
        link = self.native.link
        if broker == link.me.node_id:
            return not any(n in self.cache.metadata.topics for n in names)
        try:
            # Every topic, not these names: a named Metadata may auto-create them again.
            answer = await link.request(broker, ApiKey.METADATA, {"topics": None})
        except KafkaError:
            return True
        listed = {t["name"] for t in answer.get("topics", ())}
        return not listed.intersection(names)

    def elect_leaders(self, header, body, session) -> Any:
        """The native ElectLeaders has Kafka's shape. A request-wide failure (no controller,
        a fault, the deadline) is named on each asked partition as well, as Kafka's
        ElectLeadersRequest.getErrorResponse does (v0 has no top-level error to carry it)."""
        timeout_ms = max(body["timeout_ms"], 0)
        native = {
            "election_type": body["election_type"],
            "topic_partitions": body["topic_partitions"],
            "timeout_ms": timeout_ms,
        }
        result = self._controller_change(
            header, ApiKey.ELECT_LEADERS, native, session, "the election", "describe the topic"
        )

        def answer(a: dict) -> dict:
            code = a.get("error_code", 0)
            results = a.get("replica_election_results") or []
            if code and not results:
                results = [
                    {
                        "topic": t["topic"],
                        "partition_result": [
                            {
                                "partition_id": p,
                                "error_code": code,
                                "error_message": a.get("error_message"),
                            }
                            for p in t["partitions"]
                        ],
                    }
                    for t in body["topic_partitions"] or ()
                ]
            return {"error_code": code, "replica_election_results": results}

        return then(result, answer)

    def create_partitions(self, header, body, session) -> Any:
        """Kafka's CreatePartitions onto the native one (the controller validates, Kafka's
        messages and codes); a request-wide failure is named on every topic."""
        topics = []
        throttled = []
        mutations = kafka_mutations(self.native.quotas, header, session)
        for t in body["topics"]:
            if not mutations.admit(added(t["name"], t["count"], self.cache.metadata)):
                throttled.append(refusal(t["name"]))
                continue
            assignments = t["assignments"]
            topics.append(
                {
                    "name": t["name"],
                    "count": t["count"],
                    "assignments": None
                    if assignments is None
                    else [a["broker_ids"] for a in assignments],
                }
            )
        timeout_ms = max(body["timeout_ms"], 0)
        native = {
            "topics": topics,
            "timeout_ms": timeout_ms,
            "validate_only": body["validate_only"],
        }
        result: Any = {"results": []}
        if topics:
            result = self._controller_change(
                header, ApiKey.CREATE_PARTITIONS, native, session, "the partition creation",
                "describe the topic",
            )  # fmt: skip

        def answer(a: dict) -> dict:
            if "results" in a:
                results = a["results"]
            else:
                code, message = a.get("error_code", 0), a.get("error_message")
                results = [
                    {"name": t["name"], "error_code": code, "error_message": message}
                    for t in topics
                ]
            return mutations.answer({"throttle_time_ms": 0, "results": results + throttled})

        return then(result, answer)

    def delete_records(self, header, body, session) -> Any:
        """Kafka's DeleteRecords onto the native one, answered by each partition's leader
        (a stock client sends each partition to its leader)."""
        native = {
            "topics": [
                {
                    "name": t["name"],
                    "partitions": [
                        {"partition": p["partition_index"], "offset": p["offset"]}
                        for p in t["partitions"]
                    ],
                }
                for t in body["topics"]
            ],
            "timeout_ms": max(body["timeout_ms"], 0),
        }
        result = self._native(header, ApiKey.DELETE_RECORDS, native, session)

        def answer(a: dict) -> dict:
            code = a.get("error_code", 0) if "topics" not in a else 0
            topics = a.get("topics") or [
                {
                    "name": t["name"],
                    "partitions": [
                        {"partition": p["partition"], "error_code": code, "low_watermark": -1}
                        for p in t["partitions"]
                    ],
                }
                for t in native["topics"]
            ]
            return {
                "throttle_time_ms": 0,
                "topics": [
                    {
                        "name": t["name"],
                        "partitions": [
                            {
                                "partition_index": p["partition"],
                                "low_watermark": p["low_watermark"],
                                "error_code": p["error_code"],
                            }
                            for p in t["partitions"]
                        ],
                    }
                    for t in topics
                ],
            }

        return then(result, answer)

    def describe_cluster(self, header, body, session) -> dict:
        """The brokers' Kafka listeners, the cluster id and the controller, as Metadata
        names them. Every minibroker broker is also a controller (a metadata quorum voter)
        but serves no controller listener: EndpointType 2 is refused, as a Kafka broker
        listener refuses it."""
        if body["endpoint_type"] != _ENDPOINT_BROKERS:
            return {
                "error_code": int(ErrorCode.UNSUPPORTED_ENDPOINT_TYPE),
                "error_message": "only the broker endpoints (EndpointType 1) are described",
                "endpoint_type": body["endpoint_type"],
                "cluster_id": CLUSTER_ID,
            }
        return {
            "error_code": 0,
            "endpoint_type": _ENDPOINT_BROKERS,
            "cluster_id": CLUSTER_ID,
            "controller_id": self.cache.metadata.controller_id,
            "brokers": [
                {"broker_id": b["node_id"], "host": b["host"], "port": b["port"]}
                for b in self._kafka_brokers()
            ],
            "cluster_authorized_operations": authorized(
                CLUSTER_OPERATIONS, body["include_cluster_authorized_operations"]
            ),
        }
