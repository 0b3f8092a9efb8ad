"""What a cluster metadata document must satisfy, whether read from disk or sent by a peer.

A snapshot names topics (which become directory names), replicas (which become fetch
targets) and epochs (which fence old leaders). So even a document from an authenticated
controller, or our own file, is checked before anything acts on it: the wire schema for
types and ranges, then the invariants the controller itself keeps. A failure names the
field (``topics[2].partitions[0].replicas: broker 7 is not registered``).
"""

from __future__ import annotations

import re
from typing import Any

from minibroker.protocol.api import METADATA_SNAPSHOT
from minibroker.protocol.errors import InvalidRequest

_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")


class MetadataError(ValueError):
    """A metadata document that breaks the schema or an invariant; the message names it."""


def topic_name_error(name: str) -> str | None:
    """Kafka's topic name rules; None if valid. Also what keeps a name safe in a path."""
    if not name or name in (".", ".."):
        return "topic name is empty, '.' or '..'"
    if len(name) > 249:
        return "topic name is longer than 249 characters"
    if not _TOPIC_NAME.match(name):
        return f"topic name {name!r} may contain only ASCII letters, digits, '.', '_' and '-'"
    return None


def _unique(values: list[int], path: str) -> None:
    if len(set(values)) != len(values):
        raise MetadataError(f"{path}: duplicate broker ids in {values[:16]}")


def check_document(data: Any) -> dict:
    """The validated document (optional fields filled in); MetadataError otherwise."""
    try:
        doc = METADATA_SNAPSHOT(data, "")
    except InvalidRequest as exc:
        raise MetadataError(exc.message) from None
    if doc["epoch"] < 0:
        raise MetadataError(f"epoch: {doc['epoch']} is negative")
    brokers = [b["node_id"] for b in doc["brokers"]]
    for i, b in enumerate(doc["brokers"]):
        if b["node_id"] < 0:
            raise MetadataError(f"brokers[{i}].node_id: {b['node_id']} is negative")
        if not b["host"]:
            raise MetadataError(f"brokers[{i}].host: empty")
    _unique(brokers, "brokers")
    known = set(brokers)
    _unique(doc["live_brokers"], "live_brokers")
    if unknown := set(doc["live_brokers"]) - known:
        raise MetadataError(f"live_brokers: broker(s) {sorted(unknown)} are not registered")
    names: set[str] = set()
    for t, topic in enumerate(doc["topics"]):
        name = topic["name"]
        if (problem := topic_name_error(name)) is not None:
            raise MetadataError(f"topics[{t}].name: {problem}")
        if name in names:
            raise MetadataError(f"topics[{t}].name: topic {name!r} appears twice")
        names.add(name)
        if not topic["partitions"]:
            raise MetadataError(f"topics[{t}].partitions: topic {name!r} has no partitions")
        for i, p in enumerate(topic["partitions"]):
            _check_partition(p, known, f"topics[{t}].partitions[{i}]")
    return doc


def _check_partition(p: dict, known: set[int], path: str) -> None:
    replicas, isr = p["replicas"], p["isr"]
    if not replicas:
        raise MetadataError(f"{path}.replicas: empty")
    _unique(replicas, f"{path}.replicas")
    _unique(isr, f"{path}.isr")
    if unknown := set(replicas) - known:
        raise MetadataError(f"{path}.replicas: broker(s) {sorted(unknown)} are not registered")
    if stray := set(isr) - set(replicas):
        raise MetadataError(f"{path}.isr: broker(s) {sorted(stray)} are not replicas")
    if p["leader"] != -1 and p["leader"] not in replicas:
        raise MetadataError(f"{path}.leader: broker {p['leader']} is not a replica")
    for key in ("leader_epoch", "partition_epoch"):
        if p[key] < 0:
            raise MetadataError(f"{path}.{key}: {p[key]} is negative")
