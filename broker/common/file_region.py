"""Bytes of a file to send as they are, and the answer bodies that carry them.

Shared by storage (which makes regions of segment files: Log.read_region) and the
network layer (which sends them: broker/network/parts.py); neither knows the other.
"""

from __future__ import annotations

import os


class FileRegion:
    """Bytes of a segment file to send as they are (``os.sendfile``), not read into memory.

    Holds its own descriptor (``os.dup`` of the segment's): a segment deleted or closed
    by the descriptor LRU before the answer leaves cannot pull the file from under the
    send. Truncation still shortens the file (same inode), so a sender must treat an
    early end of file as a broken answer. The descriptor closes when the region is
    dropped: sent, or never sent (an answer that parked instead, a closed connection).
    """

    __slots__ = ("fd", "position", "size")

    def __init__(self, fd: int, position: int, size: int) -> None:
        self.position = position
        self.size = size
        self.fd = -1  # set before the dup can fail: __del__ runs on a failed __init__ too
        self.fd = os.dup(fd)

    def __len__(self) -> int:
        return self.size

    def read(self) -> bytes:
        """The bytes themselves, for a sender without a socket descriptor (tests' streams)."""
        return os.pread(self.fd, self.size, self.position)

    def __del__(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


class RegionBody(dict):
    """An answer body with FileRegions among its values: encoded in parts, not packed."""

    __slots__ = ()
