"""The metadata quorum in real broker processes: election, failover, restart from disk.

Every broker of `cluster up` is a voter; these tests read each one's quorum view from its
BROKER_STATS and kill -9 whichever broker leads the quorum, never assuming it is broker 0.
"""

from __future__ import annotations

import signal
import time

import pytest
import trio

from minibroker.broker.controller.controller import METADATA_FILE
from minibroker.broker.metadata.image import (
    BrokerInfo,
    ClusterMetadata,
    PartitionState,
    TopicState,
    save_metadata,
)
from minibroker.client import Admin, Consumer, NewTopic, Producer
from minibroker.deploy.cluster_ops import gather_status, render_status
from minibroker.protocol.errors import KafkaError

from .cluster_helpers import broker_stats, wait_for

pytestmark = pytest.mark.integration

QUORUM = {
    "controller.quorum.election.timeout.ms": 500,
    "controller.quorum.fetch.timeout.ms": 1000,
}


async def quorum_views(state, brokers) -> dict[int, dict]:
    views = {}
    for b in brokers:
        try:
            views[b] = (await broker_stats(state, b))["quorum"]
        except Exception:  # a dead or starting broker has no view
            pass
    return views


async def active_controller(state, brokers) -> tuple[int, dict] | None:
    """The one voter that leads the quorum with its epoch committed, once all agree on it."""
    views = await quorum_views(state, brokers)
    active = [(b, v) for b, v in views.items() if v["active"]]
    if len(active) != 1 or len(views) < len(brokers):
        return None
    leader, view = active[0]
    agree = all(v["leader_id"] == leader and v["epoch"] == view["epoch"] for v in views.values())
    return (leader, view) if agree else None


async def test_quorum_leader_killed_a_new_one_is_elected_and_the_log_survives_restart(
    cluster_factory,
):
    state = await cluster_factory(3, QUORUM)
    alive = [0, 1, 2]
    leader, view = await wait_for(lambda: active_controller(state, alive), 15, "a quorum leader")
    assert set(view["voter_lag"]) == {"0", "1", "2"}
    first_epoch, committed = view["epoch"], view["high_watermark"]
    assert committed >= 1  # the leader's epoch-start control record committed

    state.kill(leader)
    t0 = time.monotonic()
    alive.remove(leader)
    new, new_view = await wait_for(
        lambda: active_controller(state, alive), 15, "a new quorum leader after kill -9"
    )
    elapsed = time.monotonic() - t0
    print(f"quorum failover: {elapsed:.2f}s")
    assert new != leader and new_view["epoch"] > first_epoch
    assert new_view["high_watermark"] > committed  # nothing committed lost, a new epoch start
    # fetch timeout (1 s) + one randomized election (<= 2 x 0.5 s) + a generous margin
    assert elapsed < 1.0 + 1.0 + 5, f"quorum failover took {elapsed:.1f}s"

    state.restart(leader)
    alive = [0, 1, 2]
    _, back = await wait_for(
        lambda: active_controller(state, alive), 15, "the restarted voter following"
    )
    views = await quorum_views(state, alive)
    assert views[leader]["role"] == "follower"
    assert views[leader]["high_watermark"] >= new_view["high_watermark"]

    status = await trio.to_thread.run_sync(gather_status, state)  # it runs its own trio
    assert status["quorum"]["active_controller"] == back["leader_id"]
    assert "controller quorum: active controller" in render_status(status)

    # Restart every broker: each comes back from quorum-state + metadata log on disk.
    before = {b: v["log_end_offset"] for b, v in views.items()}
    state.stop_all()
    state.start_all()
    _, after = await wait_for(
        lambda: active_controller(state, alive), 20, "a quorum leader after restarting all"
    )
    assert after["epoch"] > back["epoch"]  # epochs never restart from zero
    assert after["log_end_offset"] > max(before.values())


async def test_a_cleanly_stopped_quorum_leader_hands_over_at_once(cluster_factory):
    """SIGTERM: the leader resigns with EndQuorumEpoch. With a 60 s fetch timeout nobody
    would start an election for a minute otherwise; a new leader shows up within seconds."""
    state = await cluster_factory(3, {**QUORUM, "controller.quorum.fetch.timeout.ms": 60000})
    alive = [0, 1, 2]
    leader, view = await wait_for(lambda: active_controller(state, alive), 15, "a quorum leader")
    state.stop(leader)
    alive.remove(leader)
    new, new_view = await wait_for(
        lambda: active_controller(state, alive), 15, "a successor after a clean stop"
    )
    assert new != leader and new_view["epoch"] > view["epoch"]
    log = (state.data_dir / f"broker-{leader}" / "broker.log").read_text()
    assert "quorum_resigning" in log


