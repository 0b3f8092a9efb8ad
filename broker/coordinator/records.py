"""The records of ``__consumer_offsets``: committed offsets and group metadata, keyed so
that the latest record per key is the truth (a compacted topic, as Kafka's).

Keys and values are msgpack, in the broker's own batch format (protocol/batch.py):

    offset commit   key [1, group, topic, partition]  value {offset, metadata, commit_timestamp,
                                                              leader_epoch}
                    (leader_epoch: the committed record's, -1 if unknown; a record written
                    before it was kept has none and reads as -1, and a broker that does not
                    know the key skips it: readable both ways)
    group metadata  key [2, group]                     value {protocol_type, generation, protocol,
                                                              leader, members: [...]}
                    (a member: member_id, group_instance_id (KIP-345; None for a dynamic
                    member), client_id, client_host, timeouts, subscription, assignment)
    a deletion      the same key, value None (a tombstone)

Kafka numbers its key versions the same way (0/1 offsets, 2 group metadata). This is the
one place these records are decoded: the coordinator's loader, never produce or fetch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import msgpack

from minibroker.protocol import GROUP_METADATA_TOPIC, encode_batch, iter_batches
from minibroker.protocol.batch import (
    KAFKA_FLAG,
    BatchHeader,
    decode_records,
    producer_fields,
    unwrap_kafka_batch,
)
from minibroker.protocol.kafka import records as kafka_records
from minibroker.protocol.kafka.messages import read_varint

OFFSETS_TOPIC = GROUP_METADATA_TOPIC
OFFSET_KEY = 1
GROUP_KEY = 2


class Offset(NamedTuple):
    """A committed offset (Kafka's OffsetAndMetadata). ``leader_epoch`` is the epoch of
    the record before the offset, as the consumer saw it (-1: unknown), which a consumer
    resuming from the commit uses to detect a log truncated under it."""

    offset: int
    metadata: str | None
    commit_timestamp: int
    leader_epoch: int = -1


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return _pack([OFFSET_KEY, group_id, topic, partition])


def group_key(group_id: str) -> bytes:
    return _pack([GROUP_KEY, group_id])


def offset_value(commit: Offset) -> bytes:
    value = {
        "offset": commit.offset,
        "metadata": commit.metadata,
        "commit_timestamp": commit.commit_timestamp,
    }
    if commit.leader_epoch >= 0:  # unknown: the record stays as it was before epochs
        value["leader_epoch"] = commit.leader_epoch
    return _pack(value)


def read_offset_value(value: dict) -> Offset:
    """An offset commit's value, whichever broker version wrote it."""
    epoch = value.get("leader_epoch", -1)
    return Offset(
        value["offset"],
        value.get("metadata"),
        value.get("commit_timestamp", -1),
        epoch if isinstance(epoch, int) else -1,
    )


def group_value(group: Any, assignments: dict[str, bytes] | None = None) -> bytes:
    """The group as a new coordinator must restore it: generation, protocol, members with
    their subscription (the chosen protocol's bytes) and ``assignments`` (default: theirs)."""
    protocol = group.protocol_name
    if assignments is None:
        assignments = {m.member_id: m.assignment for m in group.members.values()}
    return _pack(
        {
            "protocol_type": group.protocol_type,
            "generation": group.generation_id,
            "protocol": protocol,
            "leader": group.leader_id,
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "rebalance_timeout": m.rebalance_timeout_ms,
                    "session_timeout": m.session_timeout_ms,
                    "subscription": m.metadata(protocol) if protocol else b"",
                    "assignment": assignments.get(m.member_id, b""),
                }
                for m in group.members.values()
            ],
        }
    )


def batch(
    entries: Iterable[tuple[bytes, bytes | None]], timestamp_ms: int, **producer: int
) -> bytes:
    """One batch of (key, value) records; a None value is a tombstone. ``producer``
    (producer_id, producer_epoch) stamps a transaction's batch (TxnOffsetCommit)."""
    return encode_batch([(timestamp_ms, key, value, ()) for key, value in entries], **producer)


