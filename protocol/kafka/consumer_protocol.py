"""Kafka's ConsumerProtocol: the subscription a member sends in JoinGroup and the
assignment its leader hands out through SyncGroup, for groups of protocol type "consumer".

The broker never reads these bytes; members do, so every member of a group must write the
same format. This is Kafka's (specs/ConsumerProtocol{Subscription,Assignment}.json: an
int16 version, then the body at that version), so our consumers and stock Kafka clients
can share a group and `groups describe` can show a stock member's partitions. As Kafka
does, a version newer than ours is read as our newest: later versions only add fields at
the end, which are left unread.
"""

from __future__ import annotations

import struct

from minibroker.protocol.kafka.messages import KafkaDecodeError, message_codec, valid_versions

_VERSION = struct.Struct(">h")
SUBSCRIPTION = "ConsumerProtocolSubscription"
ASSIGNMENT = "ConsumerProtocolAssignment"


def encode(name: str, body: dict, version: int = 0) -> bytes:
    out = bytearray(_VERSION.pack(version))
    message_codec(name, version).encode_into(out, body)
    return bytes(out)


def decode(name: str, data: bytes) -> dict:
    """The body, whatever version wrote it (KafkaDecodeError if it is not one)."""
    if len(data) < _VERSION.size:
        raise KafkaDecodeError(f"{name} of {len(data)} bytes has no version")
    (version,) = _VERSION.unpack_from(data)
    if version < 0:
        raise KafkaDecodeError(f"{name} version {version}")
    newest = valid_versions(name)[1]
    body, _ = message_codec(name, min(version, newest)).read(data, _VERSION.size)
    return body


def encode_subscription(
    topics: list[str],
    owned: dict[str, list[int]] | None = None,
    generation: int = -1,
    user_data: bytes | None = None,
) -> bytes:
    """v3, Kafka's current: ``owned`` (topic -> partitions) and ``generation`` let a sticky
    leader keep partitions where they are; readers of older versions stop before them."""
    body = {
        "topics": topics,
        "user_data": user_data,
        "owned_partitions": [{"topic": t, "partitions": ps} for t, ps in (owned or {}).items()],
        "generation_id": generation,
        "rack_id": None,
    }
    return encode(SUBSCRIPTION, body, 3)


def encode_assignment(partitions: dict[str, list[int]], user_data: bytes | None = None) -> bytes:
    assigned = [{"topic": t, "partitions": ps} for t, ps in partitions.items()]
    return encode(ASSIGNMENT, {"assigned_partitions": assigned, "user_data": user_data})
