"""Leader epoch -> start offset, per partition: how a follower finds where its log diverges.

Kafka's LeaderEpochFileCache. Entries only grow (epoch and start offset both increase);
truncation trims them; the file is rewritten atomically on every change, which is rare
(once per leader change), so it never touches the produce path.
"""

from __future__ import annotations

import json
from pathlib import Path

from minibroker.broker.common.atomic_file import write_atomic

FILE_NAME = "leader-epoch-checkpoint"
UNDEFINED = -1


class EpochCacheError(RuntimeError):
    pass


class LeaderEpochCache:
    __slots__ = ("entries", "path")

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / FILE_NAME
        self.entries: list[tuple[int, int]] = []
        try:
            raw = json.loads(self.path.read_text())
            self.entries = [(int(e), int(o)) for e, o in raw]
        except FileNotFoundError:
            pass
        except (ValueError, TypeError) as exc:
            raise EpochCacheError(
                f"{self.path} is corrupt ({exc}); delete it to rebuild from the log"
            ) from None

    def _save(self) -> None:
        write_atomic(self.path, json.dumps(self.entries).encode())

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else UNDEFINED

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset`` (ignored unless it is newer).

        Entries that start at or after the new one are dropped: an epoch that never got
        a record owns no offsets.
        """
        if epoch < 0 or (self.entries and epoch <= self.entries[-1][0]):
            return
        while self.entries and self.entries[-1][1] >= start_offset:
            self.entries.pop()
        self.entries.append((epoch, start_offset))
        self._save()

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest known epoch <= ``epoch``, where it ends): Kafka's endOffsetFor."""
        if not self.entries or epoch < self.entries[0][0]:
            return UNDEFINED, UNDEFINED
        if epoch >= self.entries[-1][0]:
            return self.entries[-1][0], log_end_offset
        for i in range(len(self.entries) - 1, -1, -1):
            if self.entries[i][0] <= epoch:
                return self.entries[i][0], self.entries[i + 1][1]
        return UNDEFINED, UNDEFINED

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after ``end_offset`` (the log was cut there)."""
        kept = [e for e in self.entries if e[1] < end_offset]
        if kept != self.entries:
            self.entries = kept
            self._save()

    def clear(self) -> None:
        self.entries = []
        self._save()
