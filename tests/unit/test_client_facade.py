"""What the README promises of the client's public surface: the blocking facade has the
async clients' methods, and ``client.errors`` names each error class exactly once."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

from minibroker import client, protocol
from minibroker.client import Admin, Consumer, Producer, SyncAdmin, SyncConsumer, SyncProducer

# The facade's one deliberate rename: Producer.enqueue (waits for space) is send_nowait.
RENAMED = {("Producer", "enqueue"): "send_nowait"}


def public_methods(cls: type) -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def test_the_blocking_facade_has_every_method_of_the_async_clients():
    for async_cls, sync_cls in (
        (Admin, SyncAdmin),
        (Consumer, SyncConsumer),
        (Producer, SyncProducer),
    ):
        wanted = {RENAMED.get((async_cls.__name__, m), m) for m in public_methods(async_cls)}
        missing = wanted - public_methods(sync_cls) - {"aclose"}
        assert missing == set(), (sync_cls.__name__, missing)


def test_import_client_errors_works_as_documented():
    code = (
        "import minibroker.client.errors; print(minibroker.client.errors.RequestTimedOut.__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        check=True,
    )
    assert out.stdout.strip() == "RequestTimedOut"


def test_every_error_code_has_one_class_under_its_own_name():
    classes = {
        name: value
        for name, value in vars(client.errors).items()
        if isinstance(value, type) and issubclass(value, protocol.errors.KafkaError)
    }
    for name, cls in classes.items():
        assert cls.__name__ == name  # no alias under a different name
    codes = [cls.code for cls in classes.values() if cls is not protocol.errors.KafkaError]
    assert sorted(codes) == sorted(c for c in protocol.errors.ErrorCode if c.name != "NONE")
    assert client.errors.NetworkException is protocol.errors.NetworkException
    assert client.errors.RequestTimedOut.code is protocol.errors.ErrorCode.REQUEST_TIMED_OUT
