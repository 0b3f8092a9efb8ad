"""Cluster metadata: brokers, topics, replica assignment, leaders, epochs and ISRs.

One broker (the controller) owns the authoritative copy and persists it
atomically; every broker holds the last copy pushed to it. A single-broker
"cluster" is its own controller. Every document, from disk or from a peer, passes
``metadata_check`` before it becomes a ClusterMetadata.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from minibroker.broker.common.atomic_file import write_atomic
from minibroker.broker.metadata.check import MetadataError, check_document

QuotaKey = tuple[tuple[str, str | None], ...]


def quota_key(pairs: Iterable[tuple[str, str | None]]) -> QuotaKey:
    """A client quota entity as the metadata keeps it: its (type, name) pairs by type."""
    return tuple(sorted(pairs, key=lambda pair: pair[0]))


@dataclass(slots=True)
class PartitionState:
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    partition_epoch: int = 0

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(slots=True)
class TopicState:
    name: str
    partitions: list[PartitionState]
    configs: dict[str, str] = field(default_factory=dict)
    # Kafka's topic id: a topic deleted and created again under its name gets a new one,
    # so a replica of the old topic is never taken for the new one. "" before ids existed.
    topic_id: str = ""


@dataclass(slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    # The broker's Kafka listener (kafka.listener), registered like Kafka's listeners so
    # every broker can advertise every other's in Kafka Metadata answers; port 0: none.
    kafka_host: str = ""
    kafka_port: int = 0


@dataclass
class ClusterMetadata:
    controller_id: int = -1
    epoch: int = 0
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    topics: dict[str, TopicState] = field(default_factory=dict)
    # Registered brokers that are not fenced (heartbeating within the session timeout).
    live: set[int] = field(default_factory=set)
    # The first producer id no broker has been given yet (KIP-730's ProducerIdsRecord):
    # in the metadata log, so ids stay unique across controller failover.
    next_producer_id: int = 0
    # Client quotas (KRaft's ClientQuotaRecord): by entity, a tuple of (entity type, name)
    # pairs sorted by type (a None name: the default entity), each its values by key.
    client_quotas: dict[QuotaKey, dict[str, float]] = field(default_factory=dict)
    # Dynamic broker configs (KRaft's ConfigRecords on BROKER resources): "" is the
    # cluster-wide default, "<id>" one broker's; each key -> its value as text.
    broker_configs: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "controller_id": self.controller_id,
            "epoch": self.epoch,
            "next_producer_id": self.next_producer_id,
            "broker_configs": {k: dict(v) for k, v in self.broker_configs.items()},
            "brokers": [asdict(b) for b in sorted(self.brokers.values(), key=lambda b: b.node_id)],
            "live_brokers": sorted(self.live),
            "client_quotas": [
                {
                    "entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
                    "values": dict(values),
                }
                for entity, values in self.client_quotas.items()
            ],
            "topics": [
                {
                    "name": t.name,
                    "configs": t.configs,
                    "topic_id": t.topic_id,
                    "partitions": [p.to_json() for p in t.partitions],
                }
                for t in self.topics.values()
            ],
        }

    def copy(self) -> ClusterMetadata:
        """A deep copy: the controller's draft for a change not yet persisted.

        Written out rather than ``copy.deepcopy`` (5x slower): it runs on every change.
        """
        return ClusterMetadata(
            self.controller_id,
            self.epoch,
            {
                i: BrokerInfo(b.node_id, b.host, b.port, b.kafka_host, b.kafka_port)
                for i, b in self.brokers.items()
            },
            {
                name: TopicState(
                    t.name,
                    [
                        PartitionState(
                            p.leader,
                            p.leader_epoch,
                            list(p.replicas),
                            list(p.isr),
                            p.partition_epoch,
                        )
                        for p in t.partitions
                    ],
                    dict(t.configs),
                    t.topic_id,
                )
                for name, t in self.topics.items()
            },
            set(self.live),
            self.next_producer_id,
            {entity: dict(values) for entity, values in self.client_quotas.items()},
            {k: dict(v) for k, v in self.broker_configs.items()},
        )

    @classmethod
    def parse(cls, data: object) -> ClusterMetadata:
        """Check an untrusted document (``MetadataError`` naming the problem), then build it."""
        return cls.from_json(check_document(data))

    @classmethod
    def from_json(cls, data: dict) -> ClusterMetadata:
        """Build from a document already checked (``parse`` for anything untrusted)."""
        md = cls(controller_id=data.get("controller_id", -1), epoch=data.get("epoch", 0))
        md.live = set(data.get("live_brokers", []))
        md.next_producer_id = data.get("next_producer_id", 0)
        for q in data.get("client_quotas", []):
            entity = quota_key((e["entity_type"], e["entity_name"]) for e in q["entity"])
            md.client_quotas[entity] = dict(q["values"])
        md.broker_configs = {k: dict(v) for k, v in data.get("broker_configs", {}).items()}
        for b in data.get("brokers", []):
            md.brokers[b["node_id"]] = BrokerInfo(
                b["node_id"], b["host"], b["port"], b.get("kafka_host", ""), b.get("kafka_port", 0)
            )
        for t in data.get("topics", []):
            parts = [PartitionState(**p) for p in t["partitions"]]
            md.topics[t["name"]] = TopicState(
                t["name"], parts, dict(t.get("configs", {})), t.get("topic_id", "")
            )
        return md


def epoch_regression(old: ClusterMetadata, new: ClusterMetadata) -> str | None:
    """Why ``new`` cannot follow ``old`` (a partition's epochs went backwards), or None.

    A snapshot that lowers a leader epoch would let a fenced leader's fetchers and
    produces in again: refused even from an authenticated controller.
    """
    for name, topic in new.topics.items():
        before = old.topics.get(name)
        if before is None:
            continue
        for index, (p_old, p_new) in enumerate(
            zip(before.partitions, topic.partitions, strict=False)
        ):
            for key in ("leader_epoch", "partition_epoch"):
                was, now = getattr(p_old, key), getattr(p_new, key)
                if now < was:
                    return f"{name}-{index}: {key} {now} is below the current {was}"
    return None


class MetadataStoreError(RuntimeError):
    """The persisted metadata file exists but cannot be read, or cannot be written."""


def save_metadata(path: Path, md: ClusterMetadata) -> None:
    write_atomic(path, json.dumps(md.to_json(), indent=1).encode())


def load_metadata(path: Path) -> ClusterMetadata | None:
    """The persisted metadata, None if there is none; one-line MetadataStoreError if unusable."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MetadataStoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(raw)
    except ValueError as exc:  # also UnicodeDecodeError; a truncated file lands here
        problem = f"not valid JSON ({exc})"
    else:
        try:
            return ClusterMetadata.parse(doc)
        except MetadataError as exc:
            problem = str(exc)
    # One line even when the cause quotes a multi-line value.
    problem = " ".join(problem.split())[:300]
    raise MetadataStoreError(f"{path} is corrupt: {problem}; restore it or remove the data dir")
