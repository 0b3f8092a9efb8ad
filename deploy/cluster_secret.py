"""The cluster's shared secret: generated once per cluster, kept in its data dir (0600).

Brokers prove membership to each other with it (broker/network/cluster_auth.py). Each broker
gets the file's *path* (``cluster.secret.file``), never the secret itself: command
lines are visible to every user through ``ps``. The secret is never printed or logged.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from minibroker.broker.common.atomic_file import write_atomic

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
    # 0600 from its creation on, and never replacing a file another starter wrote first:
    # of concurrent starters exactly one writes, the others keep its secret.
    write_atomic(path, body, mode=0o600, replace=False)
    return path
