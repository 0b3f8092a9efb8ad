"""The producer's batching rules, with the time passed in: no broker, no sleeping."""

import pytest
import trio

from minibroker.client.accumulator import DeliveryHandle, RecordAccumulator, record_size
from minibroker.protocol import read_records
from minibroker.protocol.errors import NotEnoughReplicas


def rec(value: bytes, ts: int = 1000, key: bytes | None = None, headers=None):
    """``RecordAccumulator.append``'s record parameters (timestamp, key, value, headers)."""
    return (ts, key, value, headers)


def fill(acc, n, *, topic="t", partition=0, value=b"x" * 90, now=0.0):
    out = []
    for _ in range(n):
        out.append(acc.append(topic, partition, *rec(value), record_size(None, value, []), now))
    return out


def test_records_share_a_batch_until_batch_size():
    acc = RecordAccumulator(batch_size=1000, linger_ms=5, delivery_timeout_ms=120000)
    results = fill(acc, 25)  # 100 bytes each: 10 per batch
    batches = {id(b) for b, _, _ in results}
    assert len(batches) == 3
    assert [i for _, i, _ in results[:12]] == [*range(10), 0, 1]
    assert sum(created for _, _, created in results) == 3
    assert acc.buffered_bytes == 2500


def test_a_record_bigger_than_batch_size_gets_its_own_batch():
    acc = RecordAccumulator(batch_size=100, linger_ms=5, delivery_timeout_ms=120000)
    _, index, created = acc.append("t", 0, *rec(b"y" * 500), 510, 0.0)
    assert (index, created) == (0, True)
    ready, _ = acc.ready(0.0)
    assert ready == [("t", 0)]


def test_linger_holds_a_partial_batch_until_due():
    acc = RecordAccumulator(batch_size=10000, linger_ms=5, delivery_timeout_ms=120000)
    fill(acc, 3, now=100.0)
    assert acc.ready(102.0) == ([], 105.0)
    assert acc.ready(105.0)[0] == [("t", 0)]


def test_full_batch_is_ready_at_once():
    acc = RecordAccumulator(batch_size=1000, linger_ms=10_000, delivery_timeout_ms=120000)
    fill(acc, 11, now=0.0)  # first batch full, second started
    assert acc.ready(0.0)[0] == [("t", 0)]


def test_flush_makes_everything_ready():
    acc = RecordAccumulator(batch_size=10000, linger_ms=10_000, delivery_timeout_ms=120000)
    fill(acc, 1, partition=0)
    fill(acc, 1, partition=1)
    assert acc.ready(0.0)[0] == []  # lingering
    acc.begin_flush()
    assert sorted(acc.ready(0.0)[0]) == [("t", 0), ("t", 1)]
    acc.end_flush()
    assert acc.ready(0.0)[0] == []


def test_closed_batches_go_out_unfilled_and_new_records_start_the_next():
    """With linger infinite, boundaries depend only on what was appended and where the
    writer closed: the same appends and closes cut the same batches, whatever the clock."""
    acc = RecordAccumulator(batch_size=1000, linger_ms=float("inf"), delivery_timeout_ms=120000)
    first = fill(acc, 3, now=0.0)
    assert acc.ready(10**9)[0] == []  # never due by time
    acc.close_batches()
    assert acc.ready(0.0)[0] == [("t", 0)]
    second = fill(acc, 2, now=0.0)
    assert second[0][2] and second[0][0] is not first[0][0]
    assert [len(b.records) for b in acc.batches[("t", 0)]] == [3, 2]
    acc.close_batches()
    assert [b.closed for b in acc.batches[("t", 0)]] == [True, True]


def test_pop_encodes_one_batch_readable_by_the_consumer_side():
    acc = RecordAccumulator(batch_size=10000, linger_ms=0, delivery_timeout_ms=120000)
    acc.append("t", 0, 1000, b"k", b"v1", [("h", b"1")], 20, 0.0)
    acc.append("t", 0, 1005, None, b"v2", None, 20, 0.0)
    batch = acc.pop(("t", 0))
    assert batch.count == 2 and batch.sealed
    records = read_records(batch.payload)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records] == [
        (0, 1000, b"k", b"v1", [("h", b"1")]),
        (1, 1005, None, b"v2", []),
    ]


def test_new_records_never_join_a_sealed_batch():
    acc = RecordAccumulator(batch_size=10000, linger_ms=0, delivery_timeout_ms=120000)
    fill(acc, 2)
    sealed = acc.pop(("t", 0))
    acc.reenqueue(sealed, retry_at_ms=50.0)
    batch, index, created = fill(acc, 1)[0]
    assert batch is not sealed and created and index == 0


def test_retry_waits_for_its_backoff_and_keeps_its_place():
    acc = RecordAccumulator(batch_size=10000, linger_ms=0, delivery_timeout_ms=120000)
    fill(acc, 2)
    first = acc.pop(("t", 0))
    fill(acc, 1, now=1.0)
    acc.reenqueue(first, retry_at_ms=100.0)
    ready, next_ms = acc.ready(50.0)
    assert ready == [] and next_ms == 100.0
    assert acc.ready(100.0)[0] == [("t", 0)]
    assert acc.pop(("t", 0)) is first


