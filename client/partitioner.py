"""Which partition a record goes to: Kafka's murmur2 for keys, sticky spreading for null keys.

Using Kafka's exact hash means a key lands on the same partition number here as it
would with a Java producer, which matters when a topic is shared or migrated.
Null-key records stick to one partition until about a batch worth of bytes went
there, then move on: full batches, yet an even spread over time.
"""

from __future__ import annotations

import random
import struct
import zlib

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_WORDS = struct.Struct("<I")


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` as an unsigned 32-bit int (Java returns it signed)."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    whole = length & ~3
    for (k,) in _WORDS.iter_unpack(data[:whole]):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    extra = length & 3
    if extra == 3:
        h ^= data[whole + 2] << 16
    if extra >= 2:
        h ^= data[whole + 1] << 8
    if extra >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def key_partition(key: bytes, num_partitions: int) -> int:
    """Kafka's default: ``toPositive(murmur2(key)) % numPartitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class StickyPartitioner:
    """Keyed records hash; null-key records stay on one partition for ~batch.size bytes."""

    __slots__ = ("_batch_size", "_seed", "_sticky")

    def __init__(self, batch_size: int, seed: int | None = None) -> None:
        """``seed``: where each topic's null-key records start; random unless given (a
        writer that must place records the same way on a rerun gives one)."""
        self._batch_size = batch_size
        self._seed = random.getrandbits(32) if seed is None else seed
        self._sticky: dict[str, list[int]] = {}  # topic -> [partition, bytes sent there]

    def partition(self, topic: str, key: bytes | None, num_partitions: int, nbytes: int) -> int:
        if key is not None:
            return key_partition(key, num_partitions)
        state = self._sticky.get(topic)
        if state is None:
            start = (self._seed + zlib.crc32(topic.encode())) % num_partitions
            state = self._sticky[topic] = [start, 0]
        if state[1] >= self._batch_size or state[0] >= num_partitions:
            state[0] = (state[0] + 1) % num_partitions
            state[1] = 0
        state[1] += nbytes
        return state[0]
