"""The transaction coordinator on a manual clock with a fake marker sender: Kafka's state
machine, InitProducerId's epoch bumps and fencing, CONCURRENT_TRANSACTIONS while a
commit completes, transaction.timeout.ms as a timer task, marker retries, a new leader
loading state and completing a prepared commit, TxnOffsetCommit held until its marker,
transactional.id.expiration.ms (Kafka's TransactionCoordinatorTest, cut down).

``__transaction_state``, ``__consumer_offsets`` and topic ``t`` are real logs led by this
broker with itself as the only in-sync replica, so acks=all writes complete at once. The
fake sender stands for the partition leaders' WriteTxnMarkers (the partition side is
another module): it answers as scripted and, for an offsets partition, tells the group
coordinator the marker landed, as the replica manager's listeners do.
"""

from __future__ import annotations

import itertools
import struct

import pytest
import structlog
import trio
import trio.testing

import minibroker.protocol as p
from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.coordinator import OFFSETS_TOPIC, CoordinatorService
from minibroker.broker.coordinator.records import (
    Offset,
    PartitionContents,
    batch,
    offset_key,
    offset_value,
)
from minibroker.broker.metadata.image import (
    BrokerInfo,
    ClusterMetadata,
    PartitionState,
    TopicState,
)
from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.purgatory import ManualClock, ManualTimer, Purgatory
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.broker.transaction import TXN_TOPIC, TransactionService, TxnState
from minibroker.broker.transaction.metadata import (
    MAX_EPOCH,
    IllegalTxnTransition,
    TransactionMetadata,
)
from minibroker.protocol.api import NEWEST_VERSIONS
from minibroker.protocol.batch import patch_base_offset, producer_fields, wrap_kafka_batch
from minibroker.protocol.errors import ErrorCode, NetworkException
from minibroker.protocol.kafka import records as kafka_records

E = ErrorCode
S = TxnState
TIMEOUT = 60_000