def test_expired_batches_are_removed():
    acc = RecordAccumulator(batch_size=1000, linger_ms=0, delivery_timeout_ms=1000)
    fill(acc, 15, now=0.0)
    fill(acc, 1, partition=1, now=500.0)
    expired = acc.expired(1000.0)
    assert len(expired) == 2
    assert acc.pending_batches == 1


async def test_handles_resolve_to_offsets_or_errors():
    acc = RecordAccumulator(batch_size=10000, linger_ms=0, delivery_timeout_ms=120000)
    handles = [DeliveryHandle(b, i) for b, i, _ in fill(acc, 3)]
    batch = acc.pop(("t", 0))
    assert not handles[0].done()
    batch.complete(41)
    assert [(await h).offset for h in handles] == [41, 42, 43]
    assert handles[2].result().partition == 0

    other = [DeliveryHandle(b, i) for b, i, _ in fill(acc, 2, partition=1)]
    acc.pop(("t", 1)).fail(NotEnoughReplicas("isr too small"))
    assert isinstance(other[0].exception(), NotEnoughReplicas)
    with pytest.raises(NotEnoughReplicas):
        await other[1]


async def test_awaiting_an_acked_handle_is_no_trip_through_the_scheduler():
    """``[await h for h in handles]``: all but the first handle of a batch find it acked,
    and awaiting those costs no checkpoint: a task waiting to run does not get to."""
    acc = RecordAccumulator(batch_size=100_000, linger_ms=0, delivery_timeout_ms=120000)
    handles = [DeliveryHandle(b, i) for b, i, _ in fill(acc, 500)]
    acc.pop(("t", 0)).complete(0)
    ran = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _append_now(ran))
        offsets = [(await h).offset for h in handles]
        assert ran == []  # still waiting: no await above let it run
    assert offsets == list(range(500)) and ran == [True]


async def _append_now(out: list) -> None:
    out.append(True)


def test_acks_zero_gives_offset_minus_one():
    acc = RecordAccumulator(batch_size=10000, linger_ms=0, delivery_timeout_ms=120000)
    handle = DeliveryHandle(*fill(acc, 1)[0][:2])
    acc.pop(("t", 0)).complete(-1)
    assert handle.result().offset == -1


def test_record_size_counts_key_value_and_headers():
    assert record_size(None, None, []) < record_size(b"k", b"v" * 10, [("h", b"x")])
    assert record_size(b"kk", b"vvv", []) == record_size(None, None, []) + 5


def test_retried_idempotent_batches_go_back_in_sequence_order():
    acc = RecordAccumulator(batch_size=10, linger_ms=0, delivery_timeout_ms=1000)
    sealed = []
    for seq in (0, 1, 2):
        acc.append("t", 0, 1, None, b"x" * 20, None, 20, now_ms=0)
        popped = acc.pop(("t", 0))
        popped.base_sequence = seq
        sealed.append(popped)
    fresh, _, _ = acc.append("t", 0, 1, None, b"y", None, 1, now_ms=0)
    # Answers arrive out of order: 2 fails first, then 0, then 1.
    for i in (2, 0, 1):
        acc.reenqueue(sealed[i], 5)
    assert [b.base_sequence for b in acc.batches[("t", 0)]] == [0, 1, 2, -1]
    assert acc.batches[("t", 0)][-1] is fresh


def test_idempotence_state_sequences_and_epoch_bump():
    from minibroker.client.idempotence import MAX_EPOCH, IdempotenceState

    state = IdempotenceState()
    state.set_producer_id(5, 0)
    assert [state.take_sequence(("t", 0), 3) for _ in range(2)] == [0, 3]
    assert state.take_sequence(("t", 1), 1) == 0
    state.request_bump()
    assert state.bump_epoch() and state.epoch == 1 and not state.bump_needed
    assert state.take_sequence(("t", 0), 1) == 0
    state.epoch = MAX_EPOCH
    assert not state.bump_epoch() and not state.has_producer_id  # a new id is needed


def test_a_sealed_batch_is_the_bytes_encode_batch_makes_of_its_records():
    """The accumulator keeps wire rows (timestamp deltas from the batch's first record);
    sealed, they are byte for byte what encode_batch writes for the same records, also
    when a later record carries an earlier timestamp (the batch's max stays the max)."""
    from minibroker.protocol import encode_batch

    records = [
        (1000, b"k", b"v1", [("h", b"1"), ("g", None)]),
        (1007, None, b"v2", None),
        (990, b"k3", b"", None),
    ]
    acc = RecordAccumulator(batch_size=10000, linger_ms=0, delivery_timeout_ms=120000)
    for ts, key, value, headers in records:
        acc.append("t", 0, ts, key, value, headers, 20, 0.0)
    batch = acc.pop(("t", 0))
    expected = encode_batch([(ts, k, v, h or []) for ts, k, v, h in records])
    assert batch.payload == expected
    assert (batch.first_ts, batch.max_ts) == (1000, 1007)
