"""`minibroker bench startup` end to end, one round: its phases come from real starts."""

from __future__ import annotations

import argparse

import pytest

from minibroker.deploy.bench import startup

pytestmark = pytest.mark.integration


def test_startup_bench_times_each_phase_in_order():
    figures = startup.measure(argparse.Namespace(rounds=1, brokers=3))
    phases = [figures["phases_s"][phase]["median"] for phase in startup.PHASES]
    # Read from the brokers' own logs and from the launcher: registration and the first
    # ISR come after the quorum has a leader (a broker may log its registration after
    # the controller used it), and the first ack last of all (the end of a cold start).
    assert all(t > 0 for t in phases)
    assert phases[1] <= min(phases[2], phases[3]) and max(phases) == phases[4]
    assert figures["cold_start_s"]["median"] == phases[4]
    assert figures["fixture_setup_s"]["median"] > 0
    assert figures["fixture_teardown_s"]["median"] > 0
    assert figures["shared_reset_s"]["median"] > 0
    assert figures["cpus"] >= 1 and len(figures["load_average_before"]) == 3
