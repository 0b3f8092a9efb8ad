"""The cleaner's key -> latest offset map in a byte budget (Kafka's SkimpyOffsetMap, sized
by ``log.cleaner.dedupe.buffer.size``).

Kafka's map is an array of 16-byte MD5 hashes and 8-byte offsets filled to
``log.cleaner.io.buffer.load.factor`` (0.9). Ours is a dict, so an entry costs what a
dict entry costs, measured with tracemalloc (``ENTRY_BYTES``), and the capacity is the
budget's share at the same load factor. Keys of up to 16 bytes are stored as they are
(exact, no hashing); longer ones as a 17-byte tagged MD5 digest, which no stored short
key can equal: a collision between two long keys needs two keys with one MD5, as in Kafka.
A full map refuses new keys; the cleaner then stops the pass's dirty section there.
"""

from __future__ import annotations

import hashlib

# Kafka's log.cleaner.io.buffer.load.factor default.
LOAD_FACTOR = 0.9
# What one entry costs in CPython 3.11, dict slot and growth included: a key of up to 17
# bytes (its bytes object, 50 bytes) and an offset int (32), measured as the peak of
# tracemalloc over 200,000 inserts (tests/unit/test_cleaner_budget.py keeps it honest).
ENTRY_BYTES = 160
_SHORT = 16
_TAG = b"\x01"


def _slot(key: bytes) -> bytes:
    if len(key) <= _SHORT:
        return key
    return _TAG + hashlib.md5(key, usedforsecurity=False).digest()


class OffsetMap:
    """Key -> latest offset, holding at most ``capacity`` keys."""

    __slots__ = ("_map", "capacity", "latest_offset", "reached")

    def __init__(self, budget_bytes: int) -> None:
        self.capacity = max(1, int(budget_bytes * LOAD_FACTOR) // ENTRY_BYTES)
        self._map: dict[bytes, int] = {}
        self.latest_offset = -1  # the last offset put (Kafka's latestOffset)
        # Set by whoever fills it: the offset below which every key is in the map.
        self.reached: int | None = None

    def put(self, key: bytes, offset: int) -> bool:
        """Record ``offset`` as the key's latest; False (nothing stored) when the map is
        full and the key is new."""
        slot = key if len(key) <= _SHORT else _slot(key)
        entries = self._map
        if slot not in entries and len(entries) >= self.capacity:
            return False
        entries[slot] = offset
        self.latest_offset = offset
        return True

    def get(self, key: bytes) -> int:
        """The key's latest offset, or -1."""
        return self._map.get(key if len(key) <= _SHORT else _slot(key), -1)

    def __getitem__(self, key: bytes) -> int:
        return self._map[_slot(key)]

    def __contains__(self, key: bytes) -> bool:
        return _slot(key) in self._map

    def __len__(self) -> int:
        return len(self._map)
