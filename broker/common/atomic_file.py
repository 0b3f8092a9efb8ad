"""Atomic file writes: a crash leaves the old file or the new one, never half of either.

The one way every checkpoint, snapshot and state file of ours is written (Kafka's
``Utils.atomicMoveWithFallback`` after a flushed temp file)."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(
    path: Path, data: bytes, *, mode: int = 0o644, replace: bool = True, sync: bool = True
) -> bool:
    """Write a temp file, fsync it, move it into place, fsync the directory.

    ``mode`` is the file's permissions from its creation on (a secret is never readable
    by others, not even for an instant). With ``replace=False`` an existing file wins:
    the move is a hard link that fails if ``path`` exists, so of several concurrent
    writers exactly one succeeds; the others get False and keep the winner's file.
    ``sync=False`` leaves both fsyncs to the caller (a roll's flush does them off the
    loop, as Kafka's for its producer snapshot): until then a crash may leave a torn new
    file, so only for files whose reader checks them (a CRC) and can do without them.
    """
    # The pid keeps concurrent writers (two CLI commands, say) off each other's temp file.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                tmp.unlink()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync:
        fsync_dir(path.parent)
    return True


def fsync_dir(directory: Path) -> None:
    """Make the renames and unlinks done in ``directory`` durable."""
    fsync_path(directory)


def fsync_path(path: Path, *, missing_ok: bool = False) -> None:
    """fsync a file or directory by name, on a descriptor of its own (a flush in a worker
    thread never shares one the loop may close). ``missing_ok``: a file deleted meanwhile
    needs no durability."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        if missing_ok:
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
