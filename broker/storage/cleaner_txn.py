"""Transactions through one log cleaner pass (Kafka's ``CleanedTransactionMetadata``):
which batches belong to aborted transactions, when a marker may go, and the cleaned
segment's aborted-transactions index.

The pass walks the log in offset order and this state goes with it from group to group:
the aborted transactions (from the ``.txnindex`` entries) are taken in as the walk
reaches their first offset; a transactional batch of a producer with an aborted
transaction under way is that transaction's (dropped); another is a committed one's.

A marker is removable once nothing of its transaction is left, as Kafka decides it: an
abort marker when the walk met no batch of its transaction (they were dropped by an
earlier pass), a commit marker when it met none (compaction removed them all). Until
then it stays, and an abort marker's index entry goes into the cleaned segment's
``.txnindex`` (read_committed readers still need it). A removable marker goes in two
steps, Kafka's delete horizon (KIP-534): the first pass that finds it removable writes
it again with ``now + delete.retention.ms`` as its horizon, and the first pass after the
horizon drops it. A consumer reading from the start within ``delete.retention.ms``
therefore still sees every marker, as it sees every tombstone.

A marker that is its producer's last word (no data batch after a bumped epoch) stays
whatever the rest says: a replay of the log takes the producer's epoch from it (Kafka's
``lastRecordsOfActiveProducers``).
"""

from __future__ import annotations

from collections.abc import Iterable

from minibroker.broker.storage.txn_index import AbortedTxn
from minibroker.protocol.batch import (
    BatchHeader,
    CorruptBatch,
    encode_control_batch,
    patch_base_offset,
    patch_leader_epoch,
    producer_fields,
    read_control_batch,
    unwrap_kafka_batch,
)
from minibroker.protocol.kafka import records as kafka_records

KEEP, STAMP, DROP = "keep", "stamp", "drop"  # what becomes of a marker


class CleanedTxns:
    """One pass's walk through the log's transactions."""

    __slots__ = ("_aborted", "_next", "committed", "index", "last_word", "ongoing")

    def __init__(self, aborted: Iterable[AbortedTxn], last_word: dict[int, int]) -> None:
        """``aborted``: the log's aborted transactions reaching into the pass's range;
        ``last_word``: producer id -> epoch of producers whose last entry is a marker."""
        self._aborted = sorted(aborted, key=lambda t: t.first_offset)
        self._next = 0
        # Producer id -> [its aborted transaction under way, a batch of it was met].
        self.ongoing: dict[int, list] = {}
        self.committed: set[int] = set()  # producers with a committed transaction's batch met
        self.index: list[AbortedTxn] = []  # the current group's .txnindex entries
        self.last_word = last_word

    def _reach(self, offset: int) -> None:
        aborted = self._aborted
        while self._next < len(aborted) and aborted[self._next].first_offset <= offset:
            txn = aborted[self._next]
            self._next += 1
            self.ongoing.setdefault(txn.producer_id, [txn, False])

    def on_batch(self, producer_id: int, last_offset: int, transactional: bool) -> bool:
        """A data batch (Kafka's onBatchRead): True if an aborted transaction's (dropped)."""
        self._reach(last_offset)
        if not transactional:
            return False
        ongoing = self.ongoing.get(producer_id)
        if ongoing is not None:
            ongoing[1] = True
            return True
        self.committed.add(producer_id)
        return False

    def on_marker(self, producer_id: int, offset: int, commit: bool) -> bool:
        """A marker (Kafka's onControlBatchRead): True if nothing of its transaction is
        left; an abort marker that stays puts its entry into the cleaned index."""
        self._reach(offset)
        if commit:
            met = producer_id in self.committed
            self.committed.discard(producer_id)
            return not met
        ongoing = self.ongoing.pop(producer_id, None)
        if ongoing is not None and ongoing[1]:
            self.index.append(ongoing[0])
            return False
        return True

    def marker(self, buf: bytes, pos: int, header: BatchHeader, now_ms: int) -> str:
        """KEEP, STAMP (removable: write it again with its delete horizon) or DROP."""
        pid, epoch, _ = producer_fields(buf, pos, header)
        try:
            commit, _ = read_control_batch(buf, pos, header)
        except CorruptBatch:
            return KEEP  # not ours to judge: copied as it is
        removable = self.on_marker(pid, header.base_offset, commit)
        if not removable or self.last_word.get(pid) == epoch:
            return KEEP
        horizon = horizon_of(buf, pos, header)
        if horizon is None:
            return STAMP
        return DROP if horizon <= now_ms else KEEP

    def take_index(self) -> list[AbortedTxn]:
        """The group's entries (the walk goes on into the next group)."""
        entries, self.index = self.index, []
        return entries


def horizon_of(buf: bytes, pos: int, header: BatchHeader) -> int | None:
    """A marker's delete horizon (None: not yet removable as far as it says)."""
    inner = unwrap_kafka_batch(buf, pos, header)
    return kafka_records.delete_horizon(kafka_records.unpack_header(inner))


def stamped(buf: bytes, pos: int, header: BatchHeader, horizon_ms: int) -> bytearray:
    """The marker written again with its delete horizon, at its offset and leader epoch."""
    pid, epoch, _ = producer_fields(buf, pos, header)
    commit, coordinator_epoch = read_control_batch(buf, pos, header)
    out = encode_control_batch(
        commit,
        coordinator_epoch,
        producer_id=pid,
        producer_epoch=epoch,
        timestamp=header.max_timestamp,
        delete_horizon_ms=horizon_ms,
    )
    patch_base_offset(out, 0, header.base_offset)
    patch_leader_epoch(out, 0, header.leader_epoch)
    return out