async def test_active_controller_killed_the_cluster_goes_on_and_metadata_survives(
    cluster_factory,
):
    """kill -9 the active controller, whichever broker it is: a new one is active within the
    quorum's timeouts, topics can be created, a partition leader killed afterwards fails
    over, every acknowledged acks=all record is read back once; then metadata survives a
    restart of every broker. Five voters, so two kills leave a majority."""
    config = {
        **QUORUM,
        "broker.session.timeout.ms": 2000,
        "broker.heartbeat.interval.ms": 200,
        "min.insync.replicas": 2,
    }
    state = await cluster_factory(5, config)
    alive = [0, 1, 2, 3, 4]
    controller, _ = await wait_for(lambda: active_controller(state, alive), 15, "a controller")
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic("before", 5, 3)])
    acked: dict[tuple[int, int], bytes] = {}
    producer_settings = {"request.timeout.ms": 3000, "delivery.timeout.ms": 30000}

    async def write(tag: str, count: int, bootstrap: str, partitions=range(5)) -> None:
        async with Producer(bootstrap, acks="all", **producer_settings) as producer:
            for i in range(count):
                value = f"{tag}{i}".encode()
                partition = partitions[i % len(partitions)]
                meta = await producer.send("before", value, partition=partition)
                acked[(meta.partition, meta.offset)] = value

    await write("a", 50, state.bootstrap)

    state.kill(controller)
    t0 = time.monotonic()
    alive.remove(controller)
    survivors = ",".join(f"{state.host}:{state.port(b)}" for b in alive)
    new, _ = await wait_for(lambda: active_controller(state, alive), 15, "a new controller")
    active_s = time.monotonic() - t0

    async def create_after() -> bool:
        try:
            async with Admin(survivors) as admin:
                result = await admin.create_topics([NewTopic("after", 2, 2)], raise_errors=False)
        except KafkaError:  # a client whose metadata still names the dead controller
            return False
        return result["after"] is None

    await wait_for(create_after, 15, "topics create on the new controller")
    create_s = time.monotonic() - t0
    print(f"controller failover: active {active_s:.2f}s, topic created {create_s:.2f}s")
    assert new != controller
    # fetch timeout (1 s) + one randomized election (<= 2 x 0.5 s) + 1 s
    assert active_s < 1.0 + 1.0 + 1.0, f"new active controller after {active_s:.1f}s"

    await write("b", 20, survivors)
    async with Admin(survivors) as admin:
        parts = (await admin.describe_topics(["before"]))["before"].partitions
    index, victim = next(
        (i, p.leader)
        for i, p in enumerate(parts)
        if p.leader in alive and len([r for r in p.isr if r in alive]) >= 3
    )
    state.kill(victim)
    alive.remove(victim)
    survivors = ",".join(f"{state.host}:{state.port(b)}" for b in alive)

    async def moved() -> bool:
        async with Admin(survivors) as admin:
            p = (await admin.describe_topics(["before"]))["before"].partitions[index]
        return p.leader in alive

    await wait_for(moved, 15, "the killed leader's partition to fail over")
    # Two of five brokers are down: only partitions with two live ISR members take acks=all.
    await write("c", 20, survivors, [index])

    # Restart every broker: topics, partitions and leaders come back from the metadata log.
    state.restart(controller)
    state.restart(victim)
    state.stop_all()
    state.start_all()
    alive = [0, 1, 2, 3, 4]
    await wait_for(lambda: active_controller(state, alive), 20, "a controller after restart")

    async def topics_back() -> bool:
        async with Admin(state.bootstrap) as admin:
            described = await admin.describe_topics(["before", "after"])
        return [len(described[t].partitions) for t in ("before", "after")] == [5, 2] and all(
            p.leader >= 0 for p in described["before"].partitions
        )

    await wait_for(topics_back, 30, "metadata to survive a restart of every broker")

    # Read back once every broker is up again: a partition whose live ISR members were
    # both killed is offline (not lost) until one returns, and after a restart of every
    # broker a leader's high watermark starts from its checkpoint and reaches the acked
    # records once its ISR followers fetch again (Kafka's restart behaviour).
    needed = {p: 1 + max(o for (q, o) in acked if q == p) for p in {q for q, _ in acked}}

    async def high_watermarks_back() -> bool:
        async with Consumer(state.bootstrap) as consumer:
            ends = await consumer.end_offsets([("before", p) for p in needed])
        return all(ends[("before", p)] >= n for p, n in needed.items())

    await wait_for(high_watermarks_back, 20, "high watermarks to cover every acked record")

    async def read_all() -> list:
        async with Consumer(state.bootstrap) as consumer:
            consumer.assign([("before", p) for p in range(5)])
            consumer.seek_to_beginning()
            ends = await consumer.end_offsets([("before", p) for p in range(5)])
            got: list = []
            while len(got) < sum(ends.values()):
                records = await consumer.poll(timeout_ms=3000)
                assert records, f"only {len(got)} of {sum(ends.values())} records readable"
                got += records
        return got

    records = await read_all()
    by_key = {(r.partition, r.offset): r.value for r in records}
    assert all(by_key.get(key) == value for key, value in acked.items())
    values = [r.value for r in records]
    assert all(values.count(v) == 1 for v in acked.values())


