"""A follower whose disk fills: its log dir goes offline, the ISR shrinks, nothing acked is lost.

Broker 2's data dir is a 4 MB tmpfs (the test mounts it: it runs as root here), filled
by producing acks=all records it follows. Kafka's behaviour is the bar: the failed log
dir goes offline and its replicas stop, so the leader drops the follower from the ISR
at replica.lag.time.max.ms instead of counting a replica that stores nothing; the
broker stays up and names the dir and the error (stats, `cluster status`); every
acknowledged record is still there.
"""

from __future__ import annotations

import subprocess

import pytest
import trio

from minibroker.client import Admin, Consumer, NewTopic, Producer
from minibroker.deploy.cluster_ops import gather_status, render_status
from minibroker.protocol.errors import KafkaError

from .cluster_helpers import broker_stats, isr_of, partition_led_by, wait_for

pytestmark = pytest.mark.integration

FULL = 2  # the broker whose disk fills
LAG_MS = 3000


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MB tmpfs where cluster_factory will put broker 2's data dir (its first
    cluster is tmp_path/cluster-0); unmounted after the cluster stops."""
    where = tmp_path / "cluster-0" / f"broker-{FULL}"
    where.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], check=True)
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


async def test_a_full_disk_takes_the_follower_offline_and_nothing_acked_is_lost(
    small_disk, cluster_factory
):
    state = await cluster_factory(3, {"min.insync.replicas": 2, "replica.lag.time.max.ms": LAG_MS})
    assert state.data_dir / f"broker-{FULL}" == small_disk
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic("fill", 3, 3)])
    partition = await partition_led_by(state, "fill", lambda leader: leader != FULL)
    await wait_for(lambda: _isr_is(state, partition, [0, 1, 2]), 30, "the full ISR before filling")

    acked: dict[int, bytes] = {}
    value = b"x" * 50_000
    async with Producer(state.bootstrap, acks="all", **{"linger.ms": 0}) as producer:
        for i in range(160):  # 8 MB: twice the follower's disk
            try:
                meta = await producer.send("fill", value + b"%d" % i, partition=partition)
            except KafkaError:
                continue  # not acknowledged: no promise made
            acked[meta.offset] = value + b"%d" % i

    async def offline() -> dict | None:
        dirs = (await broker_stats(state, FULL))["log_dirs"]
        return None if dirs[0]["online"] else dirs[0]

    failed = await wait_for(offline, 30, f"broker {FULL}'s log dir offline")
    assert failed["dir"] == str(small_disk)
    assert "No space left on device" in failed["error"] and "ENOSPC" in failed["error"]
    # The leader dropped the follower at the lag time, and kept acknowledging with two.
    await wait_for(lambda: _isr_is(state, partition, [0, 1]), 30, "ISR without the full broker")
    assert len(acked) >= 140, f"only {len(acked)} of 160 acknowledged"
    # The broker stays up, says which dir failed and why, everywhere a user looks.
    assert state.process(FULL) is not None and state.process(FULL).is_running()
    status = render_status(await trio.to_thread.run_sync(gather_status, state))
    assert f"broker {FULL}: OFFLINE LOG DIR {small_disk}" in status
    assert "No space left on device" in status
    # Every acknowledged record, byte for byte, from the replicas that hold them.
    got: dict[int, bytes] = {}
    async with Consumer(state.bootstrap) as consumer:
        consumer.assign([("fill", partition)])
        consumer.seek_to_beginning()
        while len(got) < len(acked):
            records = await consumer.poll(timeout_ms=5000)
            assert records, f"only {len(got)} of {len(acked)} acknowledged records came back"
            got.update({r.offset: r.value for r in records})
    assert {o: got.get(o) for o in acked} == acked


async def _isr_is(state, partition: int, wanted: list[int]) -> bool:
    return await isr_of(state, "fill", partition) == wanted
