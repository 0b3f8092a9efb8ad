"""The paced producer of `bench kafka-clients`: the clock's schedule, caught up in bursts."""

from __future__ import annotations

import pytest

from minibroker.deploy.bench.kafka_clients import paced


class FakeTime:
    """A clock that moves only when the bench waits or produces."""

    def __init__(self, produce_s: float = 0.0, late_once_s: float = 0.0) -> None:
        self.now = 100.0
        self.produce_s = produce_s
        self.late_once_s = late_once_s  # one wake-up this late: a descheduled client
        self.produced: list[tuple[int, float]] = []
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    def produce(self, i: int) -> None:
        self.produced.append((i, self.now))
        self.now += self.produce_s

    def wait(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds + self.late_once_s
        self.late_once_s = 0.0


def test_every_record_goes_at_its_due_time_and_the_rate_is_held():
    t = FakeTime()
    figures = paced(t.produce, t.wait, 1000, 10_000, t.clock)
    assert [i for i, _ in t.produced] == list(range(1000))
    # Never before its due time (start + i / rate), and the wait is the 1 ms floor at most.
    assert all(at >= 100.0 + i / 10_000 - 1e-9 for i, at in t.produced)
    assert max(t.waits) == pytest.approx(0.001)
    assert figures["rate_achieved"] == pytest.approx(10_000, rel=0.002)
    assert figures["held"] is True
    assert figures["lateness_ms_max"] <= 1.0


def test_a_late_wake_up_is_made_up_in_one_burst_not_lost():
    t = FakeTime(late_once_s=0.2)  # the first wait returns 200 ms late
    figures = paced(t.produce, t.wait, 5000, 10_000, t.clock)
    burst = [i for i, at in t.produced if at == t.produced[1][1]]
    assert len(burst) >= 2000  # everything due during the 200 ms went at once
    assert len(t.produced) == 5000 and figures["held"] is True
    assert figures["lateness_ms_max"] >= 199.0  # and the figures say it was late


def test_a_client_too_slow_for_the_rate_is_reported_as_not_holding_it():
    t = FakeTime(produce_s=2 / 10_000)  # each produce() takes two records' worth of time
    figures = paced(t.produce, t.wait, 2000, 10_000, t.clock)
    assert figures["held"] is False
    assert figures["rate_achieved"] == pytest.approx(5_000, rel=0.01)
    assert t.waits == []  # behind its schedule, it never waits
