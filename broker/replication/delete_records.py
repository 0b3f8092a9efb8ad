"""DeleteRecords on a leader (Kafka's ReplicaManager.deleteRecords and DelayedDeleteRecords):
move each partition's log start offset, then answer once every in-sync replica has moved
its own (the low watermark), or at the request's timeout.

``offset`` -1 means the high watermark; an offset past the HW, or below -1, is
OFFSET_OUT_OF_RANGE (records not yet committed cannot be deleted). Followers take the
leader's start from their next fetch answer (replica_fetcher.py) and name their own in the
fetch after it (``log_start_offset``), which is what the waiting answer watches (parked in
the produce purgatory on the partition's key, as Kafka's in its DeleteRecords purgatory).
A fetch below the start is OFFSET_OUT_OF_RANGE on every replica.
"""

from __future__ import annotations

from collections.abc import Callable

from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.replication.delayed import _Parked
from minibroker.broker.replication.partition import Partition
from minibroker.protocol.errors import ErrorCode

HIGH_WATERMARK = -1

Key = tuple[str, int]
Lookup = Callable[[Key], Partition | None]


def delete_records(lookup: Lookup, body: dict) -> tuple[dict, dict[Key, dict]]:
    """The native DeleteRecords answer, and the entries (by partition) whose low watermark
    must still reach their new start before it goes out."""
    topics = []
    waiting: dict[Key, dict] = {}
    for t in body["topics"]:
        parts = []
        for p in t["partitions"]:
            out = {"partition": p["partition"], "error_code": 0, "low_watermark": -1}
            key = (t["name"], p["partition"])
            partition = lookup(key)
            if partition is None:
                out["error_code"] = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            elif not partition.is_leader:
                out["error_code"] = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
            elif _delete(partition, p["offset"], out):
                waiting[key] = out
            parts.append(out)
        topics.append({"name": t["name"], "partitions": parts})
    return {"topics": topics}, waiting


def _delete(partition: Partition, offset: int, out: dict) -> bool:
    """Move the start; True if the answer waits for the replicas (``out`` then holds the
    target in ``low_watermark`` until they reach it)."""
    hw = partition.high_watermark
    if offset == HIGH_WATERMARK:
        offset = hw
    if offset < 0 or offset > hw:
        out["error_code"] = int(ErrorCode.OFFSET_OUT_OF_RANGE)
        out["error_message"] = (
            f"{partition.topic}-{partition.index}: cannot delete records before {offset}: "
            f"the high watermark is {hw} (-1 means the high watermark)"
        )
        return False
    try:
        partition.log.delete_records_before(offset)
    except OSError as exc:  # the checkpoint could not be written: the log dir is failing
        out["error_code"] = int(ErrorCode.KAFKA_STORAGE_ERROR)
        out["error_message"] = f"{partition.topic}-{partition.index}: {exc}"
        return False
    out["low_watermark"] = max(offset, partition.log.log_start_offset)
    return True


class DelayedDeleteRecords(_Parked):
    """Completes when every waiting partition's low watermark reaches its new start; at
    the timeout the ones that did not answer REQUEST_TIMED_OUT (the deletion stands)."""

    __slots__ = ("answer", "get_partition", "waiting")

    def __init__(
        self, delay_ms: int, answer: dict, waiting: dict[Key, dict], get_partition: Lookup
    ) -> None:
        super().__init__(delay_ms)
        self.answer = answer
        self.waiting = waiting
        self.get_partition = get_partition
        self.response = PendingResponse()
        self.parked_in: set | None = None

    def try_complete(self) -> bool:
        for key, out in list(self.waiting.items()):
            partition = self.get_partition(key)
            if partition is None or not partition.is_leader:
                out["error_code"] = int(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    if partition is None
                    else ErrorCode.NOT_LEADER_OR_FOLLOWER
                )
                del self.waiting[key]
            elif partition.low_watermark() >= out["low_watermark"]:
                out["low_watermark"] = partition.low_watermark()
                del self.waiting[key]
        if self.waiting:
            return False
        return self.force_complete()

    def on_expiration(self) -> None:
        for key, out in self.waiting.items():
            out["error_code"] = int(ErrorCode.REQUEST_TIMED_OUT)
            out["error_message"] = (
                f"{key[0]}-{key[1]}: the replicas did not all move their log start to "
                f"{out['low_watermark']} in time (the leader has: it stands)"
            )

    def on_complete(self) -> None:
        if self.response is not None:
            self.response.set(self.answer)
        self._release()
        self.get_partition = self.answer = self.waiting = self.response = None
