"""The log's part in transactions (KIP-98): the LSO, the aborted transactions of a range,
and the markers a leader appends (WriteTxnMarkers) or a replica copies or replays.

A mixin of ``Log``, kept apart so the log's append/read/recovery code stays readable: it
uses the log's producer state (storage/producer_state.py), its aborted-transactions index
(storage/txn_index.py) and its one write path.
"""

from __future__ import annotations

from typing import Any

from minibroker.broker.storage.results import AppendInfo
from minibroker.broker.storage.txn_index import AbortedTxn
from minibroker.protocol.batch import (
    CorruptBatch,
    encode_control_batch,
    patch_base_offset,
    patch_leader_epoch,
    producer_fields,
    read_control_batch,
    unpack_header,
)


class TransactionalLog:
    """Transactions on a partition's log; ``Log`` provides ``producers``, ``txn_index``,
    ``_write``, ``active``, ``log_end_offset``, ``now_ms`` and ``log``."""

    producers: Any
    txn_index: Any
    log: Any

    def last_stable_offset(self, high_watermark: int) -> int:
        """What a read_committed reader may see: below every undecided transaction."""
        return self.producers.last_stable_offset(high_watermark)

    def collect_aborted(self, fetch_offset: int, upper_bound: int) -> list[tuple[int, int]]:
        """``(producer_id, first_offset)`` of aborted transactions with records in
        ``[fetch_offset, upper_bound)``: what a read_committed fetch answer names."""
        return self.txn_index.collect(fetch_offset, upper_bound)

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        leader_epoch: int,
    ) -> AppendInfo:
        """The leader ends a producer's transaction here (WriteTxnMarkers): one control
        batch at the LEO. InvalidProducerEpoch / TransactionCoordinatorFenced before
        anything is written if the marker is stale."""
        self.producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
        now = self.now_ms()
        buf = encode_control_batch(
            commit,
            coordinator_epoch,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            timestamp=now,
        )
        offset = self.log_end_offset
        patch_base_offset(buf, 0, offset)
        patch_leader_epoch(buf, 0, leader_epoch)
        self._write(buf, offset, offset + 1, now, 1, [(0, offset, now)])
        self._marker_in_log(buf, 0, unpack_header(buf), self.active.base_offset)
        return AppendInfo(offset, offset, now, 1, len(buf))

    def _marker_in_log(self, buf, pos: int, header: Any, segment_base: int) -> None:
        """A control batch is in the log (appended, copied, replayed): its transaction
        ends; an abort goes into the aborted-transactions index."""
        pid, epoch, _ = producer_fields(buf, pos, header)
        try:
            commit, coordinator_epoch = read_control_batch(buf, pos, header)
        except CorruptBatch as exc:  # a follower keeps the leader's log whatever it holds
            self.log.warning("txn_marker_unreadable", offset=header.base_offset, reason=str(exc))
            return
        done = self.producers.complete_txn(
            pid, epoch, coordinator_epoch, header.base_offset, commit, header.max_timestamp
        )
        if done is not None and done.aborted:
            entry = AbortedTxn(
                pid, done.first_offset, done.last_offset, self.producers.aborted_lso(done)
            )
            self.txn_index.append(segment_base, entry)
