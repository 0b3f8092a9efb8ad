"""The replicated log as the core sees it: entries after the latest snapshot, plus that snapshot.

Kafka's ReplicatedLog, in memory: the metadata log is small, and the driver keeps the durable
copy by applying the same effects (``apply``), so a restarted voter rebuilds this from disk.
"""

from __future__ import annotations

from dataclasses import dataclass

from minibroker.broker.raft.effects import AppendLog, Effect, StoreSnapshot, TruncateLog
from minibroker.broker.raft.messages import Entry, OffsetAndEpoch, Snapshot


@dataclass(slots=True, frozen=True)
class ValidOffsetAndEpoch:
    """Kafka's ValidOffsetAndEpoch: ``kind`` is "valid", "diverging" or "snapshot"."""

    kind: str
    offset_and_epoch: OffsetAndEpoch


class RaftLog:
    __slots__ = ("entries", "snapshot")

    def __init__(self, snapshot: Snapshot | None = None, entries: list[Entry] | None = None):
        self.snapshot = snapshot
        self.entries: list[Entry] = list(entries or ())

    def copy(self) -> RaftLog:
        return RaftLog(self.snapshot, self.entries)

    @property
    def start_offset(self) -> int:
        return self.snapshot.snapshot_id.offset if self.snapshot else 0

    @property
    def end_offset(self) -> int:
        return self.start_offset + len(self.entries)

    @property
    def last_epoch(self) -> int:
        if self.entries:
            return self.entries[-1].epoch
        return self.snapshot.snapshot_id.epoch if self.snapshot else 0

    def end_offset_and_epoch(self) -> OffsetAndEpoch:
        return OffsetAndEpoch(self.end_offset, self.last_epoch)

    def entry(self, offset: int) -> Entry | None:
        index = offset - self.start_offset
        return self.entries[index] if 0 <= index < len(self.entries) else None

    def epoch_at(self, offset: int) -> int:
        """The epoch of the entry at ``offset - 1`` (what a fetch names as last fetched epoch)."""
        if offset == self.start_offset:
            return self.snapshot.snapshot_id.epoch if self.snapshot else 0
        entry = self.entry(offset - 1)
        if entry is None:
            raise ValueError(f"offset {offset} is outside the log")
        return entry.epoch

    def read(self, offset: int, max_entries: int, max_bytes: int) -> tuple[Entry, ...]:
        """Entries from ``offset``: at most ``max_entries`` and ``max_bytes`` of data, but the
        first one always, whatever its size (a change is one entry and is never split)."""
        index = offset - self.start_offset
        out = self.entries[index : index + max_entries]
        size = 0
        for count, entry in enumerate(out):
            size += len(entry.data)
            if size > max_bytes and count > 0:
                return tuple(out[:count])
        return tuple(out)

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        """The largest epoch <= ``epoch`` in the log and the end offset of that epoch (Kafka's)."""
        for entry in reversed(self.entries):
            if entry.epoch <= epoch:
                return OffsetAndEpoch(entry.offset + 1, entry.epoch)
        if self.snapshot is not None:
            return self.snapshot.snapshot_id
        return OffsetAndEpoch(0, 0)

    def validate_offset_and_epoch(self, offset: int, epoch: int) -> ValidOffsetAndEpoch:
        """Does a follower whose log ends at (``offset``, ``epoch``) match this log?"""
        if self.start_offset == 0 and offset == 0:
            return ValidOffsetAndEpoch("valid", OffsetAndEpoch(0, 0))
        snap = self.snapshot
        if snap is not None and (
            offset < self.start_offset
            or (offset == self.start_offset and epoch != snap.snapshot_id.epoch)
            or epoch < snap.snapshot_id.epoch
        ):
            return ValidOffsetAndEpoch("snapshot", snap.snapshot_id)
        end = self.end_offset_for_epoch(epoch)
        if end.epoch != epoch or end.offset < offset:
            return ValidOffsetAndEpoch("diverging", end)
        return ValidOffsetAndEpoch("valid", OffsetAndEpoch(offset, epoch))

    def truncation_offset(self, diverging: OffsetAndEpoch) -> int:
        """Where a follower truncates on a DivergingEpoch answer (truncateToEndOffset)."""
        local = self.end_offset_for_epoch(diverging.epoch)
        if local.epoch == diverging.epoch:
            return min(local.offset, diverging.offset)
        return local.offset

    # -- the durable operations, shared by the core and by whoever mirrors it on disk --

    def append(self, entries: tuple[Entry, ...]) -> None:
        if entries and entries[0].offset != self.end_offset:
            raise ValueError(f"append at {entries[0].offset} to a log ending at {self.end_offset}")
        self.entries.extend(entries)

    def truncate(self, offset: int) -> None:
        if offset < self.start_offset:
            raise ValueError(f"truncate to {offset} below the log start {self.start_offset}")
        del self.entries[offset - self.start_offset :]

    def store_snapshot(self, snapshot: Snapshot) -> None:
        """Keep the suffix after the snapshot if the log agrees with it, else drop the whole log.

        Kafka's deleteBeforeSnapshot / truncateToLatestSnapshot in one rule: a snapshot of our
        own committed state keeps the entries after it; one fetched from a leader replaces a
        log that is shorter than it or that diverges at its end.
        """
        sid = snapshot.snapshot_id
        if self.snapshot is not None and sid.offset <= self.start_offset:
            return  # older than what we have: nothing to gain
        at = self.entry(sid.offset - 1)
        keep = at is not None and at.epoch == sid.epoch
        index = sid.offset - self.start_offset
        self.entries = self.entries[index:] if keep else []
        self.snapshot = snapshot

    def apply(self, effect: Effect) -> None:
        if isinstance(effect, AppendLog):
            self.append(effect.entries)
        elif isinstance(effect, TruncateLog):
            self.truncate(effect.offset)
        elif isinstance(effect, StoreSnapshot):
            self.store_snapshot(effect.snapshot)
