"""What the README promises of the client's public surface: the blocking facade has the
async clients' methods with their signatures, the send methods take ProducerRecord's
fields, and ``client.errors`` names each error class exactly once."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from minibroker import client, protocol
from minibroker.client import (
    Admin,
    Consumer,
    DeliveryHandle,
    Producer,
    SyncAdmin,
    SyncConsumer,
    SyncDeliveryHandle,
    SyncProducer,
)
from minibroker.client.records import ProducerRecord, takes_record

PAIRS = ((Admin, SyncAdmin), (Consumer, SyncConsumer), (Producer, SyncProducer))
# What the facade returns where the async method returns something to await.
SYNC_RESULT = {DeliveryHandle: SyncDeliveryHandle}


def public_methods(cls: type) -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def test_the_blocking_facade_has_every_method_of_the_async_clients():
    for async_cls, sync_cls in PAIRS:
        missing = public_methods(async_cls) - public_methods(sync_cls) - {"aclose"}
        assert missing == set(), (sync_cls.__name__, missing)


@pytest.mark.parametrize(
    ("async_cls", "sync_cls", "name"),
    [
        (a, s, name)
        for a, s in PAIRS
        for name in sorted(public_methods(a) - {"aclose"} | {"__init__"})
    ],
)
def test_each_facade_method_has_the_async_signature(async_cls, sync_cls, name):
    """Parameters (names, kinds, defaults, resolved annotations) equal; the return type the
    same once awaited: ``async def f() -> X`` is ``def f() -> X`` in the facade."""
    theirs = inspect.signature(getattr(async_cls, name), eval_str=True)
    ours = inspect.signature(getattr(sync_cls, name), eval_str=True)
    assert list(ours.parameters.values()) == list(theirs.parameters.values())
    returns = theirs.return_annotation
    assert ours.return_annotation == SYNC_RESULT.get(returns, returns)
    assert not inspect.iscoroutinefunction(getattr(sync_cls, name))


def test_sync_send_nowait_is_enqueue_as_the_readme_says():
    assert SyncProducer.send_nowait is SyncProducer.enqueue


def test_every_send_method_takes_producer_record_fields_in_order():
    fields = list(ProducerRecord._fields)
    for method in (Producer.send, Producer.enqueue, Producer.send_nowait, SyncProducer.send):
        params = list(inspect.signature(method).parameters.values())[1:]
        assert [p.name for p in params] == fields
        assert [p.default for p in params[1:]] == [
            ProducerRecord._field_defaults[f] for f in fields[1:]
        ]


class Recorder:
    @takes_record
    def take(self, fields):
        return fields


def test_takes_record_passes_positional_keyword_and_default_fields_in_record_order():
    r = Recorder()
    assert r.take("t") == ("t", None, None, None, None, None)
    assert r.take("t", b"v", partition=2, timestamp=7) == ("t", b"v", None, 2, None, 7)
    record = ProducerRecord("t", b"v", b"k", 1, {"h": b"x"}, 9)
    assert r.take(*record) == tuple(record)
    with pytest.raises(TypeError):
        r.take("t", colour="red")
    with pytest.raises(TypeError):
        r.take()


class AsyncRecorder:
    @takes_record
    async def take(self, fields):
        await trio.lowlevel.checkpoint()
        return fields


async def test_an_async_record_method_is_one_coroutine_the_facade_still_sees_as_async():
    """The generated function returns the method's coroutine (no second coroutine per
    record); what must know it is awaitable finds the coroutine function by unwrapping."""
    call = AsyncRecorder().take("t", b"v", timestamp=3)
    assert inspect.iscoroutine(call)
    assert call.cr_code is AsyncRecorder.take.__wrapped__.__code__
    assert await call == ("t", b"v", None, None, None, 3)
    assert inspect.iscoroutinefunction(inspect.unwrap(Producer.enqueue))
    assert inspect.iscoroutinefunction(inspect.unwrap(Producer.send))


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
