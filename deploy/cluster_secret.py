"""The cluster's shared secret: generated once per cluster, kept in its data dir (0600).

Brokers prove membership to each other with it (broker/cluster_auth.py). Each broker
gets the file's *path* (``cluster.secret.file``), never the secret itself: command
lines are visible to every user through ``ps``. The secret is never printed or logged.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

SECRET_FILE = "cluster.secret"


def ensure_cluster_secret(data_dir: Path) -> Path:
    """The absolute path of the cluster's secret file, created (mode 0600) if missing."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = (data_dir / SECRET_FILE).resolve()
    if path.exists():
        return path
    body = json.dumps(
        {"cluster_id": secrets.token_urlsafe(16), "secret": secrets.token_hex(32)}
    ).encode()
    tmp = path.with_name(f"{SECRET_FILE}.{os.getpid()}.tmp")
    # Created 0600 from the start (no window where others may read it), then renamed
    # into place: a concurrent starter either sees no file or a complete one.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # fails if another starter won the race: keep theirs
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path
