"""Who owns a data directory, and how its last owner left.

One broker process per data directory (Kafka's LogManager locks each log dir the same
way): an exclusive ``flock`` on ``<data dir>/.lock``, held open for the broker's life,
the file naming the owner's pid. The kernel's record of that lock is what tools outside
the broker (``minibroker cluster``) prove a process is a data dir's broker by: unlike a
process start time read back from /proc, it does not move when the wall clock does.

A broker that shut down cleanly leaves ``.kafka_cleanshutdown`` (Kafka's marker of the
same name) and removes it when it starts, so "not running" can be told apart: stopped
cleanly, or killed/crashed.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = ".lock"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
_PROC_LOCKS = Path("/proc/locks")


class DataDirInUse(RuntimeError):
    """Another broker process holds this data directory."""


def lock_data_dir(data_dir: Path) -> int:
    """Take the data dir (or raise DataDirInUse); the fd, to keep open while the broker runs."""
    return open_data_dir(data_dir)[0]


def open_data_dir(data_dir: Path) -> tuple[int, bool]:
    """``lock_data_dir``, and whether the last broker shut down cleanly: read under the
    lock, before this life removes the marker (Kafka's LogManager deletes it before
    loading a log, so a crash while loading counts as unclean too)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirInUse(f"data dir {data_dir} is in use by another broker process") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    # This life has begun: until it ends cleanly, the dir's last shutdown was not clean.
    try:
        os.unlink(data_dir / CLEAN_SHUTDOWN_FILE)
    except FileNotFoundError:
        return fd, False
    return fd, True


def mark_clean_shutdown(data_dir: Path) -> None:
    """Called last by a broker that shut down cleanly, while it still holds the lock."""
    (data_dir / CLEAN_SHUTDOWN_FILE).write_text(str(os.getpid()))


def shut_down_cleanly(data_dir: Path) -> bool:
    """True if the data dir's last broker left it with a clean shutdown."""
    return (data_dir / CLEAN_SHUTDOWN_FILE).exists()


def lock_holder(data_dir: Path) -> int | None:
    """The pid of the process holding ``data_dir``'s lock (0: held, by a pid we cannot
    name); None if no process holds it.

    Read from the kernel's lock table (/proc/locks), which never takes the lock itself: a
    probe with flock would, for an instant, make a broker starting on this dir fail.
    Without /proc/locks (not Linux) it probes with flock after all; the pid is the file's.
    """
    path = data_dir / LOCK_FILE
    try:
        st = os.stat(path)
    except OSError:
        return None
    try:
        table = _PROC_LOCKS.read_text()
    except OSError:
        return _probe(path)
    # "1: FLOCK  ADVISORY  WRITE 6698 fe:00:2149825 0 EOF" (major:minor in hex)
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        if "->" in fields:  # a waiter blocked on a lock, not a holder
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == wanted:
            return int(fields[4])
    return None


def _probe(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            return int(os.read(fd, 32).strip() or b"0")
        except ValueError:
            return 0
    finally:
        os.close(fd)  # releases the probe's own lock, if it got one
    return None
