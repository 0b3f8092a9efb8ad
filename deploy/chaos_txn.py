"""The transactional workload of ``minibroker chaos --workload transactions``: producers
(bundled, and confluent-kafka ones on the Kafka listener: deploy/chaos_txn_rdkafka.py),
each with its own transactional.id, write transactions of 2-6 records spread over the
partitions of their own topic, abort about a quarter of them on purpose, and log every
outcome, while a read_committed consumer reads along and the nemesis also faults the
transaction coordinators and the topic's leaders. After the heal the topic is read
whole, read_committed and read_uncommitted, and ``chaos_txn_check`` judges it.

A producer whose transaction failed is closed and replaced by a new one with the same
transactional.id: its init_transactions fences the old epoch and has the coordinator
settle what the old one left open (Kafka's recipe after a fatal or unknown commit).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import trio

from minibroker.client import Admin, NewTopic, Producer
from minibroker.client.coordinator import TRANSACTION
from minibroker.client.txn_state import IllegalTransactionState
from minibroker.deploy.chaos_reads import consume, read_to_end
from minibroker.deploy.chaos_txn_check import Txn, TxnHistory
from minibroker.protocol.errors import KafkaError

TXN_TOPIC = "chaos-txn"
TXN_BROKER_CONFIG = {
    # fewer __transaction_state partitions to create and move than Kafka's 50
    "transaction.state.log.num.partitions": "6",
    # a timed-out transaction's abort retried soon after a fault held it up
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
}
TXN_PRODUCER = {
    "acks": "all",
    "linger.ms": 2,
    "request.timeout.ms": 2000,
    "delivery.timeout.ms": 6000,
    "retry.backoff.ms": 100,
    # a coordinator failover (broker.session.timeout.ms 3 s) fits; longer is a failure
    "max.block.ms": 10000,
    # an abandoned transaction is aborted by the coordinator this long after it began
    "transaction.timeout.ms": 10000,
}
BUNDLED, CONFLUENT = "bundled", "confluent-kafka"  # the producers' clients
ABORT_RATE = 0.25
RECORDS = (2, 6)  # records per transaction, at least two so it spans partitions


class _Replace(Exception):
    """Leave a producer's block without flushing it: it is replaced."""


