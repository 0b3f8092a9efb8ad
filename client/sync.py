"""Blocking facade for scripts, notebooks and Spark executors.

Each Sync* object runs its own trio loop in a daemon thread. One task in that loop
owns the async client for its whole life (its nursery must open and close in one
task); the caller's methods cross over with ``trio.from_thread.run``. A call costs
a thread hop (tens of microseconds), so bulk producers should use ``send_many``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import trio

from minibroker.client.admin import Admin, NewTopic, TopicDescription
from minibroker.client.consumer import Consumer
from minibroker.client.offsets import OffsetAndTimestamp
from minibroker.client.producer import DeliveryHandle, Producer
from minibroker.client.records import ConsumerRecord, RecordMetadata, TopicPartition


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
    """``with SyncProducer("127.0.0.1:9092", acks=1) as p: p.send("t", b"v")``."""

    def __init__(
        self, bootstrap: str | None = None, config: Mapping[str, Any] | None = None, **settings: Any
    ) -> None:
        producer = Producer(bootstrap, config, **settings)  # validate settings in this thread
        self._loop = _LoopThread(lambda: producer, "minibroker-producer")

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        headers: Any = None,
        timestamp: int | None = None,
    ) -> RecordMetadata:
        """Send and block until acknowledged."""
        return self._loop.call(
            self._loop.client.send, topic, value, key, partition, headers, timestamp
        )

    def send_nowait(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        headers: Any = None,
        timestamp: int | None = None,
    ) -> SyncDeliveryHandle:
        """Queue a record (waits only for metadata or buffer space) and return its handle."""
        handle = self._loop.call(
            self._loop.client.enqueue, topic, value, key, partition, headers, timestamp
        )
        return SyncDeliveryHandle(self._loop, handle)

    def send_many(self, topic: str, records: Iterable[Any]) -> list[SyncDeliveryHandle]:
        """Queue many records in one thread hop. Each item is a value, or a dict with
        ``value`` and optionally ``key``, ``partition``, ``headers``, ``timestamp``."""
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

    def flush(self) -> None:
        self._loop.call(self._loop.client.flush)

    def partitions_for(self, topic: str) -> int | None:
        return self._loop.call_sync(self._loop.client.partitions_for, topic)

    def close_batches(self) -> None:
        self._loop.call_sync(self._loop.client.close_batches)

    def wait_for_partitions(self, topic: str) -> int:
        return self._loop.call(self._loop.client.wait_for_partitions, topic)


class SyncConsumer(_SyncBase):
    """``with SyncConsumer("127.0.0.1:9092", **{"auto.offset.reset": "earliest"}) as c: ...``."""

    def __init__(
        self, bootstrap: str | None = None, config: Mapping[str, Any] | None = None, **settings: Any
    ) -> None:
        consumer = Consumer(bootstrap, config, **settings)
        self._loop = _LoopThread(lambda: consumer, "minibroker-consumer")

    def assign(self, partitions: Iterable[tuple[str, int]]) -> None:
        self._loop.call_sync(self._loop.client.assign, list(partitions))

    def assignment(self) -> set[TopicPartition]:
        return self._loop.call_sync(self._loop.client.assignment)

    def seek(self, tp: tuple[str, int], offset: int) -> None:
        self._loop.call_sync(self._loop.client.seek, tp, offset)

    def seek_to_beginning(self, *partitions: tuple[str, int]) -> None:
        self._loop.call_sync(self._loop.client.seek_to_beginning, *partitions)

    def seek_to_end(self, *partitions: tuple[str, int]) -> None:
        self._loop.call_sync(self._loop.client.seek_to_end, *partitions)

    def position(self, tp: tuple[str, int]) -> int:
        return self._loop.call(self._loop.client.position, tp)

    def highwater(self, tp: tuple[str, int]) -> int:
        return self._loop.call_sync(self._loop.client.highwater, tp)

    def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[ConsumerRecord]:
        return self._loop.call(self._loop.client.poll, timeout_ms, max_records)

    def list_offsets(
        self, timestamps: Mapping[tuple[str, int], int]
    ) -> dict[TopicPartition, OffsetAndTimestamp]:
        return self._loop.call(self._loop.client.list_offsets, timestamps)

    def beginning_offsets(self, partitions: Iterable[tuple[str, int]]) -> dict[TopicPartition, int]:
        return self._loop.call(self._loop.client.beginning_offsets, list(partitions))

    def end_offsets(self, partitions: Iterable[tuple[str, int]]) -> dict[TopicPartition, int]:
        return self._loop.call(self._loop.client.end_offsets, list(partitions))

    def offsets_for_times(
        self, timestamps: Mapping[tuple[str, int], int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        return self._loop.call(self._loop.client.offsets_for_times, timestamps)

    def partitions_for(self, topic: str) -> int | None:
        return self._loop.call(self._loop.client.partitions_for, topic)


class SyncAdmin(_SyncBase):
    def __init__(
        self, bootstrap: str | None = None, config: Mapping[str, Any] | None = None, **settings: Any
    ) -> None:
        admin = Admin(bootstrap, config, **settings)
        self._loop = _LoopThread(lambda: admin, "minibroker-admin")

    def create_topics(self, topics: Iterable[NewTopic], **options: Any) -> dict[str, Any]:
        return self._loop.call(self._loop.client.create_topics, list(topics), **options)

    def delete_topics(self, names: Iterable[str], **options: Any) -> dict[str, Any]:
        """Delete topics; see ``Admin.delete_topics``."""
        return self._loop.call(self._loop.client.delete_topics, list(names), **options)

    def list_topics(self) -> list[str]:
        return self._loop.call(self._loop.client.list_topics)

    def describe_topics(self, names: Iterable[str] | None = None) -> dict[str, TopicDescription]:
        return self._loop.call(
            self._loop.client.describe_topics, None if names is None else list(names)
        )

    def describe_cluster(self) -> Any:
        return self._loop.call(self._loop.client.describe_cluster)

    def broker_stats(self, node_id: int | None = None) -> dict[str, Any]:
        return self._loop.call(self._loop.client.broker_stats, node_id)

    def faults(self, node_id: int, action: str, **spec: Any) -> list[dict[str, Any]]:
        """Inject or clear a fault on one broker; see ``Admin.faults``."""
        return self._loop.call(self._loop.client.faults, node_id, action, **spec)
