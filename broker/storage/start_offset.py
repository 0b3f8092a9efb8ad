"""A log's start offset where it is not a segment's base (Kafka's
``log-start-offset-checkpoint``): DeleteRecords moves it into the middle of a segment, and
a restart must not give back the records it deleted.

One small file per partition directory, written atomically when the start moves by a
DeleteRecords (or a follower taking its leader's start); on open the log starts at the
larger of it and its first segment's base, as long as it is not past the log end.
"""

from __future__ import annotations

from pathlib import Path

from minibroker.broker.common.atomic_file import write_atomic

START_OFFSET_FILE = "log-start-offset"


def read_start_offset(directory: Path) -> int:
    """The checkpointed start offset, or -1 when none was written or it cannot be read."""
    try:
        text = (directory / START_OFFSET_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return -1
    return int(text) if text.isdigit() else -1


def write_start_offset(directory: Path, offset: int) -> None:
    write_atomic(directory / START_OFFSET_FILE, f"{offset}\n".encode())
