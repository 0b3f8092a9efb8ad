"""Blocking facade for scripts, notebooks and Spark executors.

Each Sync* object runs its own trio loop in a daemon thread. One task in that loop
owns the async client for its whole life (its nursery must open and close in one
task); the caller's methods cross over with ``trio.from_thread.run``. A call costs
a thread hop (tens of microseconds), so bulk producers should use ``send_many``.

The facade's methods are derived from the async classes' (:func:`blocking`), so their
signatures, annotations and docstrings are the async ones with the awaiting taken out.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

import trio

from minibroker.client.admin import Admin
from minibroker.client.background import ClusterClient
from minibroker.client.consumer import Consumer
from minibroker.client.producer import DeliveryHandle, Producer
from minibroker.client.records import RecordMetadata


class _LoopThread:
    """A trio loop in a thread, holding one async client open until close()."""

    def __init__(self, make_client: Callable[[], Any], name: str) -> None:
        self._make_client = make_client
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self.client: Any = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            if self._error is None:
                self._error = exc
        finally:
            self._started.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        try:
            async with self._make_client() as client:
                self.client = client
                self._started.set()
                await self._stop.wait()
        except BaseException as exc:
            self._error = exc
            raise

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run an async method of the client in its loop and wait for the result."""
        if self.client is None or not self._thread.is_alive():
            raise RuntimeError("this client is closed")
        return trio.from_thread.run(functools.partial(fn, *args, **kwargs), trio_token=self._token)

    def call_sync(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.client is None or not self._thread.is_alive():
            raise RuntimeError("this client is closed")
        return trio.from_thread.run_sync(
            functools.partial(fn, *args, **kwargs), trio_token=self._token
        )

    def close(self) -> None:
        """Leave the client's ``async with`` (a producer flushes) and end the thread."""
        if self._thread.is_alive() and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
            self._thread.join()
        self.client = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


_P = ParamSpec("_P")
_R = TypeVar("_R")
_W = TypeVar("_W")


@overload
def blocking(
    method: Callable[Concatenate[Any, _P], Coroutine[Any, Any, _R]],
) -> Callable[Concatenate[Any, _P], _R]: ...
@overload
def blocking(method: Callable[Concatenate[Any, _P], _R]) -> Callable[Concatenate[Any, _P], _R]: ...
@overload
def blocking(
    method: Callable[Concatenate[Any, _P], Any], wrap: type[_W]
) -> Callable[Concatenate[Any, _P], _W]: ...
def blocking(method: Callable[..., Any], wrap: type | None = None) -> Callable[..., Any]:
    """The facade's method for the async client's ``method``: the same parameters, run in
    the client's loop, returning the result, or ``wrap(loop, result)``, once there.

    A coroutine method is awaited in the loop; a plain one runs there too, since the
    client's state belongs to the loop's thread.
    """
    name = method.__name__
    awaited = inspect.iscoroutinefunction(inspect.unwrap(method))

    def facade(self: _SyncBase, *args: Any, **kwargs: Any) -> Any:
        loop = self._loop
        call = loop.call if awaited else loop.call_sync
        result = call(getattr(loop.client, name), *args, **kwargs)
        return result if wrap is None else wrap(loop, result)

    signature = inspect.signature(method, eval_str=True)
    if wrap is not None:
        signature = signature.replace(return_annotation=wrap)
    return _described(facade, method, signature)


def opening(client_type: type[ClusterClient]) -> Callable[..., None]:
    """The facade's ``__init__``: the async client's parameters (a producer's ``identity``
    too), the client built in the caller's thread so bad settings raise there."""

    def __init__(self: _SyncBase, *args: Any, **kwargs: Any) -> None:
        client = client_type(*args, **kwargs)
        self._loop = _LoopThread(lambda: client, f"minibroker-{client.ROLE}")

    init = client_type.__init__
    return _described(__init__, init, inspect.signature(init, eval_str=True))


def _described(
    facade: Callable[..., Any], method: Callable[..., Any], signature: inspect.Signature
) -> Callable[..., Any]:
    """Give the facade the async method's name, docstring and (resolved) signature."""
    facade.__name__ = facade.__qualname__ = method.__name__
    facade.__doc__ = method.__doc__
    facade.__signature__ = signature
    facade.__annotations__ = {
        **{p.name: p.annotation for p in signature.parameters.values() if p.name != "self"},
        "return": signature.return_annotation,
    }
    return facade


class _SyncBase:
    _loop: _LoopThread

    def close(self) -> None:
        self._loop.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class SyncDeliveryHandle:
    """A DeliveryHandle for threads: ``result(timeout)`` blocks until the ack."""

    __slots__ = ("_handle", "_loop")

    def __init__(self, loop: _LoopThread, handle: DeliveryHandle) -> None:
        self._loop = loop
        self._handle = handle

    def done(self) -> bool:
        return self._handle.done()

    def result(self, timeout: float | None = None) -> RecordMetadata:
        async def wait() -> RecordMetadata:
            with trio.fail_after(timeout if timeout is not None else float("inf")):
                return await self._handle

        if self._handle.done():
            return self._handle.result()
        return self._loop.call(wait)


class SyncProducer(_SyncBase):
    """``with SyncProducer("127.0.0.1:9092", acks=1) as p: p.send("t", b"v")``.

    ``send_nowait`` is ``enqueue`` here: a blocking caller waits for buffer space (up to
    ``max.block.ms``) rather than handling BufferFull.
    """

    __init__ = opening(Producer)
    send = blocking(Producer.send)
    enqueue = blocking(Producer.enqueue, SyncDeliveryHandle)
    send_nowait = enqueue
    flush = blocking(Producer.flush)
    metrics = blocking(Producer.metrics)
    close_batches = blocking(Producer.close_batches)
    wait_for_partitions = blocking(Producer.wait_for_partitions)
    partitions_for = blocking(Producer.partitions_for)
    init_transactions = blocking(Producer.init_transactions)
    begin_transaction = blocking(Producer.begin_transaction)
    send_offsets_to_transaction = blocking(Producer.send_offsets_to_transaction)
    commit_transaction = blocking(Producer.commit_transaction)
    abort_transaction = blocking(Producer.abort_transaction)

    @property
    def transaction_state(self) -> str | None:
        """The transactional producer's state (see Producer.transaction_state)."""
        return self._loop.client.transaction_state

    def send_many(self, topic: str, records: Iterable[Any]) -> list[SyncDeliveryHandle]:
        """Queue many records in one thread hop. Each item is a value, or a dict of
        ProducerRecord's other fields (``value``, ``key``, ``partition``, ...)."""
        items = list(records)
        producer: Producer = self._loop.client

        async def enqueue_all() -> list[DeliveryHandle]:
            out = []
            for item in items:
                if isinstance(item, Mapping):
                    out.append(await producer.enqueue(topic, **item))
                else:
                    out.append(await producer.enqueue(topic, item))
            return out

        return [SyncDeliveryHandle(self._loop, h) for h in self._loop.call(enqueue_all)]


class SyncConsumer(_SyncBase):
    """``with SyncConsumer("127.0.0.1:9092", **{"auto.offset.reset": "earliest"}) as c: ...``."""

    __init__ = opening(Consumer)
    assign = blocking(Consumer.assign)
    assignment = blocking(Consumer.assignment)
    seek = blocking(Consumer.seek)
    seek_to_beginning = blocking(Consumer.seek_to_beginning)
    seek_to_end = blocking(Consumer.seek_to_end)
    position = blocking(Consumer.position)
    highwater = blocking(Consumer.highwater)
    poll = blocking(Consumer.poll)
    list_offsets = blocking(Consumer.list_offsets)
    beginning_offsets = blocking(Consumer.beginning_offsets)
    end_offsets = blocking(Consumer.end_offsets)
    offsets_for_times = blocking(Consumer.offsets_for_times)
    partitions_for = blocking(Consumer.partitions_for)
    subscribe = blocking(Consumer.subscribe)
    subscription = blocking(Consumer.subscription)
    commit = blocking(Consumer.commit)
    commit_async = blocking(Consumer.commit_async)
    committed = blocking(Consumer.committed)
    group_metadata = blocking(Consumer.group_metadata)
    metrics = blocking(Consumer.metrics)


class SyncAdmin(_SyncBase):
    """``with SyncAdmin("127.0.0.1:9092") as a: a.create_topics([NewTopic("t", 3, 3)])``."""

    __init__ = opening(Admin)
    create_topics = blocking(Admin.create_topics)
    delete_topics = blocking(Admin.delete_topics)
    create_partitions = blocking(Admin.create_partitions)
    describe_configs = blocking(Admin.describe_configs)
    incremental_alter_configs = blocking(Admin.incremental_alter_configs)
    alter_configs = blocking(Admin.alter_configs)
    list_topics = blocking(Admin.list_topics)
    describe_topics = blocking(Admin.describe_topics)
    describe_cluster = blocking(Admin.describe_cluster)
    broker_stats = blocking(Admin.broker_stats)
    faults = blocking(Admin.faults)
    list_offsets = blocking(Admin.list_offsets)
    delete_records = blocking(Admin.delete_records)
    describe_log_dirs = blocking(Admin.describe_log_dirs)
    describe_producers = blocking(Admin.describe_producers)
    list_consumer_groups = blocking(Admin.list_consumer_groups)
    find_coordinator = blocking(Admin.find_coordinator)
    describe_consumer_group = blocking(Admin.describe_consumer_group)
    delete_consumer_groups = blocking(Admin.delete_consumer_groups)
    list_consumer_group_offsets = blocking(Admin.list_consumer_group_offsets)
    alter_consumer_group_offsets = blocking(Admin.alter_consumer_group_offsets)
    delete_consumer_group_offsets = blocking(Admin.delete_consumer_group_offsets)
    elect_leaders = blocking(Admin.elect_leaders)
    alter_client_quotas = blocking(Admin.alter_client_quotas)
    describe_client_quotas = blocking(Admin.describe_client_quotas)
    list_transactions = blocking(Admin.list_transactions)
    describe_transactions = blocking(Admin.describe_transactions)
    metrics = blocking(Admin.metrics)
