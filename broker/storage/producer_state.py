"""Idempotent producers' state in one partition: Kafka's ProducerStateManager (KIP-98).

Per producer id: its epoch and the sequence ranges and offsets of its last five batches
(Kafka's NumBatchesToRetain; a client keeps at most five in flight per partition, so a
retry always finds its original here). The leader checks each idempotent batch before
it is appended: an exact duplicate is answered with its original offsets and not
written again, a gap is OUT_OF_ORDER_SEQUENCE_NUMBER, an older epoch is
INVALID_PRODUCER_EPOCH. Followers record what they copy, so a new leader already knows
every producer (that is what keeps a retry after failover from being stored twice).

A batch of the current epoch that lies wholly between the first sequence this epoch
stored and the last one is a duplicate older than the window: a writer replaying a
deterministic stream (the Spark sink's exactly-once identity) sends those. It is not
written again and is acknowledged once the high watermark covers the window's oldest
batch, so the answer never acknowledges an original that is not yet committed. Kafka
0.11 answered such a batch DUPLICATE_SEQUENCE_NUMBER, and OUT_OF_ORDER since the window
came (1.0, KAFKA-5494); a producer that keeps at most five batches in flight never
sends one.

The state is derived from the log: rebuilt at open from the newest snapshot file at or
below the log end plus the batches after it, and again after a truncation. Snapshots
(``<offset>.snapshot``, msgpack behind a CRC) are taken when a segment rolls and when the
log closes, so a clean restart replays nothing and a crash replays the active segment.
An unreadable snapshot is skipped with a warning: the log itself is the truth.

Transactions (KIP-98): a producer's first transactional batch opens its transaction
(``txn_first_offset``); its marker (a control batch, written by the partition leader on
the coordinator's WriteTxnMarkers) closes it and may bump the producer's epoch, which
fences an older one (INVALID_PRODUCER_EPOCH), and records the coordinator epoch, which
fences an older coordinator (TRANSACTION_COORDINATOR_FENCED). The first offset of the
oldest transaction not yet decided *and replicated* is the first unstable offset: the
last stable offset (LSO) is the smaller of it and the high watermark. A transaction whose
marker is appended but not yet under the HW still holds the LSO back (Kafka's
unreplicated transactions), so a read_committed reader never sees a decision a failover
could still take back. Snapshots (version 3) keep every open transaction.
"""

from __future__ import annotations

import struct
import zlib
from collections import deque
from pathlib import Path
from typing import Any

import msgpack

from minibroker.broker.common.atomic_file import write_atomic
from minibroker.protocol.batch import DERIVED_PRODUCER_ID_BASE, increment_sequence
from minibroker.protocol.errors import (
    InvalidProducerEpoch,
    InvalidTxnState,
    OutOfOrderSequenceNumber,
    TransactionCoordinatorFenced,
)

# Kafka's ProducerStateEntry.NumBatchesToRetain.
BATCHES_TO_RETAIN = 5
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOTS_KEPT = 2
_CRC = struct.Struct(">I")
_VERSION = 3  # 3 added the open transaction and coordinator epoch; 2 and 1 are still read


class BatchMetadata:
    """One appended batch of a producer: its sequence range and where it landed."""

    __slots__ = ("first_offset", "first_seq", "last_offset", "last_seq")

    def __init__(self, first_seq: int, last_seq: int, first_offset: int, last_offset: int):
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.first_offset = first_offset
        self.last_offset = last_offset


class CompletedTxn:
    """A transaction its marker ended: ``[first_offset, last_offset]``, the marker last."""

    __slots__ = ("aborted", "first_offset", "last_offset", "producer_id")

    def __init__(self, producer_id: int, first_offset: int, last_offset: int, aborted: bool):
        self.producer_id = producer_id
        self.first_offset = first_offset
        self.last_offset = last_offset
        self.aborted = aborted


