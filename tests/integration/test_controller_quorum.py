"""The metadata quorum in real broker processes: election, failover, restart from disk.

Every broker of `cluster up` is a voter; these tests read each one's quorum view from its
BROKER_STATS and kill -9 whichever broker leads the quorum, never assuming it is broker 0.
"""

from __future__ import annotations

import time

import pytest
import trio

from deploy.cluster_ops import gather_status, render_status

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
    assert "controller quorum: leader" in render_status(status)

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
