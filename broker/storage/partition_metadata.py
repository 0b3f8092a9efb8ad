"""Which topic a partition directory belongs to: Kafka's ``partition.metadata`` file.

A topic deleted while a broker was down, then created again under its name, would find
the old replica's directory (``NAME-0``) on that broker: without the topic id on disk the
new topic's replica would start from the old topic's records. The file names the topic id
the directory was made for; a directory of another id is a stale replica, removed before
it is opened, and one whose topic is gone is removed once the metadata has caught up.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from minibroker.broker.common.atomic_file import write_atomic

PARTITION_METADATA = "partition.metadata"


def read_topic_id(directory: Path) -> str | None:
    """The topic id recorded in ``directory``, or None (no file: before topic ids)."""
    try:
        text = (directory / PARTITION_METADATA).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "topic_id":
            return value.strip()
    return None


def claim_partition_dir(directory: Path, topic_id: str) -> bool:
    """Make ``directory`` this topic's: a replica of another topic id there is removed first.
    True if one was. A topic without an id (from before ids) leaves the directory as it is."""
    if not topic_id:
        return False
    found = read_topic_id(directory)
    if found == topic_id:
        return False
    stale = found is not None
    if stale:
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / PARTITION_METADATA, f"version: 0\ntopic_id: {topic_id}\n".encode())
    return stale
