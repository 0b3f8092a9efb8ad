"""A segment's time index: Kafka's ``.timeindex`` file, and the lookup that reads it.

Entries are Kafka's 12 bytes, a timestamp (int64) then an offset relative to the segment
(int32), both increasing. An entry ``(T, O)`` promises: every record at an offset at
or below ``base + O`` has a timestamp at most ``T``. It is written beside an entry of
the sparse offset index (every ``index.interval.bytes``), and only when the segment's
max timestamp grew since the last one (Kafka's ``maybeAppend``): ``T`` is the max over
the batches before that offset-index entry's batch, ``O`` the offset just before it.
So the index is as sparse as the offset index, and a lookup needs no per-record data.

Unlike the offset index (on every fetch, so kept in memory), the time index lives in its
file: a ListOffsets by time bisects it with a 12-byte pread per probe (plus the active
segment's entries not yet written), so a broker's memory does not grow with its data.
Every subset of valid entries is a valid index (each entry stands alone), which is what
makes a lagging file (a crash lost its unwritten tail) harmless until recovery.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_left
from pathlib import Path

TIME_ENTRY = struct.Struct(">qi")  # timestamp, relative offset (Kafka's TimeIndex entry)
SUFFIX = ".timeindex"


class _Entries:
    """The file's whole entries followed by ``pending`` ones, as a sequence of their
    timestamps for ``bisect`` (each item read when a probe asks for it)."""

    __slots__ = ("fd", "in_file", "pending")

    def __init__(self, fd: int | None, in_file: int, pending: bytes | bytearray) -> None:
        self.fd = fd
        self.in_file = in_file
        self.pending = pending

    def __len__(self) -> int:
        return self.in_file + len(self.pending) // TIME_ENTRY.size

    def entry(self, i: int) -> tuple[int, int]:
        if i < self.in_file:
            raw = os.pread(self.fd, TIME_ENTRY.size, i * TIME_ENTRY.size)
            return TIME_ENTRY.unpack(raw)
        return TIME_ENTRY.unpack_from(self.pending, (i - self.in_file) * TIME_ENTRY.size)

    def __getitem__(self, i: int) -> int:
        return self.entry(i)[0]


def last_below(path: Path, pending: bytes | bytearray, timestamp: int) -> int | None:
    """The relative offset of the last entry older than ``timestamp`` (every record at or
    below it is older: a search for the first record reaching ``timestamp`` starts after
    it), from the file at ``path`` then ``pending``; None when there is none."""
    try:
        fd: int | None = os.open(path, os.O_RDONLY)
    except OSError:  # missing or unreadable (rebuilt on open): the pending entries serve
        fd = None
    try:
        in_file = 0 if fd is None else os.fstat(fd).st_size // TIME_ENTRY.size
        entries = _Entries(fd, in_file, pending)
        i = bisect_left(entries, timestamp) - 1
        return entries.entry(i)[1] if i >= 0 else None
    except OSError:
        return None  # no entry: the search reads the segment from its start, slower but right
    finally:
        if fd is not None:
            os.close(fd)
