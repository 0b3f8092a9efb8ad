"""The broker's delayed operations: acks=all produces and min.bytes fetches (kafka-semantics §3, §4).

Both complete on the trio thread: triggers call ``check_and_complete`` from request
handlers, and the timer thread hands expired operations to the loop in batches.
When the connection that asked closes, ``abandon`` completes them at once without
building an answer (ReplicaManager tracks which connection parked what). They see
partitions only through a lookup passed in, and change no replication state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.purgatory import DelayedOperation
from minibroker.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from minibroker.broker.replication.fetch_request import FetchRequest
    from minibroker.broker.replication.partition import Partition

Key = tuple[str, int]


class ProducePartitionStatus:
    __slots__ = (
        "acks_pending",
        "base_offset",
        "error",
        "message",
        "record_errors",
        "required_offset",
    )

    def __init__(
        self,
        error: ErrorCode,
        base_offset: int,
        required_offset: int,
        message: str | None = None,
        record_errors: list | None = None,
    ) -> None:
        self.error = error
        self.message = message  # why an append was refused (which batch field, say)
        # Kafka's per-record errors of a refused batch (KIP-467): (batch_index, message).
        self.record_errors = record_errors
        self.base_offset = base_offset
        self.required_offset = required_offset
        # A successful append waits for the HW; until then a timeout reports REQUEST_TIMED_OUT.
        self.acks_pending = error is ErrorCode.NONE and required_offset >= 0
        if self.acks_pending:
            self.error = ErrorCode.REQUEST_TIMED_OUT


class _Parked(DelayedOperation):
    """A request parked on behalf of one connection; ``parked_in`` is that connection's set."""

    __slots__ = ("parked_in", "response")

    def abandon(self) -> None:
        """The connection went away: complete now (leaving the timer), answer nobody.

        A completed op is skipped by every trigger and dropped from the watcher lists by
        the purgatory's purge; ``on_complete`` frees what it holds.
        """
        self.response = None
        self.force_complete()

    def _release(self) -> None:
        parked = self.parked_in
        if parked is not None:
            parked.discard(self)
            self.parked_in = None


class DelayedProduce(_Parked):
    """Completes when every appended partition's HW reaches its last offset + 1.

    ``get_partition`` looks a partition up by key (the manager's registry, passed in): a
    partition that is gone answers UNKNOWN_TOPIC_OR_PARTITION, as Kafka's does.
    """

    __slots__ = ("get_partition", "statuses")

    def __init__(
        self,
        delay_ms: int,
        statuses: dict[Key, ProducePartitionStatus],
        get_partition: Callable[[Key], Partition | None],
    ) -> None:
        super().__init__(delay_ms)
        self.statuses = statuses
        self.get_partition = get_partition
        self.response = PendingResponse()
        self.parked_in: set | None = None

    def try_complete(self) -> bool:
        lookup = self.get_partition
        pending = False
        for key, status in self.statuses.items():
            if not status.acks_pending:
                continue
            partition = lookup(key)
            if partition is None:
                status.acks_pending = False
                status.error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            done, error = partition.check_enough_replicas_reach_offset(status.required_offset)
            if done:
                status.acks_pending = False
                status.error = error
            else:
                pending = True
        if pending:
            return False
        return self.force_complete()

    def on_complete(self) -> None:
        if self.response is not None:  # None: abandoned, nobody to answer
            self.response.set(produce_response(self.statuses))
        self._release()
        # The op may linger on other keys' watch lists until a purge: keep nothing heavy
        # alive through it (KAFKA-19389). The waiting handler holds its own reference.
        self.get_partition = self.statuses = self.response = None

    def on_expiration(self) -> None:
        pass


class DelayedFetch(_Parked):
    """Completes when ``min_bytes`` are readable, on an error or a leadership change.

    ``get_partition`` looks a partition up by key; ``read`` builds the answer when it
    completes (a read that does not count as a follower fetch: Kafka's
    readFromPurgatory). Both come from the manager, which the op never sees.
    """

    __slots__ = ("fetch", "get_partition", "read")

    def __init__(
        self,
        delay_ms: int,
        fetch: FetchRequest,
        get_partition: Callable[[Key], Partition | None],
        read: Callable[[FetchRequest], dict],
    ) -> None:
        super().__init__(delay_ms)
        self.fetch = fetch
        self.get_partition = get_partition
        self.read = read
        # Its connection budgets the largest answer it may give (broker/network/outbox.py).
        self.response = PendingResponse(fetch.response_bound)
        self.parked_in: set | None = None

    def try_complete(self) -> bool:
        fetch = self.fetch
        lookup = self.get_partition
        for_follower = fetch.for_follower
        min_bytes = fetch.min_bytes
        accumulated = 0
        for key, offset, max_bytes in fetch.targets:
            partition = lookup(key)
            if partition is None or not partition.is_leader:
                return self.force_complete()
            available = partition.available_bytes(
                offset, for_follower, min(max_bytes, min_bytes - accumulated), fetch.committed
            )
            if available:
                if available < 0:
                    return self.force_complete()  # truncated leader or retention: answer now
                accumulated += available
                if accumulated >= min_bytes:
                    return self.force_complete()
        return False

    def on_complete(self) -> None:
        if self.response is not None:  # None: abandoned, no read for nobody
            self.response.set(self.read(self.fetch))
        self._release()
        self.get_partition = self.read = self.fetch = self.response = None

    def on_expiration(self) -> None:
        pass


def produce_response(statuses: dict[Key, ProducePartitionStatus]) -> dict:
    """The Produce answer from per-partition statuses (at once, or when the op completes)."""
    topics: dict[str, list] = {}
    for (topic, index), status in statuses.items():
        entry = {
            "partition": index,
            "error_code": int(status.error),
            "base_offset": status.base_offset if status.error is ErrorCode.NONE else -1,
            "error_message": status.message,
        }
        if status.record_errors:
            entry["record_errors"] = [
                {"batch_index": i, "message": m} for i, m in status.record_errors
            ]
        topics.setdefault(topic, []).append(entry)
    return {"topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}