class FakeSender:
    """WriteTxnMarkers as the leaders would answer: ``script`` pops a code (or an exception)
    per call, NONE when empty; ``gate`` (an Event) holds every call until set."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, dict]] = []
        self.script: list = []
        self.gate: trio.Event | None = None
        self.on_marker = None  # (topic, partition, producer_id, commit) -> None

    async def __call__(self, broker_id: int, body: dict) -> dict:
        self.calls.append((broker_id, body))
        if self.gate is not None:
            await self.gate.wait()
        outcome = self.script.pop(0) if self.script else E.NONE
        if isinstance(outcome, Exception):
            raise outcome
        marker = body["markers"][0]
        topics = []
        for t in marker["topics"]:
            parts = []
            for index in t["partition_indexes"]:
                if outcome is E.NONE and self.on_marker is not None:
                    self.on_marker(
                        t["name"], index, marker["producer_id"], marker["transaction_result"]
                    )
                parts.append({"partition_index": index, "error_code": int(outcome)})
            topics.append({"name": t["name"], "partitions": parts})
        return {"markers": [{"producer_id": marker["producer_id"], "topics": topics}]}


class Harness:
    def __init__(self, tmp_path, nursery, **config) -> None:
        self.clock = ManualClock()
        self.timer = ManualTimer(self.clock)
        self.config = BrokerConfig(
            {
                "transaction.state.log.num.partitions": 1,
                "offsets.topic.num.partitions": 1,
                "transaction.marker.retry.backoff.ms": 1,
                **config,
            }
        )
        self.rm = ReplicaManager(
            0,
            tmp_path,
            self.config,
            structlog.get_logger(),
            Purgatory("Fetch", self.timer),
            Purgatory("Produce", self.timer),
            self.clock.now_ms,
        )
        led = PartitionState(0, 1, [0], [0], 1)
        topics = {TXN_TOPIC: 1, OFFSETS_TOPIC: 1, "t": 3}
        for name, count in topics.items():
            for index in range(count):
                self.rm.host_partition(name, index, led)
        self.metadata = ClusterMetadata(
            brokers={0: BrokerInfo(0, "127.0.0.1", 1)},
            topics={
                name: TopicState(name, [PartitionState(0, 1, [0], [0], 1)] * count)
                for name, count in topics.items()
            },
            live={0},
        )
        self.sender = FakeSender()
        ids = itertools.count(1000)
        self.service = TransactionService(
            0,
            self.config,
            structlog.get_logger(),
            replica_manager=self.rm,
            timer=self.timer,
            tasks=nursery,
            metadata=lambda: self.metadata,
            create_topic=lambda *a: None,
            new_producer_id=lambda: {
                "error_code": 0,
                "producer_id": next(ids),
                "producer_epoch": 0,
            },
            send_markers=self.sender,
            wall_ms=self.clock.now_ms,
        )
        self.groups = CoordinatorService(
            0,
            self.config,
            structlog.get_logger(),
            replica_manager=self.rm,
            timer=self.timer,
            tasks=nursery,
            metadata=lambda: self.metadata,
            create_offsets_topic=lambda n, rf: None,
        )
        self.sender.on_marker = self.groups.complete_txn

    async def load(self) -> None:
        """Become coordinator of both internal topics (a leader's load from its log)."""
        self.service.on_metadata(self.metadata)
        self.groups.on_metadata(self.metadata)
        with trio.fail_after(5):
            while 0 not in self.service.manager.owned or 0 not in self.groups.manager.owned:
                await trio.sleep(0)

    def call(self, api: p.ApiKey, raw: dict):
        body = p.validate_request(p.RequestHeader(api, NEWEST_VERSIONS[api], 1, "test"), raw)
        s = self.service
        method = {
            p.ApiKey.INIT_PRODUCER_ID: s.init_producer_id,
            p.ApiKey.ADD_PARTITIONS_TO_TXN: s.add_partitions_to_txn,
            p.ApiKey.ADD_OFFSETS_TO_TXN: s.add_offsets_to_txn,
            p.ApiKey.END_TXN: s.end_txn,
            p.ApiKey.LIST_TRANSACTIONS: s.list_transactions,
            p.ApiKey.DESCRIBE_TRANSACTIONS: s.describe_transactions,
            p.ApiKey.FIND_COORDINATOR: s.find_coordinator,
            p.ApiKey.TXN_OFFSET_COMMIT: self.groups.txn_commit_offsets,
            p.ApiKey.OFFSET_FETCH: self.groups.fetch_offsets,
        }[api]
        answer = method(body)
        assert isinstance(answer, dict), f"{api.name} parked: {answer!r}"
        return answer

    def init(self, tid: str = "tx", timeout: int = TIMEOUT, pid: int = -1, epoch: int = -1):
        answer = self.call(
            p.ApiKey.INIT_PRODUCER_ID,
            {
                "transactional_id": tid,
                "transaction_timeout_ms": timeout,
                "producer_id": pid,
                "producer_epoch": epoch,
            },
        )
        return E(answer["error_code"]), answer["producer_id"], answer["producer_epoch"]

    def add(self, pid: int, epoch: int, partitions=(0, 1), tid: str = "tx", topic: str = "t"):
        return add_code(
            self.call(p.ApiKey.ADD_PARTITIONS_TO_TXN, add_body(pid, epoch, partitions, tid, topic))
        )

    def add_parked(self, pid: int, epoch: int, partitions=(0, 1), tid: str = "tx"):
        """An AddPartitionsToTxn that waits (the id busy): its PendingResponse."""
        raw = add_body(pid, epoch, partitions, tid, "t")
        api = p.ApiKey.ADD_PARTITIONS_TO_TXN
        body = p.validate_request(p.RequestHeader(api, NEWEST_VERSIONS[api], 1, "test"), raw)
        answer = self.service.add_partitions_to_txn(body)
        assert isinstance(answer, PendingResponse), answer
        return answer

    def end(self, pid: int, epoch: int, commit: bool, tid: str = "tx") -> ErrorCode:
        answer = self.call(
            p.ApiKey.END_TXN,
            {
                "transactional_id": tid,
                "producer_id": pid,
                "producer_epoch": epoch,
                "committed": commit,
            },
        )
        return E(answer["error_code"])

    def txn(self, tid: str = "tx") -> TransactionMetadata:
        return self.service.manager.transactions[tid]

    def fetch_offsets(self, group: str = "g") -> dict:
        answer = self.call(p.ApiKey.OFFSET_FETCH, {"group_id": group, "topics": None})
        return {
            (t["name"], q["partition"]): q["committed_offset"]
            for t in answer["topics"]
            for q in t["partitions"]
        }


def add_body(pid: int, epoch: int, partitions, tid: str, topic: str) -> dict:
    return {
        "transactional_id": tid,
        "producer_id": pid,
        "producer_epoch": epoch,
        "topics": [{"name": topic, "partitions": list(partitions)}],
    }


def add_code(answer: dict) -> ErrorCode:
    codes = {q["error_code"] for t in answer["results"] for q in t["partitions"]}
    assert len(codes) == 1, answer
    return E(codes.pop())


async def committing(h: Harness) -> tuple[int, int]:
    """A transaction committed whose markers the leaders hold (PrepareCommit): its
    producer id and epoch."""
    _, pid, epoch = h.init()
    h.add(pid, epoch)
    h.sender.gate = trio.Event()
    assert h.end(pid, epoch, commit=True) is E.NONE
    await settle()
    return pid, epoch


async def settle() -> None:
    """Let the marker tasks run to their next wait (the fake sender answers at once)."""
    await trio.testing.wait_all_tasks_blocked()


@pytest.fixture
async def h(tmp_path, nursery):
    harness = Harness(tmp_path, nursery)
    await harness.load()
    yield harness
    harness.rm.close()


# --- the state machine --------------------------------------------------------------------


def test_the_state_machine_refuses_what_kafka_refuses():
    txn = TransactionMetadata("x", 0, 1, 0, TIMEOUT, 0)
    with pytest.raises(IllegalTxnTransition):
        txn.prepare(S.PREPARE_COMMIT, 1)  # Empty -> PrepareCommit: nothing to commit
    transit = txn.prepare_add_partitions({("t", 0)}, 5)
    with pytest.raises(IllegalTxnTransition):
        txn.prepare(S.ONGOING, 6)  # one change pending at a time
    txn.complete(transit)
    assert (txn.state, txn.start_ms, txn.partitions) == (S.ONGOING, 5, {("t", 0)})
    with pytest.raises(IllegalTxnTransition):
        txn.prepare(S.COMPLETE_COMMIT, 7)  # Ongoing -> CompleteCommit skips the prepare
    txn.fence_producer_epoch()
    assert (txn.state, txn.producer_epoch, txn.last_producer_epoch) == (
        S.PREPARE_EPOCH_FENCE,
        1,
        0,
    )
    with pytest.raises(IllegalTxnTransition):
        txn.prepare(S.PREPARE_COMMIT, 8)  # a fenced transaction can only abort
    txn.complete(txn.prepare(S.PREPARE_ABORT, 8))
    txn.complete(txn.prepare_complete(9))
    assert (txn.state, txn.partitions) == (S.COMPLETE_ABORT, set())


# --- InitProducerId -----------------------------------------------------------------------


async def test_init_producer_id_creates_the_id_then_bumps_its_epoch(h):
    code, pid, epoch = h.init()
    assert (code, epoch) == (E.NONE, 0)
    code, pid2, epoch2 = h.init()
    assert (code, pid2, epoch2) == (E.NONE, pid, 1)
    assert h.txn().state is S.EMPTY
    # KIP-360: the producer names itself; a retry with the previous epoch gets the same
    # answer, an unknown pair is a zombie.
    assert h.init(pid=pid, epoch=1) == (E.NONE, pid, 2)
    assert h.init(pid=pid, epoch=1) == (E.NONE, pid, 2)
    assert h.init(pid=pid, epoch=0)[0] is E.PRODUCER_FENCED


async def test_an_exhausted_epoch_moves_the_id_to_a_new_producer_id(h):
    _, pid, _ = h.init()
    h.txn().producer_epoch = MAX_EPOCH  # as after 32766 restarts
    code, new_pid, epoch = h.init()
    assert (code, epoch) == (E.NONE, 0)
    assert new_pid != pid
    assert (h.txn().last_producer_id, h.txn().last_producer_epoch) == (pid, MAX_EPOCH)
    assert h.init(pid=pid, epoch=MAX_EPOCH) == (E.NONE, new_pid, 0)  # a lost answer's retry


async def test_transaction_timeout_is_checked_against_the_maximum(h):
    assert h.init(timeout=900_001)[0] is E.INVALID_TRANSACTION_TIMEOUT
    assert h.init(timeout=0)[0] is E.INVALID_TRANSACTION_TIMEOUT
    assert h.init(timeout=900_000)[0] is E.NONE
    assert h.init(tid="")[0] is E.INVALID_REQUEST


async def test_not_coordinator_and_loading(tmp_path, nursery):
    h = Harness(tmp_path, nursery)
    assert h.init()[0] is E.NOT_COORDINATOR
    h.service.manager.loading[0] = 1
    assert h.init()[0] is E.COORDINATOR_LOAD_IN_PROGRESS
    h.rm.close()


async def test_find_coordinator_names_the_txn_partitions_leader(h):
    answer = h.call(p.ApiKey.FIND_COORDINATOR, {"key": "tx", "key_type": 1})
    assert (answer["error_code"], answer["node_id"]) == (0, 0)
    created = []
    h.service.create_topic = lambda *args: created.append(args)
    del h.metadata.topics[TXN_TOPIC]
    answer = h.call(p.ApiKey.FIND_COORDINATOR, {"key": "tx", "key_type": 1})
    assert answer["error_code"] == E.COORDINATOR_NOT_AVAILABLE
    # Kafka's shape: compacted, min.isr clamped to the replication factor clamped to live.
    assert created == [(TXN_TOPIC, 1, 1, {"min.insync.replicas": "1"})]


# --- a transaction to its end ---------------------------------------------------------------


async def test_a_commit_writes_markers_then_completes(h):
    _, pid, epoch = h.init()
    assert h.add(pid, epoch) is E.NONE
    assert h.add(pid, epoch, partitions=[1]) is E.NONE  # already in: no write needed
    assert h.txn().state is S.ONGOING
    assert h.end(pid, epoch, commit=True) is E.NONE
    assert h.txn().state is S.PREPARE_COMMIT  # answered once the prepare is in the log
    await settle()
    assert h.txn().state is S.COMPLETE_COMMIT
    assert h.txn().partitions == set()
    ((broker, body),) = h.sender.calls
    assert broker == 0
    assert body["markers"] == [
        {
            "producer_id": pid,
            "producer_epoch": epoch,
            "transaction_result": True,
            "topics": [{"name": "t", "partition_indexes": [0, 1]}],
            "coordinator_epoch": 1,
        }
    ]
    assert h.end(pid, epoch, commit=True) is E.NONE  # a retry of what is done
    assert h.end(pid, epoch, commit=False) is E.INVALID_TXN_STATE
    # the next transaction of the same producer
    assert h.add(pid, epoch, partitions=[2]) is E.NONE
    assert h.end(pid, epoch, commit=False) is E.NONE
    await settle()
    assert h.txn().state is S.COMPLETE_ABORT
    assert h.sender.calls[-1][1]["markers"][0]["transaction_result"] is False


async def test_unknown_partitions_fail_the_whole_add(h):
    _, pid, epoch = h.init()
    answer = h.call(
        p.ApiKey.ADD_PARTITIONS_TO_TXN,
        {
            "transactional_id": "tx",
            "producer_id": pid,
            "producer_epoch": epoch,
            "topics": [{"name": "t", "partitions": [0, 9]}],
        },
    )
    codes = {q["partition"]: q["error_code"] for q in answer["results"][0]["partitions"]}
    assert codes == {0: E.OPERATION_NOT_ATTEMPTED, 9: E.UNKNOWN_TOPIC_OR_PARTITION}
    assert h.txn().state is S.EMPTY
    assert h.add(pid + 1, epoch) is E.INVALID_PRODUCER_ID_MAPPING
    assert h.end(pid, epoch, commit=True) is E.INVALID_TXN_STATE  # nothing begun


async def test_requests_meet_concurrent_transactions_while_a_commit_completes(h):
    _, pid, epoch = h.init()
    h.add(pid, epoch)
    h.sender.gate = trio.Event()  # the leaders take their time
    assert h.end(pid, epoch, commit=True) is E.NONE
    await settle()
    assert h.txn().state is S.PREPARE_COMMIT
    assert h.init(pid=pid, epoch=epoch)[0] is E.CONCURRENT_TRANSACTIONS
    assert h.end(pid, epoch, commit=True) is E.CONCURRENT_TRANSACTIONS
    assert h.end(pid, epoch, commit=False) is E.INVALID_TXN_STATE
    # AddPartitionsToTxn waits for the completion, at most
    # add.partitions.to.txn.retry.backoff.max.ms (100), then is answered as Kafka's.
    parked = h.add_parked(pid, epoch, partitions=[2])
    h.clock.advance(99)
    assert parked.body is None
    h.clock.advance(1)
    assert add_code(parked.body) is E.CONCURRENT_TRANSACTIONS
    h.sender.gate.set()
    await settle()
    assert h.txn().state is S.COMPLETE_COMMIT
    assert h.init(pid=pid, epoch=epoch) == (E.NONE, pid, epoch + 1)


async def test_the_next_transaction_waits_for_the_previous_to_complete_not_for_a_retry(h):
    """The client begins its next transaction as soon as EndTxn is answered, while the
    markers are still being written: its AddPartitionsToTxn is held, and proceeds the
    moment CompleteCommit is applied (no time passes on the clock): the client is spared
    CONCURRENT_TRANSACTIONS and its retry backoff (~20 ms for librdkafka)."""
    pid, epoch = await committing(h)
    parked = h.add_parked(pid, epoch, partitions=[2])
    assert h.service.stats()["purgatory"]["add_partitions"]["watched"] == 1
    h.sender.gate.set()
    await settle()
    assert add_code(parked.body) is E.NONE
    assert h.txn().state is S.ONGOING and h.txn().partitions == {("t", 2)}
    assert h.end(pid, epoch, commit=True) is E.NONE  # the new transaction commits as usual


def record_writes(h: Harness) -> list[list[S]]:
    """The states of each __transaction_state append from now on (one list per append)."""
    writes: list[list[S]] = []
    write = h.service.manager.write

    def recorded(txn, transits, done):
        writes.append([t.state for t in transits])
        write(txn, transits, done)

    h.service.manager.write = recorded
    return writes


async def test_a_waiting_add_is_written_with_the_completion_in_one_append(h):
    """The next transaction's Ongoing rides on CompleteCommit's append: one replicated
    write instead of two in series."""
    pid, epoch = await committing(h)
    writes = record_writes(h)
    parked = h.add_parked(pid, epoch, partitions=[2])
    h.sender.gate.set()
    await settle()
    assert writes == [[S.COMPLETE_COMMIT, S.ONGOING]]
    assert add_code(parked.body) is E.NONE
    txn = h.txn()
    assert (txn.state, txn.partitions, txn.pending_state) == (S.ONGOING, {("t", 2)}, None)
    assert txn.start_ms == h.clock.now_ms()
    h.clock.advance(TIMEOUT)  # the new transaction has its timeout
    assert h.txn().state is S.PREPARE_ABORT


async def test_a_coordinator_loading_the_log_finds_the_follow_on_transaction(tmp_path, nursery):
    h = Harness(tmp_path, nursery)
    await h.load()
    pid, epoch = await committing(h)
    parked = h.add_parked(pid, epoch, partitions=[2])
    h.sender.gate.set()
    await settle()
    assert add_code(parked.body) is E.NONE
    h.service._unload(0)
    h.rm.close()
    fresh = Harness(tmp_path, nursery)
    fresh.clock.advance(h.clock.now_ms())
    await fresh.load()
    txn = fresh.txn()
    assert (txn.state, txn.partitions, txn.producer_epoch) == (S.ONGOING, {("t", 2)}, epoch)
    fresh.clock.advance(TIMEOUT)  # its timeout, from when it began
    assert fresh.txn().state is S.PREPARE_ABORT
    fresh.rm.close()


async def test_a_failed_follow_on_write_answers_the_waiting_add_with_its_error(h):
    pid, epoch = await committing(h)
    write = h.service.manager.write
    h.service.manager.write = lambda txn, transits, done: done(E.NOT_ENOUGH_REPLICAS)
    parked = h.add_parked(pid, epoch, partitions=[2])
    h.sender.gate.set()
    await settle()
    assert add_code(parked.body) is E.NOT_ENOUGH_REPLICAS  # as its own write would answer
    assert h.txn().state is S.PREPARE_COMMIT  # still prepared: completed again later
    h.service.manager.write = write


async def test_a_held_add_partitions_is_answered_by_the_next_coordinator_check(h):
    """The coordinator loses the id while the add waits: answered NOT_COORDINATOR at once."""
    pid, epoch = await committing(h)
    parked = h.add_parked(pid, epoch, partitions=[2])
    h.service.coordinator.partition_unloaded(h.service.manager.resign(0))
    assert add_code(parked.body) is E.NOT_COORDINATOR
    h.sender.gate.set()
    await settle()


async def test_without_a_wait_a_busy_id_is_answered_at_once(tmp_path, nursery):
    """add.partitions.to.txn.retry.backoff.max.ms=0: Kafka 3's answer, at once."""
    h = Harness(tmp_path, nursery, **{"add.partitions.to.txn.retry.backoff.max.ms": 0})
    await h.load()
    pid, epoch = await committing(h)
    assert h.add(pid, epoch, partitions=[2]) is E.CONCURRENT_TRANSACTIONS
    h.sender.gate.set()
    await settle()
    h.rm.close()


async def test_a_second_producer_fences_the_first_and_aborts_its_transaction(h):
    _, pid, epoch = h.init()
    assert h.add(pid, epoch) is E.NONE
    h.sender.gate = trio.Event()
    # The new instance (no producer id of its own) takes the id over.
    assert h.init()[0] is E.CONCURRENT_TRANSACTIONS
    await settle()
    txn = h.txn()
    assert (txn.state, txn.producer_epoch) == (S.PREPARE_ABORT, epoch + 1)
    marker = h.sender.calls[-1][1]["markers"][0]
    assert (marker["transaction_result"], marker["producer_epoch"]) == (False, epoch + 1)
    assert h.init()[0] is E.CONCURRENT_TRANSACTIONS  # still aborting: retry
    h.sender.gate.set()
    await settle()
    assert txn.state is S.COMPLETE_ABORT
    assert h.init() == (E.NONE, pid, epoch + 2)
    # the zombie, still at its old epoch
    assert h.add(pid, epoch, partitions=[2]) is E.PRODUCER_FENCED
    assert h.end(pid, epoch, commit=True) is E.PRODUCER_FENCED


# --- timers ---------------------------------------------------------------------------------


async def test_transaction_timeout_aborts_an_abandoned_transaction(h):
    _, pid, epoch = h.init(timeout=5_000)
    h.clock.advance(3_000)  # the timeout counts from the transaction's start, not the init
    assert h.add(pid, epoch) is E.NONE
    h.clock.advance(4_999)
    assert h.txn().state is S.ONGOING
    h.clock.advance(1)
    txn = h.txn()
    assert txn.state is S.PREPARE_ABORT
    assert txn.producer_epoch == epoch + 1  # fenced, as KIP-360's timeout abort does
    await settle()
    assert txn.state is S.COMPLETE_ABORT
    assert h.sender.calls[-1][1]["markers"][0]["transaction_result"] is False
    assert h.service.coordinator.timed_out == 1
    # the producer that went quiet learns it was fenced
    assert h.end(pid, epoch, commit=True) is E.PRODUCER_FENCED


async def test_a_transaction_that_ends_in_time_cancels_its_timer(h):
    _, pid, epoch = h.init(timeout=5_000)
    h.add(pid, epoch)
    purgatory = h.service.purgatories["txn_timeout"]
    assert purgatory.pending == 1
    assert h.end(pid, epoch, commit=True) is E.NONE
    await settle()
    assert purgatory.pending == 0
    h.clock.advance(10_000)
    assert h.txn().state is S.COMPLETE_COMMIT
    assert h.txn().producer_epoch == epoch
    assert h.service.coordinator.timed_out == 0


async def test_a_timed_out_abort_that_cannot_be_written_is_tried_again(h):
    _, pid, epoch = h.init(timeout=5_000)
    h.add(pid, epoch)
    write = h.service.manager.write
    refused = []

    def refuse_once(txn, transits, done):  # the replicas refuse the first write
        if not refused:
            refused.extend(t.state for t in transits)
            done(E.NOT_ENOUGH_REPLICAS)
        else:
            write(txn, transits, done)

    h.service.manager.write = refuse_once
    h.clock.advance(5_000)
    txn = h.txn()
    assert refused == [S.PREPARE_ABORT]
    assert (txn.state, txn.producer_epoch) == (S.PREPARE_EPOCH_FENCE, epoch + 1)
    h.clock.advance(10_000)  # transaction.abort.timed.out.transaction.cleanup.interval.ms
    await settle()
    assert txn.state is S.COMPLETE_ABORT
    assert h.service.coordinator.timed_out == 1


async def test_idle_transactional_ids_expire(h):
    h.init(tid="idle")
    _, pid, epoch = h.init(tid="busy")
    h.add(pid, epoch, tid="busy")
    h.clock.advance(604_800_000)
    # "busy" still has a transaction open (it timed out and aborted meanwhile, which is
    # an update): only the id with nothing going on for the whole period goes.
    await settle()
    assert h.service.expire_transactional_ids() == 1
    assert "idle" not in h.service.manager.transactions
    assert "busy" in h.service.manager.transactions


# --- markers ----------------------------------------------------------------------------------


async def test_markers_are_retried_until_every_leader_has_them(h):
    _, pid, epoch = h.init()
    h.add(pid, epoch)
    h.sender.script = [E.NOT_LEADER_OR_FOLLOWER, NetworkException("gone"), E.NOT_ENOUGH_REPLICAS]
    assert h.end(pid, epoch, commit=True) is E.NONE
    with trio.fail_after(5):
        while h.txn().state is not S.COMPLETE_COMMIT:
            await trio.sleep(0.001)
    assert len(h.sender.calls) == 4
    assert h.service.markers.retried == 3


async def test_a_fenced_coordinator_stops_sending(h):
    _, pid, epoch = h.init()
    h.add(pid, epoch)
    h.sender.script = [E.TRANSACTION_COORDINATOR_FENCED]
    assert h.end(pid, epoch, commit=True) is E.NONE
    await settle()
    assert len(h.sender.calls) == 1
    assert h.txn().state is S.PREPARE_COMMIT  # a newer coordinator completes it


# --- loading ----------------------------------------------------------------------------------


async def test_a_new_leader_completes_a_prepared_commit_and_times_open_ones(tmp_path, nursery):
    h = Harness(tmp_path, nursery)
    await h.load()
    _, pid, epoch = h.init()
    h.add(pid, epoch)
    _, open_pid, open_epoch = h.init(tid="open", timeout=5_000)
    h.add(open_pid, open_epoch, tid="open")
    h.sender.gate = trio.Event()  # the old coordinator dies before any leader answers
    assert h.end(pid, epoch, commit=True) is E.NONE
    await settle()
    h.service.on_metadata(ClusterMetadata(topics={}))  # nothing changes without the topic
    h.service._unload(0)
    assert h.service.manager.transactions == {}
    h.rm.close()
    fresh = Harness(tmp_path, nursery)
    fresh.clock.advance(h.clock.now_ms())
    await fresh.load()
    await settle()
    txn = fresh.txn()
    assert txn.state is S.COMPLETE_COMMIT
    assert fresh.sender.calls[0][1]["markers"][0]["transaction_result"] is True
    assert fresh.txn("open").state is S.ONGOING
    fresh.clock.advance(5_000)
    assert fresh.txn("open").state is S.PREPARE_ABORT
    fresh.rm.close()


# --- offsets in a transaction -----------------------------------------------------------------


def txn_commit(h: Harness, pid: int, epoch: int, offsets: dict, group: str = "g") -> set:
    answer = h.call(
        p.ApiKey.TXN_OFFSET_COMMIT,
        {
            "transactional_id": "tx",
            "group_id": group,
            "producer_id": pid,
            "producer_epoch": epoch,
            "topics": [
                {
                    "name": t,
                    "partitions": [
                        {"partition": i, "committed_offset": o, "committed_metadata": None}
                    ],
                }
                for (t, i), o in offsets.items()
            ],
        },
    )
    return {q["error_code"] for t in answer["topics"] for q in t["partitions"]}


async def test_txn_offsets_appear_exactly_when_the_transaction_commits(h):
    _, pid, epoch = h.init()
    answer = h.call(
        p.ApiKey.ADD_OFFSETS_TO_TXN,
        {"transactional_id": "tx", "producer_id": pid, "producer_epoch": epoch, "group_id": "g"},
    )
    assert answer["error_code"] == 0
    assert h.txn().partitions == {(OFFSETS_TOPIC, 0)}
    assert txn_commit(h, pid, epoch, {("t", 0): 5}) == {0}
    assert h.fetch_offsets() == {}  # pending: no reader sees it yet
    h.add(pid, epoch)
    assert h.end(pid, epoch, commit=True) is E.NONE
    await settle()
    assert h.fetch_offsets() == {("t", 0): 5}
    # an aborted transaction's offsets never appear
    h.call(
        p.ApiKey.ADD_OFFSETS_TO_TXN,
        {"transactional_id": "tx", "producer_id": pid, "producer_epoch": epoch, "group_id": "g"},
    )
    assert txn_commit(h, pid, epoch, {("t", 0): 9}) == {0}
    assert h.end(pid, epoch, commit=False) is E.NONE
    await settle()
    assert h.fetch_offsets() == {("t", 0): 5}
    assert h.groups.manager.groups["g"].pending_txn_offsets == {}


def control_batch(producer_id: int, epoch: int, commit: bool) -> bytes:
    """A marker as the partition side appends it (TXN_CONTRACT.md): a Kafka v2 control
    batch, key int16 version 0 + int16 type, wrapped in our batch."""
    raw = bytearray(
        kafka_records.encode_batch(
            [(0, struct.pack(">hh", 0, 1 if commit else 0), struct.pack(">hi", 0, 1), ())],
            producer_id=producer_id,
            producer_epoch=epoch,
        )
    )
    attributes = kafka_records.TRANSACTIONAL_FLAG | kafka_records.CONTROL_FLAG
    struct.pack_into(">h", raw, kafka_records.CRC_START, attributes)
    crc = kafka_records.crc32c(memoryview(raw)[kafka_records.CRC_START :])
    struct.pack_into(">I", raw, kafka_records.CRC_START - 4, crc)
    header = kafka_records.check_batch(raw, 0, len(raw))
    return bytes(wrap_kafka_batch(raw, 0, header))


async def test_offsets_replay_settles_pending_offsets_at_their_markers(h):
    _, pid, epoch = h.init()
    assert txn_commit(h, pid, epoch, {("t", 1): 3}) == {0}
    replica = h.rm.partitions[(OFFSETS_TOPIC, 0)]
    written = replica.read(0, 1 << 20, for_follower=True)
    ((pos, header),) = list(p.iter_batches(written))
    assert producer_fields(written, pos, header)[:2] == (pid, epoch)  # a transaction's batch

    def offsets_batch(offset: int) -> bytes:
        entry = (offset_key("g", "t", 1), offset_value(Offset(offset, None, 0)))
        return batch([entry], 0, producer_id=pid, producer_epoch=epoch, base_sequence=0)

    log = bytearray()
    for at, part in enumerate(
        [
            offsets_batch(3),
            control_batch(pid, epoch, True),
            offsets_batch(7),
            control_batch(pid, epoch, False),
            offsets_batch(11),  # still open at the log's end
        ]
    ):
        start = len(log)
        log += part
        patch_base_offset(log, start, at)
    contents = PartitionContents()
    assert contents.replay(bytes(log)) == 5
    assert {tp: o.offset for tp, o in contents.offsets["g"].items()} == {("t", 1): 3}
    pending = contents.pending
    assert {tp: o.offset for tp, o in pending[pid]["g"].items()} == {("t", 1): 11}


# --- faults -----------------------------------------------------------------------------------


async def test_faults_fail_and_delay_the_transaction_apis_and_marker_writes(tmp_path, nursery):
    """fail-api / delay-api by Kafka's api keys reach the transaction APIs and
    WriteTxnMarkers before their handlers, as every other API (broker/network/faults.py)."""
    from minibroker.broker.network.pending import PendingResponse
    from minibroker.broker.network.session import ConnectionSession
    from minibroker.broker.server import Broker

    broker = Broker(
        0,
        "127.0.0.1",
        19092,
        tmp_path,
        BrokerConfig({"faults.enable": True}),
        structlog.get_logger(),
    )
    await nursery.start(broker.tasks.run)
    handler = broker.connections.dispatcher
    session = ConnectionSession("127.0.0.1:1")
    keys = (
        p.ApiKey.INIT_PRODUCER_ID,
        p.ApiKey.ADD_PARTITIONS_TO_TXN,
        p.ApiKey.ADD_OFFSETS_TO_TXN,
        p.ApiKey.END_TXN,
        p.ApiKey.WRITE_TXN_MARKERS,
        p.ApiKey.TXN_OFFSET_COMMIT,
    )
    for key in keys:
        fault = {"action": "fail-api", "api_key": int(key), "error_code": 7, "count": 1}
        assert handler.faults(None, fault, session)["error_code"] == 0
        header = p.RequestHeader(key, NEWEST_VERSIONS[key], 1, "test")
        answer = handler.handle(header, {}, session)
        assert answer["error_code"] == E.REQUEST_TIMED_OUT, key
        assert answer["error_message"] == "injected by fault fail-api"
    handler.faults(None, {"action": "delay-api", "api_key": 26, "delay_ms": 50}, session)
    body = {"transactional_id": "", "producer_id": 1, "producer_epoch": 0, "committed": True}
    header = p.RequestHeader(p.ApiKey.END_TXN, 0, 1, "test")
    late = handler.handle(header, body, session)
    assert isinstance(late, PendingResponse)
    assert late.body is None
    with trio.fail_after(5):
        answer = await late.wait()
    assert answer["error_code"] == E.INVALID_REQUEST  # the coordinator's own verdict, late
    broker.replica_manager.close()