class PartitionContents:
    """A coordinator partition replayed: the latest group and offset values per key."""

    def __init__(self) -> None:
        self.groups: dict[str, dict | None] = {}
        self.offsets: dict[str, dict[tuple[str, int], Offset | None]] = {}
        self.skipped = 0  # records that are not ours (or not readable): ignored
        # Wall time of each group's latest metadata record (when an Empty group emptied).
        self.group_timestamps: dict[str, int] = {}
        # producer id -> its transaction's offset records not yet resolved by a marker
        self._pending_records: dict[int, list[tuple[bytes | None, bytes | None, int]]] = {}

    def replay(self, data: bytes) -> int:
        """Apply the records of ``data`` (whole batches); returns the next offset.

        A batch with producer fields is a transaction's (TxnOffsetCommit): its offsets
        wait under the producer id until that producer's marker (a control batch) says
        commit (they apply, at the marker's place in the log) or abort (dropped). What is
        still pending at the end is an open transaction's: ``pending``.
        """
        next_offset = -1
        for pos, header in iter_batches(data, verify=True, allow_partial=True):
            next_offset = header.next_offset
            marker = control_marker(data, pos, header)
            if marker is not None:
                self._resolve(*marker)
                continue
            producer = producer_fields(data, pos, header)
            for record in decode_records(data, pos, header):
                if producer is not None:
                    self._apply_pending(producer[0], record.key, record.value, record.timestamp)
                else:
                    self._apply(record.key, record.value, record.timestamp)
        return next_offset

    def _apply_pending(
        self, producer_id: int, raw_key: bytes | None, raw_value: bytes | None, timestamp: int
    ) -> None:
        self._pending_records.setdefault(producer_id, []).append((raw_key, raw_value, timestamp))

    def _resolve(self, producer_id: int, commit: bool) -> None:
        for raw_key, raw_value, timestamp in self._pending_records.pop(producer_id, ()):
            if commit:
                self._apply(raw_key, raw_value, timestamp)

    @property
    def pending(self) -> dict[int, dict[str, dict[tuple[str, int], Offset]]]:
        """producer id -> group -> the offsets its open transaction committed."""
        out: dict[int, dict[str, dict[tuple[str, int], Offset]]] = {}
        for producer_id, records in self._pending_records.items():
            for raw_key, raw_value, _ in records:
                try:
                    key = msgpack.unpackb(raw_key, raw=False)
                    value = msgpack.unpackb(raw_value, raw=False)
                    if key[0] != OFFSET_KEY or len(key) != 4 or not isinstance(value, dict):
                        continue
                    offsets = out.setdefault(producer_id, {}).setdefault(key[1], {})
                    offsets[(key[2], key[3])] = read_offset_value(value)
                except Exception:
                    self.skipped += 1
        return out

    def _apply(self, raw_key: bytes | None, raw_value: bytes | None, timestamp: int) -> None:
        try:
            key = msgpack.unpackb(raw_key, raw=False) if raw_key is not None else None
            value = msgpack.unpackb(raw_value, raw=False) if raw_value is not None else None
        except Exception:  # not ours: a client produced to the internal topic
            self.skipped += 1
            return
        if not isinstance(key, list) or not key:
            self.skipped += 1
            return
        if key[0] == OFFSET_KEY and len(key) == 4:
            group, topic, partition = key[1], key[2], key[3]
            offsets = self.offsets.setdefault(group, {})
            if isinstance(value, dict):
                offsets[(topic, partition)] = read_offset_value(value)
            else:
                offsets[(topic, partition)] = None
        elif key[0] == GROUP_KEY and len(key) == 2:
            self.groups[key[1]] = value if isinstance(value, dict) else None
            self.group_timestamps[key[1]] = timestamp
        else:
            self.skipped += 1


def control_marker(data: bytes, pos: int, header: BatchHeader) -> tuple[int, bool] | None:
    """``(producer_id, commit)`` of a transaction marker (a Kafka v2 control batch the
    partition leader appended for WriteTxnMarkers), None for any other batch. Its one
    record's key is int16 version + int16 type (0 abort, 1 commit), as Kafka's."""
    if not header.attributes & KAFKA_FLAG:
        return None
    try:
        inner = unwrap_kafka_batch(data, pos, header)
        kafka = kafka_records.unpack_header(inner)
        if not kafka.attributes & kafka_records.CONTROL_FLAG:
            return None
        body = inner[kafka_records.HEADER_SIZE :]
        at = read_varint(body, 0)[1] + 1  # the record's length, then its attributes
        at = read_varint(body, at)[1]  # timestamp delta
        at = read_varint(body, at)[1]  # offset delta
        length, at = read_varint(body, at)
        if length < 4:
            return None
        kind = int.from_bytes(body[at + 2 : at + 4], "big", signed=True)
        return kafka.producer_id, kind == 1
    except Exception:  # not a readable marker: not ours to interpret
        return None
