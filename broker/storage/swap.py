"""Swapping a cleaned segment in for the segments it replaces, crash-safe (Kafka's
``.cleaned`` / ``.swap`` files and ``LogLoader``'s completion of an interrupted swap).

The cleaner writes its copy of segments ``[base, end)`` as ``<base>.log.cleaned`` (and
``<base>.index.cleaned``, ``<base>.timeindex.cleaned``, ``<base>.txnindex.cleaned``),
fsynced. Renaming it to ``<base>.<end>.swap`` is the commit
point: before it, recovery deletes the ``.cleaned`` files and the old segments stand;
after it, recovery finishes the swap. Finishing deletes the replaced segments after the
first, puts the copy's indexes in place, then moves the swap file over ``<base>.log``
(one atomic rename replaces the first), so every crash leaves the old set or the new
one, never a mix. (The indexes go first: a crash before the last rename redoes the
steps, which then find no copy of an offset or time index and remove it, and the next
open rebuilds it; were they last, the old first segment's indexes would meet the new log
as corrupt. The aborted-transactions index cannot be rebuilt from the segment alone, so
the cleaner always writes its copy, and a redo that finds none keeps the one installed.) The end is in the
swap file's name because a cleaned copy may end below it (its tail compacted away):
its own offsets cannot tell which old segments it replaces.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from minibroker.broker.common.atomic_file import fsync_dir
from minibroker.broker.storage.segment import segment_name
from minibroker.broker.storage.time_index import SUFFIX as TIME_INDEX
from minibroker.broker.storage.txn_index import SUFFIX as TXN_INDEX

# A segment's files the cleaner writes beside its log; the last is not rebuilt on open.
INDEXES = (".index", TIME_INDEX, TXN_INDEX)

CLEANED = ".cleaned"
SWAP = ".swap"

Step = Callable[[], None]


def cleaned_log(directory: Path, base: int) -> Path:
    return directory / f"{segment_name(base)}.log{CLEANED}"


def cleaned_index(directory: Path, base: int) -> Path:
    return directory / f"{segment_name(base)}.index{CLEANED}"


def cleaned_time_index(directory: Path, base: int) -> Path:
    return directory / f"{segment_name(base)}{TIME_INDEX}{CLEANED}"


def cleaned_txn_index(directory: Path, base: int) -> Path:
    return directory / f"{segment_name(base)}{TXN_INDEX}{CLEANED}"


def swap_file(directory: Path, base: int, end: int) -> Path:
    return directory / f"{segment_name(base)}.{segment_name(end)}{SWAP}"


def commit(directory: Path, base: int, end: int) -> None:
    """The commit point: from here on a restart completes the swap. Durable (fsync of the
    directory) before any old segment goes; the cleaner runs it in its worker thread."""
    os.rename(cleaned_log(directory, base), swap_file(directory, base, end))
    fsync_dir(directory)


def swap_steps(directory: Path, base: int, end: int) -> list[Step]:
    """The file operations of a swap, in order (each a separate crash point in the tests)."""
    return [
        lambda: commit(directory, base, end),
        *finish_steps(directory, base, end),
        lambda: fsync_dir(directory),
    ]


def finish_steps(directory: Path, base: int, end: int) -> list[Step]:
    """After the commit: replace the old segments (renames and unlinks only, no fsync:
    the swap file is durable, so whatever of these a crash loses, recovery redoes)."""
    swap = swap_file(directory, base, end)
    first = directory / (segment_name(base) + ".log")
    steps: list[Step] = []
    for replaced in _segment_bases(directory):
        if base < replaced < end:
            for suffix in (*INDEXES, ".log"):  # the log last: a redo finds the base by it
                path = directory / (segment_name(replaced) + suffix)
                steps.append(lambda path=path: path.unlink(missing_ok=True))

    def install_index(suffix: str) -> None:
        index = directory / f"{segment_name(base)}{suffix}{CLEANED}"
        target = directory / (segment_name(base) + suffix)
        if index.exists() and suffix == TXN_INDEX and index.stat().st_size == 0:
            target.unlink(missing_ok=True)  # no entries: no file (target first, for a redo)
            index.unlink()
        elif index.exists():
            os.replace(index, target)
        elif suffix != TXN_INDEX:  # the old first segment's: wrong for the new file,
            target.unlink(missing_ok=True)  # rebuilt on open

    def install() -> None:
        os.replace(swap, first)

    indexes = [lambda suffix=suffix: install_index(suffix) for suffix in INDEXES]
    return [*steps, *indexes, install]


def discard_pending(directory: Path) -> bool:
    """Drop a pass's copies, committed or not, before retention or a truncation changes
    the segments they would replace (Kafka aborts cleaning for those): a swap must never
    be completed over segments that changed after it was made. True if any was there."""
    found = [*directory.glob(f"*{SWAP}"), *directory.glob(f"*{CLEANED}")]
    for path in found:
        path.unlink(missing_ok=True)
    if found:
        fsync_dir(directory)
    return bool(found)


def discard_uncommitted(directory: Path) -> None:
    """After a failed pass: its uncommitted copy goes (a committed swap never does here:
    it may be half done, and only recovery or a segment change may drop it)."""
    for path in directory.glob(f"*{CLEANED}"):
        path.unlink(missing_ok=True)


def _segment_bases(directory: Path) -> list[int]:
    return sorted(int(p.stem) for p in directory.glob("*.log") if p.stem.isdigit())


def recover_swaps(directory: Path) -> list[tuple[str, dict]]:
    """Before a log opens: finish committed swaps, drop uncommitted copies. Returns the
    ``(event, fields)`` to log."""
    events: list[tuple[str, dict]] = []
    for swap in sorted(directory.glob(f"*{SWAP}")):
        parts = swap.name[: -len(SWAP)].split(".")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            continue
        base, end = int(parts[0]), int(parts[1])
        for step in finish_steps(directory, base, end):
            step()
        events.append(("log_cleaner_swap_completed", {"file": str(swap)}))
    for cleaned in sorted(directory.glob(f"*{CLEANED}")):
        cleaned.unlink(missing_ok=True)
        events.append(("log_cleaner_copy_discarded", {"file": str(cleaned)}))
    if events:
        fsync_dir(directory)
    return events
