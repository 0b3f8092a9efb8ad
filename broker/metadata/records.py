"""Cluster metadata as a log of records (KRaft's metadata records), and the state they build.

The controller keeps making each change on a draft of ClusterMetadata (controller.py); what
it persists is no longer the whole document but the records that turn the committed state
into the draft (``records_for_change``). Every voter applies committed records, in log
order, to its MetadataImage: the same records give the same metadata everywhere.

Record types, after Kafka's (metadata/src/main/resources/common/metadata/*.json):

    RegisterBroker   RegisterBrokerRecord  (id, host, port)
    FenceBroker      FenceBrokerRecord
    UnfenceBroker    UnfenceBrokerRecord
    Topic            TopicRecord           (name, topic_id, configs; ConfigRecord folded in)
    RemoveTopic      RemoveTopicRecord     (name, topic_id): DeleteTopics; every broker
                     drops its replicas of the topic and their files
    Partition        PartitionRecord / PartitionChangeRecord: the partition's whole new
                     state (leader, epochs, replicas, ISR), so applying one twice is harmless
                     and no record depends on the exact state before it.
    ProducerIds      ProducerIdsRecord     (next_producer_id): a block of producer ids
                     was handed to a broker (KIP-730)
    ClientQuota      ClientQuotaRecord     (entity, key, value, remove): one client quota
                     value set or removed (AlterClientQuotas); every broker applies it
    Config           ConfigRecord          (resource_type, resource_name, name, value):
                     one config of a topic (type 2) or a broker (type 4; name "" is the
                     cluster-wide default) set, or removed (value None). A new topic's
                     configs travel in its Topic record; later changes are Config records.

One controller change is one log entry (``encode_change``): the msgpack list of all its
records, as KRaft appends a CreateTopics' records as one atomic batch. Why one entry rather
than KIP-868's begin/end transaction markers: the quorum's unit of fetch, commit, truncation,
snapshot and crash recovery is already the entry (a torn entry is dropped whole on load, a
fetch never cuts one, a snapshot sits between two), so a change that is one entry is applied
by every broker whole or not at all with no buffering or abort rule in the appliers. The
price is that one change must fit one entry: the controller bounds a request's size
(``controller.max.partitions.per.request``), which KIP-868 would lift. An entry written
before this (one record, a map) still reads as a change of one record.

An unknown type or a malformed record raises MetadataRecordError (a bug or a newer peer:
never silently skipped, or voters would diverge); every record of an entry is checked
before any is applied.
"""

from __future__ import annotations

from typing import Any

import msgpack

from minibroker.broker.metadata.image import (
    BrokerInfo,
    ClusterMetadata,
    PartitionState,
    TopicState,
    quota_key,
)


class MetadataRecordError(ValueError):
    pass


def encode_change(records: list[dict]) -> bytes:
    """One log entry holding every record of one controller change."""
    return msgpack.packb(records)


def decode_change(data: bytes) -> list[dict]:
    """The records of one log entry, all checked (a pre-batch entry holds one record)."""
    try:
        decoded = msgpack.unpackb(data, strict_map_key=False)
    except (ValueError, msgpack.ExtraData) as exc:
        raise MetadataRecordError(f"undecodable metadata entry: {exc}") from None
    records = decoded if isinstance(decoded, list) else [decoded]
    for record in records:
        if not isinstance(record, dict) or record.get("type") not in _APPLY:
            raise MetadataRecordError(f"unknown metadata record {str(record)[:100]}")
    return records


def _partition_record(topic: str, index: int, p: PartitionState) -> dict:
    return {
        "type": "Partition",
        "topic": topic,
        "partition": index,
        "leader": p.leader,
        "leader_epoch": p.leader_epoch,
        "partition_epoch": p.partition_epoch,
        "replicas": list(p.replicas),
        "isr": list(p.isr),
    }


