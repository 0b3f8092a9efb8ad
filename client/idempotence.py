"""The idempotent producer's bookkeeping: producer id, epoch and per-partition sequences.

Kafka's TransactionManager, for idempotence only (KIP-98, KIP-360). Pure: the sender
asks it for sequences and tells it what the broker answered; it never does I/O, so the
rules are unit tested without a broker.

- A batch gets its sequence the first time it is sent and keeps it (and its bytes)
  across retries, so the partition leader recognises a retry of a batch it already
  stored and answers with the original offsets instead of storing it twice.
- A batch that is given up on (delivery.timeout.ms, a non-retriable error) after it was
  sequenced leaves a hole the broker would refuse every later batch for: the epoch is
  bumped (locally, as KIP-360 does for idempotent producers) once nothing is in flight,
  sequences restart at 0 and the batches still waiting are re-stamped in their order.
- OUT_OF_ORDER_SEQUENCE_NUMBER for the oldest batch still pending on its partition means
  the leader has no state that leads to it (a retry of an earlier batch did not happen):
  the same bump. For a later batch it only means an earlier one is being retried: the
  batch waits its turn behind it.
- A *fixed* identity (``FixedIdentity``: an id and epoch the writer derived itself, as
  the Spark sink does per query, batch and task) is never bumped: the point of it is
  that a rerun of the same writer sends the same sequences. A hole fails the writer
  instead, and its rerun fills the hole from sequence 0 (the leader answers the stored
  part as duplicates).
"""

from __future__ import annotations

from typing import NamedTuple

from minibroker.protocol.batch import increment_sequence

MAX_EPOCH = 32767  # int16: past it the producer needs a new id
TopicPartition = tuple[str, int]


class FixedIdentity(NamedTuple):
    """A producer id and epoch chosen by the writer, not by InitProducerId."""

    producer_id: int
    epoch: int


class IdempotenceState:
    __slots__ = ("bump_needed", "epoch", "fixed", "next_sequence", "producer_id")

    def __init__(self, identity: FixedIdentity | None = None) -> None:
        self.producer_id = -1
        self.epoch = 0
        self.next_sequence: dict[TopicPartition, int] = {}
        self.bump_needed = False
        self.fixed = identity is not None
        if identity is not None:
            self.set_producer_id(*identity)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    def set_producer_id(self, producer_id: int, epoch: int) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.next_sequence.clear()
        self.bump_needed = False

    def take_sequence(self, tp: TopicPartition, record_count: int) -> int:
        """The base sequence of a batch about to be sent for the first time."""
        sequence = self.next_sequence.get(tp, 0)
        self.next_sequence[tp] = increment_sequence(sequence, record_count)
        return sequence

    def request_bump(self) -> None:
        self.bump_needed = True

    def bump_epoch(self) -> bool:
        """Move to the next epoch with every sequence back at 0; False when the epoch is
        exhausted and a new producer id must be asked for instead."""
        self.next_sequence.clear()
        self.bump_needed = False
        if self.epoch >= MAX_EPOCH:
            self.producer_id = -1
            return False
        self.epoch += 1
        return True
