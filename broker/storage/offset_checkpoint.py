"""Kafka's offset checkpoint file (OffsetCheckpointFile), one per log dir: a version line
(0), an entry count, then ``topic partition offset`` lines. The broker keeps its
partitions' recovery points in one (``recovery-point-offset-checkpoint``, LogManager's).

Written atomically (a crash leaves the old file or the new one); a file that does not
parse is refused with the reason, and its reader decides what that means (for recovery
points, as Kafka: recover every segment of every partition).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from minibroker.broker.common.atomic_file import write_atomic

RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
VERSION = 0


class CorruptCheckpoint(ValueError):
    """An offset checkpoint file that does not parse (names the file and why)."""


def write_checkpoint(path: Path, offsets: Mapping[tuple[str, int], int]) -> None:
    lines = [str(VERSION), str(len(offsets))]
    lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in offsets.items()]
    write_atomic(path, ("\n".join(lines) + "\n").encode())


def read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """The offsets by (topic, partition); empty when there is no file yet."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise CorruptCheckpoint(f"{path}: cannot read it ({exc})") from None
    try:
        version, expected = int(lines[0]), int(lines[1])
        entries = [line.split() for line in lines[2:]]
        offsets = {(topic, int(partition)): int(offset) for topic, partition, offset in entries}
    except (IndexError, ValueError) as exc:  # a short file, a bad number or field count
        raise CorruptCheckpoint(f"{path}: malformed ({exc})") from None
    if version != VERSION:
        raise CorruptCheckpoint(f"{path}: unrecognised version {version}")
    if len(entries) != expected:
        raise CorruptCheckpoint(f"{path}: expected {expected} entries, found {len(entries)}")
    return offsets
