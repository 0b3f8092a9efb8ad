"""A broker's recovery-point-offset-checkpoint at work (issue 40 part 4): after a kill the
broker validates only what its checkpoint does not vouch for, and a clean stop leaves
every partition checkpointed at its end."""

from __future__ import annotations

import pytest

from minibroker.broker.storage.offset_checkpoint import (
    RECOVERY_POINT_FILE,
    read_checkpoint,
    write_checkpoint,
)
from minibroker.client import NewTopic
from minibroker.client.sync import SyncAdmin, SyncProducer
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

TOPIC = "recovery-point"


def latest(cluster) -> int:
    cluster.wait_for_leader(TOPIC)
    with SyncAdmin(cluster.bootstrap) as admin:
        return next(iter(admin.list_offsets({(TOPIC, 0): -1}).values())).offset


def test_a_killed_broker_validates_the_segments_its_checkpoint_does_not_vouch_for(
    minibroker_cluster_factory,
):
    cluster = minibroker_cluster_factory(1, {"log.flush.offset.checkpoint.interval.ms": 100})
    broker_dir = cluster.state.broker_dir(0)
    checkpoint = broker_dir / RECOVERY_POINT_FILE
    with SyncAdmin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, 1, 1, configs={"internal.segment.bytes": "4096"})])
    with SyncProducer(cluster.bootstrap, acks="all") as producer:
        for i in range(300):
            producer.send(TOPIC, b"%03d" % i + b"." * 97, partition=0)
    partition_dir = broker_dir / f"{TOPIC}-0"
    bases = sorted(int(p.stem) for p in partition_dir.glob("*.log"))
    assert len(bases) > 3
    # Every roll's flush has ended and the periodic checkpoint says so.
    wait_until(
        lambda: read_checkpoint(checkpoint).get((TOPIC, 0)) == bases[-1],
        60,
        f"the checkpointed recovery point to reach the active segment's base {bases[-1]}",
    )
    sealed = partition_dir / f"{bases[1]:020d}.log"
    raw = bytearray(sealed.read_bytes())
    first_batch_end = 12 + int.from_bytes(raw[8:12], "big")
    raw[first_batch_end - 1] ^= 0x40  # a record byte of its first batch: a CRC mismatch

    cluster.kill(0)
    sealed.write_bytes(raw)
    cluster.restart(0)
    assert latest(cluster) == 300  # below the checkpointed point: trusted, not rescanned

    cluster.kill(0)
    write_checkpoint(checkpoint, {(TOPIC, 0): 0})  # as if killed before any flush ended
    cluster.restart(0)
    assert latest(cluster) == bases[1]  # validated batch by batch: cut at the bad batch

    cluster.stop(0)  # clean: the log is flushed to its end and checkpointed there
    assert read_checkpoint(checkpoint)[(TOPIC, 0)] == bases[1]
