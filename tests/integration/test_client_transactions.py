"""The bundled client's transactional producer against a real 3-broker cluster."""

from __future__ import annotations

import pytest

from minibroker.client import SyncAdmin, SyncConsumer, SyncProducer
from minibroker.client.admin import NewTopic
from minibroker.client.errors import ProducerFenced
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster


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
