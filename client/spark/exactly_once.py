"""The sink's exactly-once identity: which producer id and epoch a write task sends with.

Spark reruns a write task (task retry, speculation) and replays a micro-batch after
the driver dies mid-batch; spark-sql-kafka's sink then writes the records again. Here
each task derives its producer from names that are the same on every rerun (the
streaming query's id, which its checkpoint keeps; the batch id; the task's partition),
and sends deterministic batches (client/idempotence.py FixedIdentity): the partition
leaders recognise every batch they already hold by producer id, epoch and sequence,
and store nothing twice. The argument, and what it needs of the query, is in docs/spark.md
("Exactly once").

One producer id per (write, task partition, block of 32,768 versions) and the version
(batch id or txnVersion) as the epoch: a leader keeps a few batches of state per
producer id, so ids do not pile up one per micro-batch, and an older version's rerun
arriving after a newer one is fenced (INVALID_PRODUCER_EPOCH) instead of written.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from minibroker.client.idempotence import MAX_EPOCH, FixedIdentity
from minibroker.protocol.batch import DERIVED_PRODUCER_ID_BASE

EPOCHS_PER_ID = MAX_EPOCH + 1


def derived_producer_id(name: str) -> int:
    """62 hash bits above DERIVED_PRODUCER_ID_BASE: never an InitProducerId id, and a
    collision between two writes' tasks needs ~2**31 of them alive at once."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return DERIVED_PRODUCER_ID_BASE + (int.from_bytes(digest, "big") >> 2)


@dataclass(frozen=True)
class WriteIdentity:
    """Names one write so that each of its tasks derives the same producer on a rerun."""

    name: str  # "query:<id>", "app:<txnAppId>" or "write:<random>"
    version: int  # the micro-batch id, the txnVersion, or 0

    def for_task(self, partition_id: int) -> FixedIdentity:
        block, epoch = divmod(self.version, EPOCHS_PER_ID)
        return FixedIdentity(derived_producer_id(f"{self.name}/{partition_id}/{block}"), epoch)

    @classmethod
    def streaming(cls, query_id: str, batch_id: int) -> WriteIdentity:
        return cls(f"query:{query_id}", batch_id)

    @classmethod
    def application(cls, app_id: str, version: int) -> WriteIdentity:
        """foreachBatch: the caller names the write (Delta Lake's txnAppId/txnVersion)."""
        return cls(f"app:{app_id}", version)

    @classmethod
    def one_off(cls) -> WriteIdentity:
        """A plain batch save: its task retries are recognised, a second save is new data."""
        return cls(f"write:{uuid.uuid4().hex}", 0)
