"""The Kafka listener's Metadata: a translation onto the native Metadata, plus what only
Kafka's answer carries (each broker's Kafka listener, ``is_internal``, the authorized
operations KIP-430 asks for).

Names that can never exist (``bad$#!``, ``..``, over 249 characters) are answered
INVALID_TOPIC_EXCEPTION here, at once, as Kafka's getTopicMetadata does: the native schema
cannot carry a name that long, and the native handler refuses the others the same way.
AllowAutoTopicCreation (v4+; true before) goes through: a consumer's Metadata that says no
creates nothing, whatever auto.create.topics.enable says.
"""

from __future__ import annotations

from typing import Any

from minibroker.broker.kafka.admin import CLUSTER_ID
from minibroker.broker.kafka.translate import failed
from minibroker.broker.metadata.check import topic_name_error
from minibroker.broker.network.pending import then
from minibroker.protocol import INTERNAL_TOPICS, ApiKey
from minibroker.protocol.errors import ErrorCode
from minibroker.protocol.kafka.acl_operations import (
    CLUSTER_OPERATIONS,
    TOPIC_OPERATIONS,
    authorized,
)


class MetadataApis:
    """Mixed into KafkaRequestHandler (``_native``, ``cache``)."""

    _native: Any
    cache: Any

    def metadata(self, header, body, session) -> Any:
        topics = body["topics"]
        names = None if topics is None else [t["name"] for t in topics]
        if header.api_version == 0 and not names:
            names = None  # v0: an empty list means every topic
        illegal = {
            n for n in names or () if topic_name_error(n) is not None
        }  # answered here (module doc)
        native = {
            "topics": None if names is None else [n for n in names if n not in illegal],
            "allow_auto_topic_creation": body.get("allow_auto_topic_creation", True),
        }
        result = self._native(header, ApiKey.METADATA, native, session)
        return then(result, lambda answer: self._metadata_answer(body, answer, names, illegal))

    def _kafka_brokers(self) -> list[dict]:
        """Every broker's Kafka listener, as Metadata and DescribeCluster advertise them."""
        return [
            {"node_id": b.node_id, "host": b.kafka_host or b.host, "port": b.kafka_port}
            for b in self.cache.metadata.brokers.values()
            if b.kafka_port
        ]

    def _metadata_answer(
        self, request: dict, answer: dict, names: list[str] | None, illegal: set[str]
    ) -> dict:
        md = self.cache.metadata
        brokers = self._kafka_brokers()
        code = failed(answer)
        topic_ops = authorized(
            TOPIC_OPERATIONS, request.get("include_topic_authorized_operations", False)
        )
        if code:
            topics = [{"name": n, "error_code": code} for n in names or () if n not in illegal]
        else:
            topics = [
                {
                    "name": t["name"],
                    "error_code": t["error_code"],
                    "is_internal": t["name"] in INTERNAL_TOPICS,
                    "partitions": [
                        {
                            "error_code": p["error_code"],
                            "partition_index": p["partition"],
                            "leader_id": p["leader"],
                            "leader_epoch": p["leader_epoch"],
                            "replica_nodes": p["replicas"],
                            "isr_nodes": p["isr"],
                            "offline_replicas": p["offline_replicas"],
                        }
                        for p in t["partitions"]
                    ],
                }
                for t in answer["topics"]
            ]
        topics += [
            {"name": n, "error_code": int(ErrorCode.INVALID_TOPIC_EXCEPTION)} for n in illegal
        ]
        for t in topics:  # Kafka sets them on every topic answered, errors included
            t["topic_authorized_operations"] = topic_ops
        cluster_ops = request.get("include_cluster_authorized_operations", False)
        return {
            "brokers": brokers,
            "cluster_id": CLUSTER_ID,
            "controller_id": md.controller_id,
            "topics": topics,
            "cluster_authorized_operations": authorized(CLUSTER_OPERATIONS, cluster_ops),
        }