async def test_a_data_dir_from_before_the_quorum_keeps_its_topics(broker_factory, tmp_path):
    """Upgrading: the old controller's cluster-metadata.json is imported into the empty
    metadata log once, epochs kept, so no topic is forgotten."""
    data = tmp_path / "old"
    data.mkdir()
    legacy = ClusterMetadata(
        controller_id=0,
        epoch=9,
        brokers={0: BrokerInfo(0, "127.0.0.1", 1)},
        topics={"kept": TopicState("kept", [PartitionState(0, 4, [0], [0], 6)])},
    )
    save_metadata(data / METADATA_FILE, legacy)
    proc = broker_factory(data_dir=data)
    async with Admin(proc.address) as admin:
        part = (await admin.describe_topics(["kept"]))["kept"].partitions[0]
    assert (part.leader, part.leader_epoch) == (0, 4)
    async with Producer(proc.address, acks="all") as producer:
        assert (await producer.send("kept", b"after the upgrade")).offset == 0
    # Imported once: a restart reads the topic back from the metadata log.
    proc.stop()
    proc = broker_factory(data_dir=data)
    async with Admin(proc.address) as admin:
        assert "kept" in await admin.list_topics()


async def test_a_paused_voter_resumed_deposes_nobody(cluster_factory):
    """Issue 25 1b: SIGSTOP a non-leader voter past its fetch timeout, then SIGCONT.

    Pre-vote (KIP-996) with check-quorum: the resumed voter asks first, the leader and the
    follower still fetching from it refuse, and it goes back to following the same leader:
    the quorum epoch and the active controller do not move (before: +4 epochs, ~1.1 s with
    no controller). Two cycles: each voter other than the leader is paused once.
    """
    fetch_timeout = QUORUM["controller.quorum.fetch.timeout.ms"]
    state = await cluster_factory(3, QUORUM)
    brokers = [0, 1, 2]
    leader, view = await wait_for(lambda: active_controller(state, brokers), 15, "a leader")
    epoch = view["epoch"]
    for voter in [b for b in brokers if b != leader]:
        log = state.root / f"broker-{voter}" / "broker.log"
        asked_before = log.read_text().count("role=prospective")
        state.signal(voter, signal.SIGSTOP)
        try:

            async def paused_past_its_fetch_timeout(voter=voter):
                ages = (await broker_stats(state, leader))["quorum"]["voter_fetch_age_ms"]
                # its own timer ran from its last answered fetch: at most a long poll
                # (fetch_max_wait 500 ms) after its last request, plus a quarter of jitter
                return ages[str(voter)] > 2 * fetch_timeout + 500

            await wait_for(paused_past_its_fetch_timeout, 20, f"voter {voter} missing fetches")
        finally:
            state.signal(voter, signal.SIGCONT)

        async def following_again(voter=voter):
            v = (await quorum_views(state, [voter])).get(voter)
            return v is not None and v["role"] == "follower" and v["leader_id"] == leader

        await wait_for(following_again, 15, f"voter {voter} following {leader} again")
        asked = log.read_text().count("role=prospective") - asked_before
        print(f"voter {voter} resumed: {asked} pre-vote round(s), then followed {leader}")
        now = await wait_for(lambda: active_controller(state, brokers), 15, "the controller")
        assert now[0] == leader and now[1]["epoch"] == epoch, (
            f"resuming voter {voter} moved the quorum: epoch {epoch} -> {now[1]['epoch']}, "
            f"controller {leader} -> {now[0]}"
        )
