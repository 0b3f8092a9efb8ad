"""Offsets committed in a transaction meet the log cleaner and a reload of
``__consumer_offsets``: an aborted transaction's offsets never hide the group's committed
ones (the batch is transactional, so the cleaner knows it aborted), and OffsetFetch with
``require_stable`` answers UNSTABLE_OFFSET_COMMIT while offsets are pending (KIP-447).

Real logs, real markers (WriteTxnMarkers into the replica manager), the manual clock."""

from __future__ import annotations

import dataclasses

import trio

import minibroker.protocol as p
from minibroker.broker.coordinator import OFFSETS_TOPIC
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.storage import cleaner
from minibroker.protocol.batch import TRANSACTIONAL_FLAG
from minibroker.protocol.errors import ErrorCode as E
from tests.unit.test_txn_coordinator import Harness, settle, txn_commit


class LeaderSender:
    """WriteTxnMarkers sent to this broker's own replica manager, as a leader answers."""

    def __init__(self, h: Harness) -> None:
        self.h = h

    async def __call__(self, broker_id: int, body: dict) -> dict:
        answer = self.h.rm.write_txn_markers(body)
        if isinstance(answer, PendingResponse):
            done = trio.Event()
            answer.add_done_callback(lambda _: done.set())
            await done.wait()
            answer = answer.body
        return answer


def harness(tmp_path, nursery) -> Harness:
    """The coordinators' harness, its markers written by the replica manager for real."""
    h = Harness(tmp_path, nursery)
    h.service.markers.sender = LeaderSender(h)
    h.rm.txn_marker_listeners.append(h.groups.complete_txn)
    return h


def offsets_txn(h: Harness, pid: int, epoch: int, offset: int, commit: bool) -> None:
    answer = h.call(
        p.ApiKey.ADD_OFFSETS_TO_TXN,
        {"transactional_id": "tx", "producer_id": pid, "producer_epoch": epoch, "group_id": "g"},
    )
    assert answer["error_code"] == 0
    assert txn_commit(h, pid, epoch, {("t", 0): offset}) == {0}
    assert h.end(pid, epoch, commit=commit) is E.NONE


async def test_aborted_offsets_never_hide_committed_ones_after_compaction_and_reload(
    tmp_path, nursery
):
    h = harness(tmp_path, nursery)
    await h.load()
    _, pid, epoch = h.init()
    offsets_txn(h, pid, epoch, 5, commit=True)
    await settle()
    offsets_txn(h, pid, epoch, 9, commit=False)
    await settle()
    assert h.fetch_offsets() == {("t", 0): 5}
    replica = h.rm.partitions[(OFFSETS_TOPIC, 0)]
    log = replica.log
    # The offsets batch is a transaction's, in our header as in Kafka's.
    written = replica.read(0, 1 << 20, for_follower=True)
    flags = [header.attributes & TRANSACTIONAL_FLAG for _, header in p.iter_batches(written)]
    assert flags[0] == TRANSACTIONAL_FLAG
    # The aborted transaction is in the aborted-transactions index, and compaction runs.
    assert [e.producer_id for e in log.txn_index.entries] == [pid]
    log.config = dataclasses.replace(log.config, cleanup_policy="compact")
    log.roll()
    plan = cleaner.plan(log, replica.high_watermark, h.clock.now_ms())
    assert plan is not None
    assert cleaner.clean_now(plan) is not None
    # Another broker (here: this one again, from its files) loads the partition.
    h.service._unload(0)
    h.rm.close()
    fresh = Harness(tmp_path, nursery)
    fresh.clock.advance(h.clock.now_ms())
    await fresh.load()
    await settle()
    assert fresh.fetch_offsets() == {("t", 0): 5}
    assert fresh.groups.manager.groups["g"].pending_txn_offsets == {}
    fresh.rm.close()


def offset_fetch(h: Harness, require_stable: bool, topics=None) -> dict:
    answer = h.call(
        p.ApiKey.OFFSET_FETCH,
        {"group_id": "g", "topics": topics, "require_stable": require_stable},
    )
    return {
        (t["name"], q["partition"]): (q["committed_offset"], E(q["error_code"]))
        for t in answer["topics"]
        for q in t["partitions"]
    }


async def test_require_stable_answers_unstable_offset_commit_while_offsets_are_pending(
    tmp_path, nursery
):
    h = harness(tmp_path, nursery)
    await h.load()
    _, pid, epoch = h.init()
    offsets_txn(h, pid, epoch, 5, commit=True)
    await settle()
    asked = [{"name": "t", "partition_indexes": [0, 1]}]
    assert offset_fetch(h, True, asked) == {("t", 0): (5, E.NONE), ("t", 1): (-1, E.NONE)}
    # An open transaction holds offsets for t-0: unstable, t-1 is not concerned.
    h.call(
        p.ApiKey.ADD_OFFSETS_TO_TXN,
        {"transactional_id": "tx", "producer_id": pid, "producer_epoch": epoch, "group_id": "g"},
    )
    assert txn_commit(h, pid, epoch, {("t", 0): 8}) == {0}
    assert offset_fetch(h, True, asked) == {
        ("t", 0): (-1, E.UNSTABLE_OFFSET_COMMIT),
        ("t", 1): (-1, E.NONE),
    }
    assert offset_fetch(h, True) == {("t", 0): (-1, E.UNSTABLE_OFFSET_COMMIT)}
    # Without require_stable the committed offset is answered, as before KIP-447.
    assert offset_fetch(h, False, asked)[("t", 0)] == (5, E.NONE)
    assert h.end(pid, epoch, commit=True) is E.NONE
    await settle()
    assert offset_fetch(h, True, asked)[("t", 0)] == (8, E.NONE)
    h.rm.close()
