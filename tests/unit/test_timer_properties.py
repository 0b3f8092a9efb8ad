"""Property tests: any schedule of adds, cancels and clock moves, on the manual clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.purgatory import ManualClock, ManualTimer, TimerTask


class Probe(TimerTask):
    __slots__ = ("added_at", "fired", "now")

    def __init__(self, delay_ms: int, now) -> None:
        super().__init__(delay_ms)
        self.now = now
        self.fired: list[int] = []

    def run(self) -> None:
        self.fired.append(self.now())


steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(-3, 3000)),
        st.tuples(st.just("cancel"), st.integers(0, 10_000)),
        st.tuples(st.just("advance"), st.integers(0, 700)),
    ),
    max_size=120,
)


def _replay(tick_ms: int, wheel_size: int, start_ms: int, schedule) -> None:
    clock = ManualClock(start_ms)
    timer = ManualTimer(clock, tick_ms=tick_ms, wheel_size=wheel_size)
    tasks: list[Probe] = []
    cancelled: set[int] = set()
    for action, value in schedule:
        if action == "add":
            task = Probe(value, clock.now_ms)
            task.added_at = clock.now_ms()
            tasks.append(task)
            timer.add(task)
        elif action == "cancel" and tasks:
            index = value % len(tasks)
            if not tasks[index].fired:
                tasks[index].cancel()
                cancelled.add(index)
        else:
            clock.advance(value)
        now = clock.now_ms()
        live = [t for i, t in enumerate(tasks) if i not in cancelled and not t.fired]
        assert timer.size == len(live)
        for i, task in enumerate(tasks):
            deadline = task.added_at + task.delay_ms
            if i in cancelled and not task.fired:
                continue
            if task.fired:
                assert len(task.fired) == 1
                # Kafka's tick rule: with tick 1 never early; with a coarser tick at most
                # tick - 1 ms early (bucket = floor(exp / tick) * tick).
                assert task.fired[0] >= deadline - (tick_ms - 1)
            else:
                # Once the clock is a tick past the deadline, the task has run.
                assert now < max(deadline, task.added_at) + tick_ms
    clock.advance(10_000_000)
    for i, task in enumerate(tasks):
        assert len(task.fired) == (0 if i in cancelled else 1)
    assert timer.size == 0


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 8), st.integers(0, 10_000), steps)
def test_every_live_task_fires_once_on_time_tick1(wheel_size, start_ms, schedule):
    _replay(1, wheel_size, start_ms, schedule)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 7), st.integers(2, 6), st.integers(0, 10_000), steps)
def test_coarse_tick_bounds(tick_ms, wheel_size, start_ms, schedule):
    _replay(tick_ms, wheel_size, start_ms, schedule)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 400), min_size=1, max_size=200))
def test_fires_exactly_at_deadline_when_clock_steps_by_one(delays):
    clock = ManualClock(0)
    timer = ManualTimer(clock, tick_ms=1, wheel_size=4)
    tasks = [Probe(d, clock.now_ms) for d in delays]
    for task in tasks:
        timer.add(task)
    while timer.next_expiration() is not None:
        clock.advance(1)
    assert all(task.fired == [task.delay_ms] for task in tasks)
