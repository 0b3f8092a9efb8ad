"""`minibroker bench quotas --sockets`, small: its figures come from real throttled
connections to a broker process."""

from __future__ import annotations

import argparse

import pytest

from minibroker.deploy.bench import quotas_sockets

pytestmark = pytest.mark.integration


def test_socket_bench_throttles_every_connection_and_times_the_answers():
    args = argparse.Namespace(
        sockets=60,
        socket_quota=128,
        record_bytes=256,
        warmup=2.0,
        spread_s=0.5,
        duration=3.0,
        bootstrap=None,
    )
    figures = quotas_sockets.measure(args)
    assert figures["errors"] == 0, figures["first_error"]
    # A 256 B record against 128 B/s: every connection is muted by its first answer's
    # throttle, so mid-run (nothing unmutes within 3 s of a multi-second throttle) all are.
    assert figures["throttled_at_once"] >= 54  # a few may be between answer and next read
    assert figures["throttle_ms_p50"] >= 1000
    assert figures["broker_unmute_lateness"]["count"] >= 1
    lateness = figures["answer_lateness_ms"]
    assert 0 <= lateness["p50"] <= lateness["p99"] <= lateness["max"]
    assert 0 <= figures["timer_thread_cpu_share"] < figures["broker_cpu_share"] + 0.01
