"""The records of ``__transaction_state``: one key per transactional id, its latest value
the truth (a compacted topic, as Kafka's).

Keys and values are msgpack in the broker's own batch format (our internal topic; Kafka's
binary layout is not needed by anyone outside):

    key    [0, transactional_id]
    value  {producer_id, last_producer_id, producer_epoch, last_producer_epoch,
            timeout_ms, state (Kafka's name: "Ongoing", ...), partitions: [[topic, p]...],
            start_ms, last_update_ms}
    a tombstone (value None): the id expired (transactional.id.expiration.ms)

This is the one place they are decoded: the coordinator's loader.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from minibroker.broker.transaction.metadata import TxnState, TxnTransit
from minibroker.protocol import TRANSACTION_STATE_TOPIC, encode_batch, iter_batches
from minibroker.protocol.batch import decode_records

TXN_TOPIC = TRANSACTION_STATE_TOPIC
TXN_KEY = 0


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def txn_key(transactional_id: str) -> bytes:
    return _pack([TXN_KEY, transactional_id])


def txn_value(transit: TxnTransit) -> bytes:
    return _pack(
        {
            "producer_id": transit.producer_id,
            "last_producer_id": transit.last_producer_id,
            "producer_epoch": transit.producer_epoch,
            "last_producer_epoch": transit.last_producer_epoch,
            "timeout_ms": transit.timeout_ms,
            "state": transit.state.value,
            "partitions": sorted([t, p] for t, p in transit.partitions),
            "start_ms": transit.start_ms,
            "last_update_ms": transit.last_update_ms,
        }
    )


def read_txn_value(value: dict) -> TxnTransit:
    """A stored value; KeyError/ValueError/TypeError if it is not one of ours."""
    return TxnTransit(
        producer_id=int(value["producer_id"]),
        last_producer_id=int(value.get("last_producer_id", -1)),
        producer_epoch=int(value["producer_epoch"]),
        last_producer_epoch=int(value.get("last_producer_epoch", -1)),
        timeout_ms=int(value["timeout_ms"]),
        state=TxnState(value["state"]),
        partitions=frozenset((str(t), int(p)) for t, p in value.get("partitions") or ()),
        start_ms=int(value.get("start_ms", -1)),
        last_update_ms=int(value.get("last_update_ms", -1)),
    )


def txn_batch(
    transactional_id: str, transits: Sequence[TxnTransit | None], timestamp_ms: int
) -> bytes:
    """The id's new values in order (the last one wins on replay), or its tombstone."""
    key = txn_key(transactional_id)
    return encode_batch(
        [(timestamp_ms, key, None if t is None else txn_value(t), ()) for t in transits]
    )


class TxnLogContents:
    """A ``__transaction_state`` partition replayed: the latest value per transactional id
    (None: expired)."""

    def __init__(self) -> None:
        self.transactions: dict[str, TxnTransit | None] = {}
        self.skipped = 0  # records that are not ours (or not readable): ignored

    def replay(self, data: bytes) -> int:
        next_offset = -1
        for pos, header in iter_batches(data, verify=True, allow_partial=True):
            next_offset = header.next_offset
            for record in decode_records(data, pos, header):
                self._apply(record.key, record.value)
        return next_offset

    def _apply(self, raw_key: bytes | None, raw_value: bytes | None) -> None:
        try:
            key = msgpack.unpackb(raw_key, raw=False) if raw_key is not None else None
            if not isinstance(key, list) or len(key) != 2 or key[0] != TXN_KEY:
                raise ValueError("not a transaction key")
            if raw_value is None:
                self.transactions[key[1]] = None
                return
            self.transactions[key[1]] = read_txn_value(msgpack.unpackb(raw_value, raw=False))
        except Exception:  # not ours: a client produced to the internal topic
            self.skipped += 1
