"""What the log's appends and reads return (shared by the log and its transaction part)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minibroker.broker.common.file_region import FileRegion


class AppendInfo:
    """Where an append landed: the broker answers the producer and moves the HW with it.

    ``duplicate``: an idempotent producer's retry of a batch the log already holds; the
    offsets are the original's and nothing was written.
    """

    __slots__ = (
        "duplicate",
        "first_offset",
        "last_offset",
        "max_timestamp",
        "num_bytes",
        "record_count",
    )

    def __init__(
        self,
        first_offset: int,
        last_offset: int,
        max_timestamp: int,
        record_count: int,
        num_bytes: int,
        duplicate: bool = False,
    ):
        self.first_offset = first_offset
        self.last_offset = last_offset
        self.max_timestamp = max_timestamp
        self.record_count = record_count
        self.num_bytes = num_bytes
        self.duplicate = duplicate


class ReadResult:
    """File bytes to send as they are, plus the offset the next fetch should ask for.

    ``data`` is bytes, or a FileRegion of the segment (Log.read_region) for an answer
    sent from the file; both have ``len()`` and are false when empty (b"")."""

    __slots__ = ("data", "first_offset", "next_offset")

    def __init__(self, data: bytes | FileRegion, first_offset: int, next_offset: int) -> None:
        self.data = data
        self.first_offset = first_offset
        self.next_offset = next_offset
