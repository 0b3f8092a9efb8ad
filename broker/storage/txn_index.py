"""The aborted-transactions index: Kafka's TransactionIndex (``<base>.txnindex`` per segment).

A read_committed consumer must drop the records of aborted transactions, which sit in
the log between other records; the fetch answer names them (producer id, first offset)
and the consumer skips that producer's transactional batches from there up to its abort
marker. An entry is written when an abort marker lands, into the file of the segment
that holds the marker: producer id, first offset of the transaction, last offset (the
marker's), and the last stable offset at that moment, which lets a lookup stop early: an
entry whose LSO is past the range asked about means no later entry can concern it.

Entries are fixed-size records in Kafka's layout (version int16 0, then four int64), in
marker order, so a truncation cuts each file at an entry boundary and a lookup bisects.
All of a log's entries are kept in memory (one small object per aborted transaction);
a segment's file goes with the segment (``Segment.delete``). The index is derived
state: the log's recovery replays the batches after the producer-state snapshot and
rewrites the entries of markers found there (``truncate_from`` before the replay), so a
crash that loses an unflushed entry loses nothing.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_left
from collections.abc import Iterable
from pathlib import Path

from minibroker.broker.storage.segment import segment_name

SUFFIX = ".txnindex"
_ENTRY = struct.Struct(">hqqqq")  # version, producer id, first, last, last stable offset
ENTRY_SIZE = _ENTRY.size  # 34, as Kafka's


class AbortedTxn:
    """One aborted transaction: its records are ``[first_offset, last_offset)`` of
    ``producer_id``'s transactional batches; ``last_offset`` is the abort marker."""

    __slots__ = ("first_offset", "last_offset", "last_stable_offset", "producer_id")

    def __init__(
        self, producer_id: int, first_offset: int, last_offset: int, last_stable_offset: int
    ) -> None:
        self.producer_id = producer_id
        self.first_offset = first_offset
        self.last_offset = last_offset
        self.last_stable_offset = last_stable_offset

    def __repr__(self) -> str:
        return (
            f"AbortedTxn(pid={self.producer_id}, first={self.first_offset}, "
            f"last={self.last_offset}, lso={self.last_stable_offset})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AbortedTxn) and self._key() == other._key()

    def _key(self) -> tuple[int, int, int, int]:
        return (self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset)


def index_path(directory: Path, base_offset: int) -> Path:
    return directory / (segment_name(base_offset) + SUFFIX)


def pack_entries(entries: Iterable[AbortedTxn]) -> bytes:
    """Entries as a ``.txnindex`` file holds them."""
    return b"".join(
        _ENTRY.pack(0, e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset)
        for e in entries
    )


class TransactionIndex:
    """Every aborted transaction of one log, in marker order; one file per segment."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.entries: list[AbortedTxn] = []
        self._last_offsets: list[int] = []  # entries' last offsets, for bisecting

    def __len__(self) -> int:
        return len(self.entries)

    # --- loading --------------------------------------------------------------------------

    def load(self, bases: list[int]) -> list[str]:
        """Read the files of the segments ``bases`` (ascending); returns problems found (a
        torn tail is cut at the last whole entry; recovery replays what it lost)."""
        self.entries.clear()
        self._last_offsets.clear()
        problems = []
        for base in bases:
            path = index_path(self.dir, base)
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                continue
            whole = len(raw) - len(raw) % ENTRY_SIZE
            if whole != len(raw):
                problems.append(f"{path.name}: torn entry at byte {whole}")
                os.truncate(path, whole)
            for at in range(0, whole, ENTRY_SIZE):
                version, pid, first, last, lso = _ENTRY.unpack_from(raw, at)
                if version != 0 or (self._last_offsets and last < self._last_offsets[-1]):
                    problems.append(f"{path.name}: bad entry at byte {at}")
                    os.truncate(path, at)
                    break
                self._add(AbortedTxn(pid, first, last, lso))
        return problems

    def _add(self, entry: AbortedTxn) -> None:
        self.entries.append(entry)
        self._last_offsets.append(entry.last_offset)

    # --- changes --------------------------------------------------------------------------

    def append(self, segment_base: int, entry: AbortedTxn) -> None:
        """An abort marker landed in the segment starting at ``segment_base``."""
        if self._last_offsets and entry.last_offset <= self._last_offsets[-1]:
            raise ValueError(
                f"aborted txn ending at {entry.last_offset} is not after {self._last_offsets[-1]}"
            )
        data = pack_entries([entry])
        fd = os.open(index_path(self.dir, segment_base), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self._add(entry)

    def truncate_from(self, offset: int, bases: list[int]) -> None:
        """Forget entries whose marker is at or above ``offset`` (a truncation, or the
        part of the log recovery replays); files of ``bases`` are cut to match."""
        keep = bisect_left(self._last_offsets, offset)
        if keep == len(self.entries):
            return
        del self.entries[keep:]
        del self._last_offsets[keep:]
        for i, base in enumerate(bases):
            end = bases[i + 1] if i + 1 < len(bases) else None
            if end is not None and end <= offset:
                continue
            path = index_path(self.dir, base)
            if not path.exists():
                continue
            lo = bisect_left(self._last_offsets, base)
            hi = len(self.entries) if end is None else bisect_left(self._last_offsets, end)
            if path.stat().st_size > (hi - lo) * ENTRY_SIZE:
                os.truncate(path, (hi - lo) * ENTRY_SIZE)

    def forget_below(self, log_start_offset: int) -> None:
        """Segments below the log start were deleted (their files with them)."""
        drop = bisect_left(self._last_offsets, log_start_offset)
        if drop:
            del self.entries[:drop]
            del self._last_offsets[:drop]

    def replace(self, segment_base: int, end_offset: int, entries: Iterable[AbortedTxn]) -> None:
        """The cleaner replaced segments ``[segment_base, end_offset)`` by one, whose file
        (installed by the swap, swap.py) holds ``entries``: the transactions whose abort
        marker it kept with records of theirs still in the log (cleaner_txn.py)."""
        lo = bisect_left(self._last_offsets, segment_base)
        hi = bisect_left(self._last_offsets, end_offset)
        kept = list(entries)
        self.entries[lo:hi] = kept
        self._last_offsets[lo:hi] = [e.last_offset for e in kept]

    def reset(self) -> None:
        self.entries.clear()
        self._last_offsets.clear()
        for path in self.dir.glob("*" + SUFFIX):
            path.unlink(missing_ok=True)

    # --- lookup ---------------------------------------------------------------------------

    def collect(self, fetch_offset: int, upper_bound: int) -> list[tuple[int, int]]:
        """``(producer_id, first_offset)`` of the aborted transactions with records in
        ``[fetch_offset, upper_bound)``: Kafka's collectAbortedTxns, stopping at the first
        entry whose LSO reaches ``upper_bound`` (no later abort can start below it)."""
        out = []
        entries = self.entries
        for i in range(bisect_left(self._last_offsets, fetch_offset), len(entries)):
            entry = entries[i]
            if entry.first_offset < upper_bound:
                out.append((entry.producer_id, entry.first_offset))
            if entry.last_stable_offset >= upper_bound:
                break
        return out