class ProducerEntry:
    __slots__ = (
        "batches",
        "coordinator_epoch",
        "epoch",
        "epoch_first_seq",
        "last_timestamp",
        "producer_id",
        "txn_first_offset",
    )

    def __init__(self, producer_id: int, epoch: int, epoch_first_seq: int) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        # The open transaction's first offset (-1: none), and the newest coordinator
        # epoch a marker for this producer carried (-1: none yet).
        self.txn_first_offset = -1
        self.coordinator_epoch = -1
        # The lowest sequence of this epoch known to be in the log: every sequence from it
        # to last_seq is stored (appends are contiguous within an epoch).
        self.epoch_first_seq = epoch_first_seq
        self.batches: deque[BatchMetadata] = deque(maxlen=BATCHES_TO_RETAIN)
        self.last_timestamp = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    def below_window(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """A batch of this epoch stored before the window: what the HW must pass before it
        is acknowledged (first_offset -1: its own offsets are no longer known)."""
        low, high = self.epoch_first_seq, self.last_seq
        # Only while the epoch has not wrapped, where "between" is plain comparison.
        if self.batches and low <= first_seq <= last_seq <= high:
            oldest = self.batches[0]
            return BatchMetadata(first_seq, last_seq, -1, oldest.first_offset - 1)
        return None


class ProducerStateManager:
    def __init__(self, directory: Path, logger: Any) -> None:
        self.dir = directory
        self.log = logger
        self.producers: dict[int, ProducerEntry] = {}
        # Open transactions: producer id -> first offset. And decided ones whose marker is
        # not yet under the HW: (marker offset, first offset), in marker order.
        self.ongoing: dict[int, int] = {}
        self.unreplicated: deque[tuple[int, int]] = deque()
        # min(ongoing first offsets), or None: the hot path (every read_committed fetch)
        # reads it; it changes only when a transaction starts or ends.
        self.first_ongoing: int | None = None

    def __len__(self) -> int:
        return len(self.producers)

    # --- transactions ---------------------------------------------------------------------

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of a transaction not yet decided, or decided by a marker that
        is not yet under ``high_watermark``; None if there is none (Kafka's
        firstUnstableOffset)."""
        unreplicated = self.unreplicated
        self.forget_replicated(high_watermark)
        first = self.first_ongoing
        if unreplicated:
            oldest = min(f for _, f in unreplicated)
            if first is None or oldest < first:
                first = oldest
        return first

    def forget_replicated(self, high_watermark: int) -> None:
        """Decided transactions whose marker is under the HW no longer hold the LSO (the
        partition calls this as its HW moves, so a follower's list stays short too)."""
        unreplicated = self.unreplicated
        while unreplicated and unreplicated[0][0] < high_watermark:
            unreplicated.popleft()

    def last_stable_offset(self, high_watermark: int) -> int:
        """LSO = min(first unstable offset, HW): what a read_committed reader may see."""
        first = self.first_unstable_offset(high_watermark)
        return high_watermark if first is None or first > high_watermark else first

    def _open_txn(self, entry: ProducerEntry, first_offset: int) -> None:
        entry.txn_first_offset = first_offset
        self.ongoing[entry.producer_id] = first_offset
        if self.first_ongoing is None or first_offset < self.first_ongoing:
            self.first_ongoing = first_offset

    def _close_txn(self, producer_id: int) -> None:
        first = self.ongoing.pop(producer_id, None)
        if first is not None and first == self.first_ongoing:
            self.first_ongoing = min(self.ongoing.values(), default=None)

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> None:
        """Before a leader appends a marker: InvalidProducerEpoch for an epoch older than
        the producer's, TransactionCoordinatorFenced for a coordinator epoch older than
        one seen (Kafka's appendEndTxnMarker checks)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if epoch < entry.epoch:
            raise InvalidProducerEpoch(
                f"marker for producer {producer_id}: epoch {epoch} is older than {entry.epoch}"
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFenced(
                f"marker for producer {producer_id}: coordinator epoch {coordinator_epoch} "
                f"is older than {entry.coordinator_epoch}"
            )

    def complete_txn(
        self,
        producer_id: int,
        epoch: int,
        coordinator_epoch: int,
        marker_offset: int,
        commit: bool,
        timestamp: int,
    ) -> CompletedTxn | None:
        """A marker is in the log (appended, copied or replayed): the producer's open
        transaction, if any, ends; the marker's epoch becomes the producer's (a bumped
        epoch fences the producer's earlier incarnation)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(producer_id, epoch, 0)
        elif epoch > entry.epoch:
            # A new epoch starts its sequences afresh (Kafka's maybeUpdateProducerEpoch).
            entry.epoch = epoch
            entry.epoch_first_seq = 0
            entry.batches.clear()
        if coordinator_epoch > entry.coordinator_epoch:
            entry.coordinator_epoch = coordinator_epoch
        if timestamp > entry.last_timestamp:
            entry.last_timestamp = timestamp
        first = entry.txn_first_offset
        if first < 0:
            return None  # a marker for a transaction with no records here (a retry)
        entry.txn_first_offset = -1
        self._close_txn(producer_id)
        self.unreplicated.append((marker_offset, first))
        return CompletedTxn(producer_id, first, marker_offset, not commit)

    def aborted_lso(self, completed: CompletedTxn) -> int:
        """The LSO an aborted transaction's index entry records (Kafka's
        lastStableOffset(completedTxn)): the next open transaction's first offset, else
        the offset after the marker."""
        return self.first_ongoing if self.first_ongoing is not None else completed.last_offset + 1

    # --- the leader's check and every replica's update -------------------------------------

    def check(
        self,
        producer_id: int,
        epoch: int,
        first_seq: int,
        record_count: int,
        transactional: bool = False,
    ) -> BatchMetadata | None:
        """Before a leader appends: the original of a duplicate (answer with it, write
        nothing; first_offset -1 for one older than the window), None to append, or
        OutOfOrderSequenceNumber / InvalidProducerEpoch.

        A producer we know nothing of (new, expired, or older than the log) may start at
        any sequence, as Kafka accepts since KIP-360; a new epoch must start at 0.
        """
        entry = self.producers.get(producer_id)
        if entry is None:
            if first_seq != 0 and producer_id >= DERIVED_PRODUCER_ID_BASE:
                raise OutOfOrderSequenceNumber(
                    f"producer {producer_id} (a derived id) is not known here: its first "
                    f"batch must have sequence 0, got {first_seq}"
                )
            return None
        last_seq = increment_sequence(first_seq, record_count - 1)
        duplicate = entry.find_duplicate(epoch, first_seq, last_seq)
        if duplicate is not None:
            return duplicate
        if epoch < entry.epoch:
            raise InvalidProducerEpoch(
                f"producer {producer_id}: epoch {epoch} is older than the current {entry.epoch}"
            )
        if entry.txn_first_offset >= 0 and not transactional:
            raise InvalidTxnState(
                f"producer {producer_id} has a transaction open since offset "
                f"{entry.txn_first_offset}: expected a transactional batch"
            )
        if epoch > entry.epoch:
            if first_seq != 0:
                raise OutOfOrderSequenceNumber(
                    f"producer {producer_id}: new epoch {epoch} must start at sequence 0, "
                    f"got {first_seq}"
                )
            return None
        if entry.batches and first_seq != increment_sequence(entry.last_seq, 1):
            older = entry.below_window(first_seq, last_seq)
            if older is not None:
                return older
            raise OutOfOrderSequenceNumber(
                f"producer {producer_id} epoch {epoch}: sequence {first_seq} does not follow "
                f"{entry.last_seq}"
            )
        return None

    def update(
        self,
        producer_id: int,
        epoch: int,
        first_seq: int,
        record_count: int,
        first_offset: int,
        timestamp: int,
        transactional: bool = False,
    ) -> None:
        """An idempotent batch is in the log (appended, copied or replayed); a
        transactional one opens its producer's transaction if none is open."""
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            old = entry
            entry = self.producers[producer_id] = ProducerEntry(producer_id, epoch, first_seq)
            if old is not None:
                entry.txn_first_offset = old.txn_first_offset
                entry.coordinator_epoch = old.coordinator_epoch
        elif epoch < entry.epoch:
            return  # only a replay of an old batch gets here; its epoch is over
        if transactional and entry.txn_first_offset < 0:
            self._open_txn(entry, first_offset)
        entry.batches.append(
            BatchMetadata(
                first_seq,
                increment_sequence(first_seq, record_count - 1),
                first_offset,
                first_offset + record_count - 1,
            )
        )
        if timestamp > entry.last_timestamp:
            entry.last_timestamp = timestamp

    def remove_expired(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers silent for ``producer.id.expiration.ms``; returns how many."""
        # Never one with a transaction open (Kafka's isProducerExpired): its marker will come.
        expired = [
            pid
            for pid, e in self.producers.items()
            if now_ms - e.last_timestamp >= expiration_ms and e.txn_first_offset < 0
        ]
        for pid in expired:
            del self.producers[pid]
        return len(expired)

    def reset(self) -> None:
        """The log was emptied: no producer state, no snapshot."""
        self._clear()
        for offset in self.snapshot_offsets():
            self._path(offset).unlink(missing_ok=True)

    def _clear(self) -> None:
        self.producers.clear()
        self.ongoing.clear()
        self.unreplicated.clear()
        self.first_ongoing = None

    # --- snapshots ------------------------------------------------------------------------

    def snapshot_offsets(self) -> list[int]:
        return sorted(
            int(p.name[: -len(SNAPSHOT_SUFFIX)])
            for p in self.dir.glob("*" + SNAPSHOT_SUFFIX)
            if p.name[: -len(SNAPSHOT_SUFFIX)].isdigit()
        )

    def _path(self, offset: int) -> Path:
        return self.dir / f"{offset:020d}{SNAPSHOT_SUFFIX}"

    def take_snapshot(self, offset: int, *, sync: bool = True) -> Path:
        """Write the state as of ``offset`` (the log end); keep the newest few snapshots.
        ``sync=False``: not fsynced (the caller does, with the file returned); a torn one
        fails its CRC on load and an older one, or a replay, serves instead."""
        body = msgpack.packb(
            [
                _VERSION,
                offset,
                [
                    [
                        e.producer_id,
                        e.epoch,
                        e.epoch_first_seq,
                        e.last_timestamp,
                        [
                            [b.first_seq, b.last_seq, b.first_offset, b.last_offset]
                            for b in e.batches
                        ],
                        e.txn_first_offset,
                        e.coordinator_epoch,
                    ]
                    for e in self.producers.values()
                ],
            ]
        )
        path = self._path(offset)
        write_atomic(path, _CRC.pack(zlib.crc32(body)) + body, sync=sync)
        for old in self.snapshot_offsets()[:-SNAPSHOTS_KEPT]:
            self._path(old).unlink(missing_ok=True)
        return path

    def delete_snapshots_above(self, offset: int) -> None:
        """A truncation: snapshots past the new log end describe records that are gone."""
        for snap in self.snapshot_offsets():
            if snap > offset:
                self._path(snap).unlink(missing_ok=True)

    def load_latest(self, log_end_offset: int) -> int | None:
        """Load the newest readable snapshot at or below ``log_end_offset``; its offset, or
        None (then the caller replays the whole log)."""
        self._clear()
        self.delete_snapshots_above(log_end_offset)
        for offset in reversed(self.snapshot_offsets()):
            path = self._path(offset)
            try:
                self._read(path.read_bytes(), offset)
                return offset
            except (OSError, ValueError) as exc:
                self._clear()
                self.log.warning("producer_snapshot_unreadable", file=str(path), reason=str(exc))
        return None

    def _read(self, raw: bytes, offset: int) -> None:
        if len(raw) < _CRC.size or _CRC.unpack_from(raw)[0] != zlib.crc32(raw[_CRC.size :]):
            raise ValueError("CRC mismatch or truncated file")
        try:
            version, at, producers = msgpack.unpackb(raw[_CRC.size :])
            if version not in (1, 2, _VERSION) or at != offset:
                raise ValueError(f"version {version} / offset {at} in a file named {offset}")
            for fields in producers:
                txn_first, coordinator_epoch = -1, -1
                if version == 1:  # no epoch_first_seq: the window's oldest is what is known
                    pid, epoch, last_ts, batches = fields
                    first_known = batches[0][0] if batches else 0
                elif version == 2:
                    pid, epoch, first_known, last_ts, batches = fields
                else:
                    pid, epoch, first_known, last_ts, batches, txn_first, coordinator_epoch = fields
                entry = self.producers[pid] = ProducerEntry(pid, epoch, first_known)
                entry.last_timestamp = last_ts
                entry.coordinator_epoch = coordinator_epoch
                if txn_first >= 0:
                    self._open_txn(entry, txn_first)
                for first_seq, last_seq, first_offset, last_offset in batches:
                    entry.batches.append(
                        BatchMetadata(first_seq, last_seq, first_offset, last_offset)
                    )
        except (TypeError, msgpack.ExtraData, msgpack.UnpackException) as exc:
            raise ValueError(f"malformed snapshot: {exc}") from None
