"""One segment: a file of concatenated batches plus its sparse offset index.

The file holds batches exactly as they travel on the wire. The index maps a
relative offset to a file position every ``index_interval_bytes``; a read
bisects it and then walks batch headers in memory from there.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_right
from pathlib import Path

from protocol.batch import HEADER, HEADER_SIZE, LOG_OVERHEAD

_INDEX_ENTRY = struct.Struct(">ii")
_LEN = struct.Struct(">qi")  # base_offset, batch_length


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class Segment:
    __slots__ = (
        "base_offset",
        "bytes_since_index",
        "created_ms",
        "fd",
        "index_fd",
        "index_offsets",
        "index_path",
        "index_positions",
        "interval",
        "max_timestamp",
        "next_offset",
        "path",
        "size",
    )

    def __init__(self, directory: Path, base_offset: int, interval: int, now_ms: int) -> None:
        self.base_offset = base_offset
        self.path = directory / (segment_name(base_offset) + ".log")
        self.index_path = directory / (segment_name(base_offset) + ".index")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.index_fd = os.open(self.index_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = os.fstat(self.fd).st_size
        self.interval = interval
        self.index_offsets: list[int] = []
        self.index_positions: list[int] = []
        self.bytes_since_index = 0
        self.max_timestamp = -1
        self.next_offset = base_offset
        self.created_ms = now_ms

    # --- writing --------------------------------------------------------------------------

    def append(
        self, data: bytes | bytearray | memoryview, first_offset: int, next_offset: int, max_ts: int
    ) -> None:
        """Append whole batches; one index entry at most per call (the index is sparse)."""
        if self.bytes_since_index >= self.interval or not self.index_offsets:
            self._add_index_entry(first_offset - self.base_offset, self.size)
        written = os.write(self.fd, data)
        if written != len(data):  # a short write on a regular file means the disk is full
            raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")
        self.size += written
        self.bytes_since_index += written
        self.next_offset = next_offset
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts

    def _add_index_entry(self, relative_offset: int, position: int) -> None:
        self.index_offsets.append(relative_offset)
        self.index_positions.append(position)
        os.write(self.index_fd, _INDEX_ENTRY.pack(relative_offset, position))
        self.bytes_since_index = 0

    def flush(self) -> None:
        os.fsync(self.fd)
        os.fsync(self.index_fd)

    def close(self) -> None:
        for fd in (self.fd, self.index_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def delete(self) -> None:
        self.close()
        for path in (self.path, self.index_path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    # --- reading --------------------------------------------------------------------------

    def pread(self, size: int, position: int) -> bytes:
        return os.pread(self.fd, size, position)

    def lookup(self, offset: int) -> int:
        """A file position at or before the batch holding ``offset`` (from the sparse index)."""
        i = bisect_right(self.index_offsets, offset - self.base_offset) - 1
        return self.index_positions[i] if i >= 0 else 0

    def find_position(self, offset: int) -> int | None:
        """Position of the batch containing ``offset``, walking headers from the index hint."""
        position = self.lookup(offset)
        while position < self.size:
            head = os.pread(self.fd, LOG_OVERHEAD + 16, position)
            if len(head) < LOG_OVERHEAD:
                return None
            base, length = _LEN.unpack_from(head)
            last = base + struct.unpack_from(">i", head, 22)[0] if len(head) >= 26 else base
            if last >= offset:
                return position
            position += length + LOG_OVERHEAD
        return None

    # --- recovery -------------------------------------------------------------------------

    def rebuild_index(self, headers: list[tuple[int, int, int]]) -> None:
        """Rewrite the index from ``(position, base_offset, size)`` of every batch."""
        os.ftruncate(self.index_fd, 0)
        self.index_offsets.clear()
        self.index_positions.clear()
        self.bytes_since_index = 0
        entries = bytearray()
        for position, base, size in headers:
            if not self.index_offsets or self.bytes_since_index >= self.interval:
                self.index_offsets.append(base - self.base_offset)
                self.index_positions.append(position)
                entries += _INDEX_ENTRY.pack(base - self.base_offset, position)
                self.bytes_since_index = 0
            self.bytes_since_index += size
        os.write(self.index_fd, bytes(entries))

    def truncate_file(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        self.size = size


def scan_headers(segment: Segment) -> tuple[list[tuple[int, int, int]], int]:
    """``(position, base_offset, size)`` of each whole batch (headers only), and the max timestamp."""
    out = []
    position = 0
    max_ts = -1
    while position + HEADER_SIZE <= segment.size:
        head = os.pread(segment.fd, HEADER_SIZE, position)
        if len(head) < HEADER_SIZE:
            break
        h = HEADER.unpack(head)
        size = h[1] + LOG_OVERHEAD
        if size < HEADER_SIZE or position + size > segment.size:
            break
        out.append((position, h[0], size))
        max_ts = max(max_ts, h[7])
        position += size
    return out, max_ts
