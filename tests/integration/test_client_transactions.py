"""The bundled client's transactional producer against a real 3-broker cluster."""

from __future__ import annotations

import pytest

from minibroker.client import SyncAdmin, SyncConsumer, SyncProducer
from minibroker.client.admin import NewTopic
from minibroker.client.errors import ProducerFenced
from minibroker.client.records import TopicPartition
from minibroker.deploy import exit_codes
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol.errors import TransactionalIdNotFound
from tests.waiting import wait_until

from .test_cli_client import cli, one_error_line

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    config = {
        **DEFAULT_CONFIG,
        "transaction.state.log.num.partitions": 3,
        "offsets.topic.num.partitions": 3,
        "group.initial.rebalance.delay.ms": 0,
    }
    cluster = start_cluster(tmp_path_factory.mktemp("txnclient"), 3, config)
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
    assert _read(bootstrap, "tx-basic", "read_committed", 2) == [b"c1", b"c2"]
    assert _read(bootstrap, "tx-basic", "read_uncommitted", 3) == [b"c1", b"a1", b"c2"]

    zombie = SyncProducer(bootstrap, **{"transactional.id": "tx-z"})
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send("tx-basic", b"z", partition=0)
        with SyncProducer(bootstrap, **{"transactional.id": "tx-z"}) as fresh:
            fresh.init_transactions()
        with pytest.raises(ProducerFenced):
            zombie.commit_transaction()
        assert zombie.transaction_state == "FATAL_ERROR"
    finally:
        try:
            zombie.close()
        except Exception:
            pass


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
