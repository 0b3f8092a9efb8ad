"""The bundled client's transactional producer against a real 3-broker cluster."""

from __future__ import annotations

import time

import pytest

from minibroker.client import SyncAdmin, SyncConsumer, SyncProducer
from minibroker.client.admin import NewTopic
from minibroker.client.errors import ProducerFenced
from minibroker.client.records import TopicPartition
from minibroker.deploy import exit_codes
from minibroker.deploy.testing import start_cluster
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, RequestTimedOut, TransactionalIdNotFound
from tests.waiting import wait_until

from .test_cli_client import cli, one_error_line
from .test_kafka_transactions import TXN_CONFIG, read_committed

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("txnclient"), 3, TXN_CONFIG)
    yield cluster
    cluster.close()


def _read(bootstrap: str, topic: str, isolation: str, want: int) -> list[bytes]:
    with SyncConsumer(bootstrap, **{"isolation.level": isolation}) as c:
        c.assign([(topic, 0)])
        c.seek_to_beginning((topic, 0))
        out: list[bytes] = []
        for _ in range(20):
            out += [r.value for r in c.poll(timeout_ms=500)]
            if len(out) >= want:
                break
        return out


def _read_to_end(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    """Every record a consumer at ``isolation`` returns from partition 0 until its position
    reaches the log's end (read past markers and skipped records), within 20 s."""
    tp = (topic, 0)
    with SyncConsumer(bootstrap, **{"isolation.level": isolation}) as c:
        c.assign([tp])
        c.seek_to_beginning(tp)
        [end] = c.end_offsets([tp]).values()
        out: list[bytes] = []
        wait_until(
            lambda: out.extend(r.value for r in c.poll(timeout_ms=200)) or c.position(tp) >= end,
            20,
            f"{topic} read to offset {end}",
        )
        return out


def test_commit_visible_abort_invisible_and_zombie_fenced(cluster):
    bootstrap = cluster.bootstrap
    with SyncAdmin(bootstrap) as admin:
        admin.create_topics([NewTopic("tx-basic", 1, 3)])
    with SyncProducer(bootstrap, **{"transactional.id": "tx-a"}) as p:
        p.init_transactions()
        p.begin_transaction()
        p.send("tx-basic", b"c1", partition=0)
        p.commit_transaction()
        p.begin_transaction()
        p.send("tx-basic", b"a1", partition=0)
        p.abort_transaction()
        p.begin_transaction()
        p.send("tx-basic", b"c2", partition=0)
        p.commit_transaction()
        assert p.transaction_state == "READY"
    # One partition: a reader that got c2 has passed a1's offset, so a1 was skipped.
    assert _read(bootstrap, "tx-basic", "read_committed", 2) == [b"c1", b"c2"]
    assert _read(bootstrap, "tx-basic", "read_uncommitted", 3) == [b"c1", b"a1", b"c2"]
    # A stock client reads the bundled producer's markers and aborted index the same way.
    assert read_committed(cluster, "tx-basic", 1, 2, "read_committed") == [b"c1", b"c2"]
    assert read_committed(cluster, "tx-basic", 1, 3, "read_uncommitted") == [b"c1", b"a1", b"c2"]

    zombie = SyncProducer(bootstrap, **{"transactional.id": "tx-z"})
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send("tx-basic", b"z", partition=0)
        with SyncProducer(bootstrap, **{"transactional.id": "tx-z"}) as fresh:
            # The new instance's InitProducerId bumps the epoch and aborts what the
            # zombie left open (it waits, CONCURRENT_TRANSACTIONS, until that is done).
            fresh.init_transactions()
            fresh.begin_transaction()
            fresh.send("tx-basic", b"f1", partition=0)
            fresh.commit_transaction()
        with pytest.raises(ProducerFenced) as raised:
            zombie.commit_transaction()
        assert raised.value.code is ErrorCode.PRODUCER_FENCED
        assert zombie.transaction_state == "FATAL_ERROR"
        with pytest.raises(ProducerFenced):  # fatal: nothing more from this instance
            zombie.begin_transaction()
    finally:
        try:
            zombie.close()
        except Exception:
            pass
    assert _read(bootstrap, "tx-basic", "read_committed", 3) == [b"c1", b"c2", b"f1"]
    assert read_committed(cluster, "tx-basic", 1, 3, "read_committed") == [b"c1", b"c2", b"f1"]
    assert _read(bootstrap, "tx-basic", "read_uncommitted", 5)[3:] == [b"z", b"f1"]


def test_consume_transform_produce_commits_the_offsets_with_the_transaction(cluster):
    """send_offsets_to_transaction: the group's offsets are the transaction's, invisible
    while it is open, dropped when it aborts, the group's once it commits."""
    bootstrap = cluster.bootstrap
    with SyncAdmin(bootstrap) as admin:
        admin.create_topics([NewTopic("ctp-in", 1, 3), NewTopic("ctp-out", 1, 3)])
    with SyncProducer(bootstrap) as plain:
        for i in range(4):
            plain.send("ctp-in", b"in-%d" % i, partition=0)
    tp = TopicPartition("ctp-in", 0)
    consumer = SyncConsumer(
        bootstrap,
        group_id="ctp",
        **{"isolation.level": "read_committed", "enable.auto.commit": False,
           "auto.offset.reset": "earliest"},
    )  # fmt: skip
    producer = SyncProducer(bootstrap, **{"transactional.id": "ctp-app"})
    try:
        producer.init_transactions()
        consumer.subscribe(["ctp-in"])
        batch = wait_until(lambda: consumer.poll(timeout_ms=500, max_records=2), 30, "records")
        assert [r.offset for r in batch] == [0, 1]
        with SyncAdmin(bootstrap) as admin:

            def transform(commit: bool) -> None:
                producer.begin_transaction()
                for r in batch:
                    producer.send("ctp-out", r.value.upper(), partition=0)
                producer.send_offsets_to_transaction(
                    {tp: batch[-1].offset + 1}, consumer.group_metadata()
                )
                # Held pending by the group coordinator until the transaction ends.
                assert admin.list_consumer_group_offsets("ctp") == {}
                if commit:
                    producer.commit_transaction()
                else:
                    producer.abort_transaction()
                done = "CompleteCommit" if commit else "CompleteAbort"
                wait_until(lambda: state_of(admin, "ctp-app") == done, 30, done)

            transform(commit=False)
            assert admin.list_consumer_group_offsets("ctp") == {}  # dropped with the abort
            transform(commit=True)
            assert admin.list_consumer_group_offsets("ctp") == {tp: 2}
        assert consumer.committed([tp]) == {tp: 2}
    finally:
        producer.close()
        consumer.close()
    assert _read(bootstrap, "ctp-out", "read_committed", 2) == [b"IN-0", b"IN-1"]
    assert _read(bootstrap, "ctp-out", "read_uncommitted", 4) == [b"IN-0", b"IN-1"] * 2


def test_transaction_timeout_aborts_an_abandoned_transaction(cluster):
    bootstrap = cluster.bootstrap
    with SyncAdmin(bootstrap) as admin:
        admin.create_topics([NewTopic("tx-abandoned", 1, 3)])
        producer = SyncProducer(
            bootstrap, **{"transactional.id": "tx-abandoner", "transaction.timeout.ms": 2000}
        )
        try:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("tx-abandoned", b"never committed", partition=0)
            assert state_of(admin, "tx-abandoner") == "Ongoing"
            started = time.monotonic()
            # The coordinator's timer aborts it (fencing the producer, KIP-360).
            wait_until(lambda: state_of(admin, "tx-abandoner") == "CompleteAbort", 30, "the abort")
            assert time.monotonic() - started >= 1.0  # not before its timeout (less the sends)
            with pytest.raises(ProducerFenced):
                producer.commit_transaction()
        finally:
            producer.close()
    assert _read_to_end(bootstrap, "tx-abandoned", "read_uncommitted") == [b"never committed"]
    assert _read_to_end(bootstrap, "tx-abandoned", "read_committed") == []


def test_a_read_committed_member_waits_for_offsets_a_transaction_holds(cluster):
    """KIP-447: the new member's OffsetFetch asks require_stable and is answered
    UNSTABLE_OFFSET_COMMIT while a transaction holds the group's offset, so it starts
    from the offset the transaction commits, not from auto.offset.reset."""
    bootstrap = cluster.bootstrap
    with SyncAdmin(bootstrap) as admin:
        admin.create_topics([NewTopic("stable-in", 1, 3)])
    with SyncProducer(bootstrap) as plain:
        for i in range(4):
            plain.send("stable-in", b"s-%d" % i, partition=0)
    producer = SyncProducer(bootstrap, **{"transactional.id": "stable-app"})
    consumer = SyncConsumer(
        bootstrap,
        group_id="stable-g",
        **{"isolation.level": "read_committed", "auto.offset.reset": "earliest"},
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({("stable-in", 0): 2}, "stable-g")
        consumer.subscribe(["stable-in"])
        waited = time.monotonic()
        while time.monotonic() - waited < 3:  # the transaction stays open meanwhile
            assert consumer.poll(timeout_ms=500) == []
        producer.commit_transaction()
        first = wait_until(lambda: consumer.poll(timeout_ms=500), 30, "records after the commit")
        assert [r.offset for r in first][:1] == [2]
    finally:
        producer.close()
        consumer.close()


# --- Admin.list_transactions / describe_transactions and `minibroker transactions` -----------


def state_of(admin: SyncAdmin, transactional_id: str) -> str:
    return admin.describe_transactions([transactional_id])[transactional_id].state


def test_admin_and_cli_list_and_describe_transactions(cluster):
    bootstrap = cluster.bootstrap
    with SyncAdmin(bootstrap) as admin:
        admin.create_topics([NewTopic("tx-admin", 2, 3)])
    done = SyncProducer(bootstrap, **{"transactional.id": "tx-done"})
    open_ = SyncProducer(bootstrap, **{"transactional.id": "tx-open"})
    try:
        done.init_transactions()
        done.begin_transaction()
        done.send("tx-admin", b"d", partition=0)
        done.commit_transaction()
        open_.init_transactions()
        open_.begin_transaction()
        open_.send("tx-admin", b"o0", partition=0)
        open_.send("tx-admin", b"o1", partition=1)
        with SyncAdmin(bootstrap) as admin:
            # EndTxn answers once PrepareCommit is written; the markers follow.
            wait_until(lambda: state_of(admin, "tx-done") == "CompleteCommit", 30, "CompleteCommit")
            d = admin.describe_transactions(["tx-open"])["tx-open"]
            assert d.state == "Ongoing"
            assert d.topic_partitions == [
                TopicPartition("tx-admin", 0),
                TopicPartition("tx-admin", 1),
            ]
            assert d.transaction_timeout_ms == 60000  # the producer's transaction.timeout.ms
            assert d.transaction_start_time_ms is not None and d.producer_epoch >= 0
            committed = admin.describe_transactions(["tx-done"])["tx-done"]
            assert committed.topic_partitions == []  # (its start time stays, as Kafka's)

            listed = {t.transactional_id: t for t in admin.list_transactions()}
            assert {"tx-open", "tx-done"} <= set(listed)
            # Listed by the broker that coordinates it, as FindCoordinator says.
            assert listed["tx-open"].coordinator_id == d.coordinator_id
            assert listed["tx-open"].producer_id == d.producer_id
            assert listed["tx-open"].state == "Ongoing"
            ongoing = {t.transactional_id for t in admin.list_transactions(["Ongoing"])}
            assert "tx-open" in ongoing and "tx-done" not in ongoing
            complete = {t.transactional_id for t in admin.list_transactions(["CompleteCommit"])}
            assert "tx-done" in complete and "tx-open" not in complete
            by_pid = admin.list_transactions(producer_id_filters=[d.producer_id])
            assert [t.transactional_id for t in by_pid] == ["tx-open"]
            with pytest.raises(TransactionalIdNotFound):
                admin.describe_transactions(["tx-never"])

        shown = cli("transactions", "list", "--state", "Ongoing", "--bootstrap", bootstrap)
        assert shown.returncode == 0, shown.stderr
        lines = [line.split() for line in shown.stdout.splitlines()]
        assert lines[0] == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
        assert ["tx-open", str(d.coordinator_id), str(d.producer_id), "Ongoing"] in lines
        assert not any(row[0] == "tx-done" for row in lines)

        shown = cli(
            "transactions", "describe", "--transactional-id", "tx-open", "--bootstrap", bootstrap
        )
        assert shown.returncode == 0, shown.stderr
        header, row = (line.split() for line in shown.stdout.splitlines())
        assert header[:5] == [
            "CoordinatorId",
            "TransactionalId",
            "ProducerId",
            "ProducerEpoch",
            "TransactionState",
        ]
        assert header[5:] == [
            "TransactionTimeoutMs",
            "CurrentTransactionStartTimeMs",
            "TransactionDurationMs",
            "TopicPartitions",
        ]
        assert row[:5] == [
            str(d.coordinator_id),
            "tx-open",
            str(d.producer_id),
            str(d.producer_epoch),
            "Ongoing",
        ]
        assert row[5:7] == ["60000", str(d.transaction_start_time_ms)]
        assert int(row[7]) >= 0 and row[8] == "tx-admin-0,tx-admin-1"

        shown = cli(
            "transactions", "describe", "--transactional-id", "tx-never", "--bootstrap", bootstrap
        )
        assert shown.returncode == exit_codes.USER_ERROR
        assert "TRANSACTIONAL_ID_NOT_FOUND" in one_error_line(shown)
        assert "tx-never" in shown.stderr
    finally:
        for producer in (open_, done):
            try:
                if producer.transaction_state == "IN_TRANSACTION":
                    producer.abort_transaction()
                producer.close()
            except Exception:
                pass


# --- faults on the transactional APIs (`minibroker faults`, the Admin faults call) ---------


def test_an_end_txn_delayed_past_max_block_ms_times_the_commit_out_and_it_resumes(cluster):
    bootstrap = cluster.bootstrap
    with SyncAdmin(bootstrap) as admin:
        admin.create_topics([NewTopic("tx-slow-end", 1, 3)])
    producer = SyncProducer(bootstrap, **{"transactional.id": "tx-slow-end", "max.block.ms": 1500})
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("tx-slow-end", b"late", partition=0)
        for broker in range(cluster.brokers):  # as a user would: the faults command
            shown = cli("faults", "delay-api", "--broker", str(broker), "--api", "end-txn",
                        "--delay-ms", "4000", "--bootstrap", bootstrap)  # fmt: skip
            assert shown.returncode == 0, shown.stderr
        try:
            started = time.monotonic()
            with pytest.raises(RequestTimedOut) as raised:
                producer.commit_transaction()
            assert time.monotonic() - started < 4  # max.block.ms, not the broker's delay
            assert "END_TXN" in str(raised.value) and "tx-slow-end" in str(raised.value)
            assert producer.transaction_state == "COMMITTING_TRANSACTION"
        finally:
            cluster.clear_faults()
        producer.commit_transaction()  # resumed: the coordinator has decided it already
        assert producer.transaction_state == "READY"
    finally:
        producer.close()
    assert _read_to_end(bootstrap, "tx-slow-end", "read_committed") == [b"late"]


def test_a_failing_marker_write_holds_the_commit_until_the_fault_is_lifted(cluster):
    bootstrap = cluster.bootstrap
    topic = "tx-held-marker"
    with SyncAdmin(bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 3)])
        leader = cluster.leader(topic)
        with SyncProducer(bootstrap, **{"transactional.id": "tx-held"}) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(topic, b"before", partition=0)
            producer.commit_transaction()
            wait_until(lambda: state_of(admin, "tx-held") == "CompleteCommit", 30, "the first")
            admin.faults(
                leader,
                "fail-api",
                api_key=int(ApiKey.WRITE_TXN_MARKERS),
                error_code=int(ErrorCode.NOT_ENOUGH_REPLICAS),
                count=-1,
            )
            try:  # the marker sender retries NOT_ENOUGH_REPLICAS until the fault is lifted
                producer.begin_transaction()
                producer.send(topic, b"held", partition=0)
                producer.commit_transaction()  # answered once PrepareCommit is written
                wait_until(
                    lambda: any(
                        cluster.stats(b)["transactions"]["marker_retries"]
                        for b in range(cluster.brokers)
                    ),
                    30,
                    "the marker sender's retries",
                )
                assert state_of(admin, "tx-held") == "PrepareCommit"
                assert _read_to_end(bootstrap, topic, "read_committed") == [b"before"]
                assert _read_to_end(bootstrap, topic, "read_uncommitted") == [b"before", b"held"]
            finally:
                cluster.clear_faults()
            wait_until(lambda: state_of(admin, "tx-held") == "CompleteCommit", 30, "the commit")
    assert _read_to_end(bootstrap, topic, "read_committed") == [b"before", b"held"]