def records_for_change(old: ClusterMetadata, new: ClusterMetadata) -> list[dict]:
    """The records that take ``old`` to ``new`` (brokers, fencing, topics, partitions).

    Registrations come first and fencing before partitions, so a replay never sees a
    partition led by a broker it does not know yet. Removals come before creations: a
    topic deleted and created again in one change (a new topic id) is removed, then made.
    """
    out: list[dict] = []
    for node_id, info in sorted(new.brokers.items()):
        if old.brokers.get(node_id) != info:
            out.append(
                {
                    "type": "RegisterBroker",
                    "broker_id": node_id,
                    "host": info.host,
                    "port": info.port,
                    "kafka_host": info.kafka_host,
                    "kafka_port": info.kafka_port,
                }
            )
    for node_id in sorted(old.live - new.live):
        out.append({"type": "FenceBroker", "broker_id": node_id})
    for node_id in sorted(new.live - old.live):
        out.append({"type": "UnfenceBroker", "broker_id": node_id})
    for name, before in old.topics.items():
        topic = new.topics.get(name)
        if topic is None or topic.topic_id != before.topic_id:
            out.append({"type": "RemoveTopic", "name": name, "topic_id": before.topic_id})
    for name, topic in new.topics.items():
        before = old.topics.get(name)
        if before is not None and before.topic_id != topic.topic_id:
            before = None  # removed above: this is a new topic
        if before is None:
            out.append(
                {
                    "type": "Topic",
                    "name": name,
                    "topic_id": topic.topic_id,
                    "configs": dict(topic.configs),
                }
            )
        elif before.configs != topic.configs:
            out += _config_records(RESOURCE_TOPIC, name, before.configs, topic.configs)
        for index, p in enumerate(topic.partitions):
            was = before.partitions[index] if before and index < len(before.partitions) else None
            if was != p:
                out.append(_partition_record(name, index, p))
    if new.next_producer_id != old.next_producer_id:
        out.append({"type": "ProducerIds", "next_producer_id": new.next_producer_id})
    for entity in sorted(old.broker_configs.keys() | new.broker_configs.keys()):
        was, now = old.broker_configs.get(entity, {}), new.broker_configs.get(entity, {})
        if was != now:
            out += _config_records(RESOURCE_BROKER, entity, was, now)
    if new.client_quotas != old.client_quotas:
        out += _quota_records(old.client_quotas, new.client_quotas)
    return out


def _quota_records(old: dict, new: dict) -> list[dict]:
    """One ClientQuotaRecord per value set or removed (Kafka's shape)."""
    out = []
    for entity in sorted(old.keys() | new.keys(), key=repr):
        before, after = old.get(entity, {}), new.get(entity, {})
        wire = [[t, n] for t, n in entity]
        for key in sorted(before.keys() | after.keys()):
            if key not in after:
                out.append(
                    {
                        "type": "ClientQuota",
                        "entity": wire,
                        "key": key,
                        "value": 0.0,
                        "remove": True,
                    }
                )
            elif before.get(key) != after[key]:
                out.append(
                    {
                        "type": "ClientQuota",
                        "entity": wire,
                        "key": key,
                        "value": float(after[key]),
                        "remove": False,
                    }
                )
    return out


# Kafka's ConfigResource types: what a Config record is about.
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4


def _config_records(kind: int, name: str, was: dict, now: dict) -> list[dict]:
    """One Config record per key whose value changed (value None: removed)."""
    return [
        {
            "type": "Config",
            "resource_type": kind,
            "resource_name": name,
            "name": key,
            "value": now.get(key),
        }
        for key in sorted(was.keys() | now.keys())
        if was.get(key) != now.get(key)
    ]


