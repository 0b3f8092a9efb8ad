"""Executor side: fetch one offset range, bounded by its planned end, on a private trio loop.

Spark calls a reader's ``read()`` in a Python worker, possibly more than once for the
same partition, and never tells the reader it is done except by closing the
generator. So each read runs its own trio loop in a thread with its own
connections: the loop fetches (long polls, leader changes and retention handled
here) and hands raw, CRC-checked buffers over a small queue while the worker
thread turns the previous one into Arrow. Closing the generator stops the loop and
closes its connections. Fetches stop exactly at the range's end, so the same range
always gives the same records.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import trio

from minibroker.client.cluster import Cluster
from minibroker.client.fetcher import METADATA_ERRORS
from minibroker.client.offsets import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, list_offsets
from minibroker.client.records import TopicPartition
from minibroker.client.spark.ranges import OffsetRange
from minibroker.protocol import ApiKey, BatchHeader, iter_batches
from minibroker.protocol.errors import ErrorCode, KafkaError, RequestTimedOut, error_class

_DONE = object()


class DataLossError(RuntimeError):
    """Offsets a query was going to read are gone (retention, or a truncated log)."""


@dataclass(frozen=True)
class Chunk:
    """One fetch response's complete batches; only offsets in ``[low, high)`` are wanted."""

    buf: bytes
    batches: list[tuple[int, BatchHeader]]
    low: int
    high: int


def data_loss(tp: TopicPartition, first: int, last: int, why: str) -> DataLossError:
    return DataLossError(
        f"offsets {first}..{last} of {tp.topic}-{tp.partition} {why}; some data may have been "
        "lost. Set the option failOnDataLoss=false to skip what is gone and go on."
    )


class RangeFetcher:
    """``for chunk in RangeFetcher(config, rng, fail_on_data_loss=True): ...``."""

    def __init__(
        self, config: dict[str, Any], rng: OffsetRange, *, fail_on_data_loss: bool
    ) -> None:
        self.config = config
        self.range = rng
        self.tp = TopicPartition(rng.topic, rng.partition)
        self.fail_on_data_loss = fail_on_data_loss
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=2)
        self._stop = threading.Event()
        self._backoff = config["retry.backoff.ms"] / 1000
        self._patience = config["request.timeout.ms"] / 1000

    def __iter__(self) -> Iterator[Chunk]:
        thread = threading.Thread(target=self._run, name=f"minibroker-read-{self.tp}", daemon=True)
        thread.start()
        try:
            while True:
                item = self._queue.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._stop.set()
            while thread.is_alive():  # unblock a put() the loop may be waiting in
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    thread.join(0.05)

    # --- the loop thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            trio.run(self._main)
            outcome: Any = _DONE
        except BaseException as exc:
            outcome = exc
        if outcome is not _DONE:
            self._put_blocking(outcome)
        self._put_blocking(_DONE)

    def _put_blocking(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            cluster = Cluster(self.config, nursery)
            try:
                await self._fetch_all(cluster)
            finally:
                await cluster.aclose()

    async def _fetch_all(self, cluster: Cluster) -> None:
        offset, end = self.range.start, self.range.end
        progress_at = time.monotonic()
        await cluster.refresh([self.tp.topic])
        while offset < end and not self._stop.is_set():
            response = await self._fetch_once(cluster, offset)
            if response is None:
                pass
            elif response["error_code"] == ErrorCode.OFFSET_OUT_OF_RANGE:
                offset = await self._skip_lost(cluster, offset, end)
                progress_at = time.monotonic()
                continue
            else:
                batches, next_offset = self._complete_batches(response["records"], offset, end)
                if batches:
                    chunk = Chunk(response["records"], batches, offset, end)
                    if not await trio.to_thread.run_sync(self._put_blocking, chunk):
                        return
                    offset = next_offset
                    progress_at = time.monotonic()
                    continue
                if next_offset >= end:
                    return  # the rest of the range was compacted away
                if response["high_watermark"] < end and self._stalled(progress_at):
                    # The data was planned (below the HW then) but is not there now: a
                    # failover truncated the log below what we planned to read.
                    if self.fail_on_data_loss:
                        raise data_loss(self.tp, offset, end - 1, "are no longer in the log")
                    return
            if self._stalled(progress_at):
                raise RequestTimedOut(
                    f"no progress reading {self.tp.topic}-{self.tp.partition} at offset {offset} "
                    f"for {self._patience:g}s (kafka.request.timeout.ms)"
                )

    def _stalled(self, since: float) -> bool:
        return time.monotonic() - since > self._patience

    async def _fetch_once(self, cluster: Cluster, offset: int) -> dict | None:
        """One Fetch for ``offset``; None after a retriable problem (already backed off)."""
        leader = cluster.leader(*self.tp)
        try:
            if leader is None:
                raise error_class(ErrorCode.LEADER_NOT_AVAILABLE)(f"no leader for {self.tp}")
            body = {
                "max_wait_ms": self.config["fetch.max.wait.ms"],
                "min_bytes": 1,
                "max_bytes": self.config["fetch.max.bytes"],
                "topics": [
                    {
                        "name": self.tp.topic,
                        "partitions": [
                            {
                                "partition": self.tp.partition,
                                "fetch_offset": offset,
                                "partition_max_bytes": self.config["max.partition.fetch.bytes"],
                            }
                        ],
                    }
                ],
            }
            timeout = self._patience + self.config["fetch.max.wait.ms"] / 1000
            response = await cluster.request(leader, ApiKey.FETCH, body, timeout=timeout)
            part = response["topics"][0]["partitions"][0]
            code = part["error_code"]
            if code and code != ErrorCode.OFFSET_OUT_OF_RANGE:
                raise error_class(code)(part.get("error_message") or f"{self.tp}")
            return part
        except KafkaError as exc:
            if not (exc.retriable or exc.code in METADATA_ERRORS):
                raise
        await trio.sleep(self._backoff)
        try:
            await cluster.refresh([self.tp.topic])
        except KafkaError as exc:
            if not exc.retriable:
                raise
        return None

    @staticmethod
    def _complete_batches(buf: bytes, offset: int, end: int) -> tuple[list, int]:
        """The batches holding offsets in ``[offset, end)``, and the next offset to fetch."""
        batches = []
        next_offset = offset
        for pos, header in iter_batches(buf, verify=True, allow_partial=True):
            if header.base_offset >= end:
                # The log has nothing more below ``end``: the rest of the range is a
                # compacted topic's gap (the broker answers with the next batch there is).
                next_offset = max(next_offset, end)
                break
            if header.next_offset > offset:
                batches.append((pos, header))
                next_offset = header.next_offset
        return batches, next_offset

    async def _skip_lost(self, cluster: Cluster, offset: int, end: int) -> int:
        """OFFSET_OUT_OF_RANGE: fail (failOnDataLoss) or go on from what the log still has."""
        retries = {"backoff": self._backoff, "patience": self._patience}
        early = await list_offsets(cluster, {self.tp: EARLIEST_TIMESTAMP}, **retries)
        late = await list_offsets(cluster, {self.tp: LATEST_TIMESTAMP}, **retries)
        earliest, latest = early[self.tp].offset, late[self.tp].offset
        if offset < earliest:
            if self.fail_on_data_loss:
                last = min(earliest, end) - 1
                raise data_loss(
                    self.tp, offset, last, "were deleted (retention) before they were read"
                )
            return min(earliest, end)
        if offset >= latest:
            if self.fail_on_data_loss:
                raise data_loss(self.tp, offset, end - 1, "are past the end of the log")
            return end
        return offset  # the log moved under us but this offset is fine again: retry
