"""`minibroker bench longpoll` end to end, small: its figures come from real long polls."""

from __future__ import annotations

import argparse

import pytest

from minibroker.deploy.bench import longpoll

pytestmark = pytest.mark.integration


def test_longpoll_bench_expires_every_poll_and_wakes_every_connection():
    args = argparse.Namespace(
        connections=40,
        max_wait_ms=300,
        duration=1.5,
        client_processes=2,
        bootstrap=None,
        spread=False,
        topic="longpoll",
    )
    figures = longpoll.measure(args)
    assert figures["errors"] == 0, figures["first_error"]
    # Every connection was parked when the produce came, and each one was answered with it.
    assert figures["woken"] == 40
    # Nothing was produced during the timed part: every answer there is an expiry, never
    # early (an answer before max.wait.ms would be a fetch completing without data).
    assert figures["expiries"] >= 40
    assert figures["expiry_lateness_ms"]["p50"] >= 0
    assert figures["broker_fetch_purgatory"]["expired"] >= figures["expiries"]
    assert figures["broker_rss_mb"] > 0 and len(figures["client_cpu_percent"]) == 2
