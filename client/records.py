"""The values users hold: topic-partitions, produced-record metadata, consumed records."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

Headers = list[tuple[str, bytes | None]]


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed (offset -1 with acks=0: nobody told us)."""

    topic: str
    partition: int
    offset: int


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers


def to_bytes(value: Any, what: str) -> bytes | None:
    """Records carry bytes; str is taken as UTF-8 so scripts need no serializer."""
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"record {what} must be bytes, str or None, got {type(value).__name__}")


def normalize_headers(headers: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> Headers:
    """Accept a dict or (name, value) pairs; names are str, values bytes (str as UTF-8) or None."""
    if not headers:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for name, value in items:
        if not isinstance(name, str):
            raise TypeError(f"header names must be str, got {type(name).__name__}")
        out.append((name, to_bytes(value, f"header '{name}'")))
    return out