class TxnClientError(Exception):
    """A stock client's error (deploy/chaos_txn_rdkafka.py), named as that client names it."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def error_name(exc: Exception) -> str:
    if isinstance(exc, KafkaError):
        return exc.code.name
    return exc.name if isinstance(exc, TxnClientError) else type(exc).__name__


FAILED = (KafkaError, IllegalTransactionState, TxnClientError)  # a transaction's failures


class TxnWorkload:
    def __init__(
        self,
        bootstrap: str,
        partitions: int,
        producers: int,
        seed: int,
        log: Callable[[str], None],
        confluent: int = 0,
        kafka_bootstrap: str = "",
    ) -> None:
        """The last ``confluent`` of the ``producers`` are confluent-kafka producers on the
        Kafka listeners at ``kafka_bootstrap``."""
        self.bootstrap, self.partitions, self.seed, self.log = bootstrap, partitions, seed, log
        self.kafka_bootstrap = kafka_bootstrap
        self.ids = [f"chaos-txn-{i}" for i in range(producers)]
        self.history = TxnHistory(TXN_TOPIC)
        self.history.clients = {
            tid: CONFLUENT if i >= producers - confluent else BUNDLED
            for i, tid in enumerate(self.ids)
        }
        self._victims = 0  # which id's coordinator / which partition's leader is next

    async def start(self, admin: Admin, rf: int, min_isr: int) -> None:
        """The topic, and every transactional id's coordinator (the first lookup creates
        __transaction_state), before the nemesis starts."""
        configs = {"min.insync.replicas": str(min_isr)}
        await admin.create_topics([NewTopic(TXN_TOPIC, self.partitions, rf, configs)])
        for tid in self.ids:
            with trio.fail_after(60):
                await admin.find_coordinator(tid, TRANSACTION)

    # --- the nemesis' victims ---------------------------------------------------------------

    async def coordinator(self, admin: Admin) -> int:
        """The coordinator of one of the transactional ids (each in turn) now."""
        tid = self.ids[self._victims % len(self.ids)]
        self._victims += 1
        return await admin.find_coordinator(tid, TRANSACTION)

    async def leader(self, admin: Admin) -> int:
        """The leader of one of the topic's partitions (each in turn) now (-1: none)."""
        partition = self._victims % self.partitions
        self._victims += 1
        return (await admin.describe_topics([TXN_TOPIC]))[TXN_TOPIC].partitions[partition].leader

    # --- the workload -----------------------------------------------------------------------

    async def produce(self, i: int, stop: trio.Event) -> None:
        """Transactions until ``stop`` (the one open then is finished); a producer whose
        transaction failed is replaced."""
        tid = self.ids[i]
        rng = random.Random(f"txn-{self.seed}-{i}")
        seq = n = 0
        while not stop.is_set():
            try:
                async with self._producer(tid) as p:
                    try:
                        await p.init_transactions()
                    except FAILED as exc:
                        self.log(f"{tid}: init_transactions failed: {error_name(exc)}; again")
                        raise _Replace from exc
                    while not stop.is_set():
                        size = rng.randint(*RECORDS)
                        first = rng.randrange(self.partitions)
                        records = [
                            ((first + k) % self.partitions, f"t{i}-{seq + k}".encode())
                            for k in range(size)
                        ]
                        seq += size
                        txn = Txn(f"t{i}.{n}", records, producer=tid)
                        n += 1
                        self.history.txns.append(txn)
                        if not await self._transact(p, txn, abort=rng.random() < ABORT_RATE):
                            raise _Replace
            except _Replace:
                await trio.sleep(0.1)
            except KafkaError as exc:  # the producer could not even start (no broker answered)
                self.log(f"{tid}: producer failed to start: {exc.code.name}; again")
                await trio.sleep(0.2)

    def _producer(self, tid: str) -> Any:
        """A new producer for ``tid``, of the client it was given (an async context)."""
        if self.history.clients[tid] == CONFLUENT:
            from minibroker.deploy.chaos_txn_rdkafka import RdkafkaTxnProducer  # an extra

            return RdkafkaTxnProducer(self.kafka_bootstrap, tid, TXN_PRODUCER, TxnClientError)
        return Producer(self.bootstrap, {**TXN_PRODUCER, "transactional.id": tid})

    async def _transact(self, producer: Any, txn: Txn, abort: bool) -> bool:
        """One transaction, its outcome logged; False if the producer must be replaced."""
        committing = False
        try:
            producer.begin_transaction()
            for partition, value in txn.records:
                await producer.enqueue(TXN_TOPIC, value, partition=partition)
            if abort:
                # Written first, so the abort has records to hide (an abort before they
                # are sent only drops them in the client).
                await producer.flush()
                await producer.abort_transaction()
                txn.outcome = "aborted"
                return True
            committing = True
            await producer.commit_transaction()
            txn.outcome = "committed"
            return True
        except FAILED as exc:
            # Never asked to commit: it cannot commit (the next producer's init aborts it).
            # A commit that raised may have been decided either way.
            txn.outcome = "unknown" if committing else "aborted"
            txn.error = error_name(exc)
            self.log(f"transaction {txn.name}: {txn.error}; {txn.outcome}; a new producer")
            return False

    async def consume(self, stop: trio.Event) -> None:
        await consume(
            self.bootstrap, TXN_TOPIC, self.partitions, self.history.live, stop, self.log,
            **{"isolation.level": "read_committed"},
        )  # fmt: skip

    async def final_read(self) -> None:
        h = self.history
        h.committed, h.complete = await read_to_end(
            self.bootstrap, TXN_TOPIC, self.partitions, **{"isolation.level": "read_committed"}
        )
        h.uncommitted, _ = await read_to_end(self.bootstrap, TXN_TOPIC, self.partitions)
        self.log(
            f"final read of {TXN_TOPIC}: {len(h.committed)} records read_committed (to the "
            f"end: {h.complete}), {len(h.uncommitted)} read_uncommitted"
        )
