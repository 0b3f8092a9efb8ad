"""One broker process per data directory (Kafka's LogManager locks each log dir the same
way): an exclusive ``flock`` on ``<data dir>/.lock``, which holds the owner's pid."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class DataDirInUse(RuntimeError):
    """Another broker process holds this data directory."""


def lock_data_dir(data_dir: Path) -> int:
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirInUse(f"data dir {data_dir} is in use by another broker process") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd
