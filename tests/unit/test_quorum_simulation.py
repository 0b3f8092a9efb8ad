"""Deterministic simulation of the KRaft core: many seeds, Raft's safety checked every step.

Env: QUORUM_SIM_SEEDS raises the seed count per voter count (default 200);
QUORUM_SIM_SEED (with QUORUM_SIM_VOTERS) replays one seed, as a failure message prints.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from minibroker.broker.raft import KafkaRaftClient, VoteRequest
from tests.unit.quorum_checker import SafetyViolation
from tests.unit.quorum_sim import CONFIG, Simulation, run_seed

SEEDS = int(os.environ.get("QUORUM_SIM_SEEDS", "200"))
ONE_SEED = os.environ.get("QUORUM_SIM_SEED")


def seeds_for(voters: int) -> list[int]:
    if ONE_SEED is not None:
        only = int(os.environ.get("QUORUM_SIM_VOTERS", voters))
        return [int(ONE_SEED)] if only == voters else []
    return list(range(SEEDS))


@pytest.mark.parametrize("voters", [3, 5])
def test_many_seeds(voters):
    seeds = seeds_for(voters)
    if not seeds:
        pytest.skip("replaying a seed for another voter count")
    exercised: Counter[str] = Counter()
    for seed in seeds:
        exercised += run_seed(seed, voters).stats  # raises with the seed and replay command
    if ONE_SEED is None:
        # The faults really happened, so passing means something.
        for what in ("crash", "truncate", "snapshot_installed", "resigned", "leader"):
            assert exercised[what] > 0, f"no seed exercised {what}: {exercised}"


def test_a_seed_replays_exactly():
    a, b = run_seed(11, 5), run_seed(11, 5)
    assert a.stats == b.stats and list(a.trace) == list(b.trace)
    assert a.checker.committed == b.checker.committed


class VotesWithoutLogCheck(KafkaRaftClient):
    """A planted bug: grant votes without Raft's election restriction (log up to date)."""

    def log_is_up_to_date(self, req: VoteRequest) -> bool:
        return True


class ForgetsVotesOnCrash(KafkaRaftClient):
    """A planted bug: a vote for another voter is granted but never made durable."""

    def _persist(self, epoch: int, leader_id: int | None, voted_id: int | None) -> None:
        if leader_id is None and voted_id not in (None, self.node_id):
            return
        super()._persist(epoch, leader_id, voted_id)


def first_failure(client_class: type[KafkaRaftClient], voters: int, seeds: int) -> str:
    for seed in range(seeds):
        try:
            run_seed(seed, voters, client_class)
        except SafetyViolation as exc:
            return str(exc)
    raise AssertionError(f"{seeds} seeds of {client_class.__name__} passed the checker")


def test_the_checker_catches_a_stale_leader():
    failure = first_failure(VotesWithoutLogCheck, 5, seeds=50)
    assert "leader completeness" in failure or "log matching" in failure
    assert "QUORUM_SIM_SEED=" in failure


def test_the_checker_catches_a_vote_lost_in_a_crash():
    """Only crashes between effects and quick restarts expose this one: the fault model works."""
    failure = first_failure(ForgetsVotesOnCrash, 3, seeds=1500)
    assert "election safety" in failure or "IllegalStateError" in failure


def settle(sim: Simulation, within_ms: int = 10_000) -> int:
    end = sim.clock.now_ms() + within_ms
    while sim.clock.now_ms() < end:
        sim.run_until(sim.clock.now_ms() + 50)
        leader = sim.stable_leader()
        if leader is not None:
            return leader
    raise AssertionError(f"no stable leader: {sim.roles()}")


def test_an_isolated_leader_resigns_and_the_majority_goes_on():
    sim = Simulation(seed=3, voters=5)
    old = settle(sim)
    old_epoch = sim.nodes[old].core.epoch
    others = [i for i in sim.ids if i != old]
    sim.net.blocked = {(old, i) for i in others} | {(i, old) for i in others}
    sim.run_until(sim.clock.now_ms() + CONFIG.check_quorum_timeout_ms + 50)
    assert sim.nodes[old].core.role != "leader"  # stopped acting: no split brain
    with pytest.raises(Exception, match="NOT_LEADER_OR_FOLLOWER"):
        sim.nodes[old].core.append([b"from the minority"])
    new_leaders = [n for n in others if sim.nodes[n].core.role == "leader"]
    assert len(new_leaders) == 1 and sim.nodes[new_leaders[0]].core.epoch > old_epoch
    committed_offset = sim.client_append()
    sim.net.blocked.clear()
    settle(sim)
    sim.run_until(sim.clock.now_ms() + 2_000)
    assert sim.nodes[old].applied > committed_offset  # rejoined and caught up