class MetadataImage:
    """The state machine the quorum feeds: ClusterMetadata built from committed records.

    ``metadata.epoch`` is the offset after the last applied entry, so it only grows and
    every voter names the same state by the same epoch.
    """

    def __init__(self) -> None:
        self.metadata = ClusterMetadata()

    def apply(self, entry: Any) -> None:
        """A committed log entry (broker.raft.Entry): one whole change, applied together."""
        md = self.metadata
        for record in decode_change(entry.data):
            _APPLY[record["type"]](md, record)
        md.epoch = entry.offset + 1

    def snapshot(self) -> bytes:
        return msgpack.packb(self.metadata.to_json())

    def restore(self, data: bytes) -> None:
        try:
            self.metadata = ClusterMetadata.parse(msgpack.unpackb(data, strict_map_key=False))
        except Exception as exc:  # a snapshot we cannot read would make this voter diverge
            raise MetadataRecordError(f"unreadable metadata snapshot: {exc}") from None


def _register(md: ClusterMetadata, r: dict) -> None:
    md.brokers[r["broker_id"]] = BrokerInfo(
        r["broker_id"], r["host"], r["port"], r.get("kafka_host", ""), r.get("kafka_port", 0)
    )


def _fence(md: ClusterMetadata, r: dict) -> None:
    md.live.discard(r["broker_id"])


def _unfence(md: ClusterMetadata, r: dict) -> None:
    md.live.add(r["broker_id"])


def _topic(md: ClusterMetadata, r: dict) -> None:
    topic = md.topics.get(r["name"])
    topic_id = r.get("topic_id", "")  # records from before topic ids have none
    if topic is None or topic.topic_id != topic_id:
        md.topics[r["name"]] = TopicState(r["name"], [], dict(r["configs"]), topic_id)
    else:
        topic.configs = dict(r["configs"])


def _remove_topic(md: ClusterMetadata, r: dict) -> None:
    # Only the topic the record names: applied twice, it never removes a newer namesake.
    topic = md.topics.get(r["name"])
    if topic is not None and topic.topic_id == r["topic_id"]:
        del md.topics[r["name"]]


def _partition(md: ClusterMetadata, r: dict) -> None:
    topic = md.topics.get(r["topic"])
    index = r["partition"]
    if topic is None or index > len(topic.partitions):
        raise MetadataRecordError(f"partition record for unknown {r['topic']}-{index}")
    state = PartitionState(
        r["leader"], r["leader_epoch"], list(r["replicas"]), list(r["isr"]), r["partition_epoch"]
    )
    if index == len(topic.partitions):
        topic.partitions.append(state)
    else:
        topic.partitions[index] = state


def _producer_ids(md: ClusterMetadata, r: dict) -> None:
    # Ids only move forward: a replayed or reordered record never hands out a block twice.
    md.next_producer_id = max(md.next_producer_id, r["next_producer_id"])


def _client_quota(md: ClusterMetadata, r: dict) -> None:
    entity = quota_key((t, n) for t, n in r["entity"])
    values = md.client_quotas.get(entity)
    if r["remove"]:
        if values is not None:
            values.pop(r["key"], None)
            if not values:
                del md.client_quotas[entity]
    else:
        md.client_quotas.setdefault(entity, {})[r["key"]] = float(r["value"])


def _config(md: ClusterMetadata, r: dict) -> None:
    name, key, value = r["resource_name"], r["name"], r["value"]
    if r["resource_type"] == RESOURCE_TOPIC:
        topic = md.topics.get(name)
        if topic is None:
            raise MetadataRecordError(f"config record for unknown topic {name}")
        configs = topic.configs
    elif r["resource_type"] == RESOURCE_BROKER:
        configs = md.broker_configs.setdefault(name, {})
    else:
        raise MetadataRecordError(f"config record for resource type {r['resource_type']}")
    if value is None:
        configs.pop(key, None)
    else:
        configs[key] = value
    if r["resource_type"] == RESOURCE_BROKER and not configs:
        del md.broker_configs[name]


_APPLY = {
    "ClientQuota": _client_quota,
    "Config": _config,
    "ProducerIds": _producer_ids,
    "RegisterBroker": _register,
    "FenceBroker": _fence,
    "UnfenceBroker": _unfence,
    "Topic": _topic,
    "RemoveTopic": _remove_topic,
    "Partition": _partition,
}
