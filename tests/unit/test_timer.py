"""Kafka's TimerTest, TimerTaskListTest and SystemTimerReaperTest, on the manual clock
where possible; tests of the real thread wait on an Event with a generous bound."""

from __future__ import annotations

import threading

import pytest

from minibroker.broker.purgatory import (
    Bucket,
    ManualClock,
    ManualTimer,
    SystemTimer,
    Timer,
    TimerTask,
    TimingWheel,
)
from minibroker.broker.purgatory.engine import TimerEngine
from minibroker.broker.purgatory.system_timer import DRAIN_BATCH, switch_interval_for
from tests.waiting import wait_until

BOUND_S = 10.0  # generous: these waits normally end within milliseconds


class Recorder(TimerTask):
    __slots__ = ("done", "key", "latch", "out")

    def __init__(self, delay_ms: int, key, out: list, latch: threading.Event | None = None):
        super().__init__(delay_ms)
        self.key = key
        self.out = out
        self.latch = latch

    def run(self) -> None:
        self.out.append(self.key)
        if self.latch is not None:
            self.latch.set()


class CountDown:
    def __init__(self, n: int) -> None:
        self.n = n
        self.lock = threading.Lock()
        self.event = threading.Event()
        if n == 0:
            self.event.set()

    def set(self) -> None:
        with self.lock:
            self.n -= 1
            if self.n == 0:
                self.event.set()


# --- TimerTest (tick 1, wheel 3: overflow wheels are exercised) -------------------------


def test_already_expired_task_manual():
    timer = ManualTimer(ManualClock(1000), tick_ms=1, wheel_size=3)
    out: list[int] = []
    for delay in range(-5, 0):
        timer.add(Recorder(delay, delay, out))
    # MockTimer runs already-due tasks inline at add.
    assert sorted(out) == [-5, -4, -3, -2, -1]
    assert timer.size == 0


def test_task_expiration_manual():
    clock = ManualClock(1000)
    timer = ManualTimer(clock, tick_ms=1, wheel_size=3)
    fired: list[tuple[int, int]] = []

    class Stamp(TimerTask):
        __slots__ = ("key",)

        def __init__(self, delay_ms: int) -> None:
            super().__init__(delay_ms)
            self.key = delay_ms

        def run(self) -> None:
            fired.append((self.key, clock.now_ms() - 1000))

    ids = list(range(5)) + [i for i in range(10, 100) for _ in (0, 1)] + list(range(100, 500))
    for i in ids:
        timer.add(Stamp(i))
    while timer.next_expiration() is not None:
        clock.advance(1)
    assert sorted(key for key, _ in fired) == sorted(ids)
    # tick 1: each task runs at exactly its deadline (delay 0 runs inline at add).
    assert all(at == key for key, at in fired)
    assert timer.size == 0


def test_already_expired_task_system_timer():
    out: list[int] = []
    latch = CountDown(5)
    with SystemTimer(tick_ms=1, wheel_size=3) as timer:
        for delay in range(-5, 0):
            timer.add(Recorder(delay, delay, out, latch))
        assert latch.event.wait(BOUND_S)
    assert sorted(out) == [-5, -4, -3, -2, -1]


def test_task_expiration_system_timer():
    out: list[int] = []
    ids = list(range(5)) + [i for i in range(10, 60) for _ in (0, 1)] + list(range(60, 120))
    latch = CountDown(len(ids))
    with SystemTimer(tick_ms=1, wheel_size=3) as timer:
        for i in ids:
            timer.add(Recorder(i, i, out, latch))
        assert latch.event.wait(BOUND_S)
        assert timer.size == 0
    assert sorted(out) == sorted(ids)


# --- TimerTaskListTest ------------------------------------------------------------------


def _members(bucket: Bucket) -> list[TimerTask]:
    """Walk the circular list from its sentinel (the bucket), checking the back links."""
    out = []
    node = bucket._next
    while node is not bucket:
        assert node._next._prev is node and node._bucket is bucket
        out.append(node)
        node = node._next
    return out


def test_task_list_shared_counter_and_moves():
    counter = [0]
    list1, list2, list3 = Bucket(counter), Bucket(counter), Bucket(counter)
    tasks = [TimerTask(10) for _ in range(10)]
    for task in tasks:
        list1.add(task)
    assert counter[0] == 10 and _members(list1) == tasks
    # Re-adding moves a task: never duplicated, counter unchanged.
    for task in tasks[:4]:
        list2.add(task)
    for task in tasks[4:]:
        list3.add(task)
    assert counter[0] == 10
    assert (_members(list1), _members(list2), _members(list3)) == ([], tasks[:4], tasks[4:])
    list1.remove(tasks[0])  # not in list1: no effect
    assert counter[0] == 10 and _members(list2) == tasks[:4]
    for task in tasks[::2]:
        task.unlink()
    for task in tasks[1::2]:
        (list2 if task in tasks[:4] else list3).remove(task)
    task.unlink()  # already unlinked: no effect
    assert counter[0] == 0
    assert (_members(list1), _members(list2), _members(list3)) == ([], [], [])


def test_bucket_expiration_set_once_per_rotation():
    bucket = Bucket([0])
    assert bucket.set_expiration(10) is True
    assert bucket.set_expiration(10) is False
    bucket.flush(lambda task: None)
    assert bucket.expiration == -1
    assert bucket.set_expiration(30) is True


def test_bucket_flush_applies_to_every_task_in_order_and_empties_it():
    """Kafka's flush hands over done tasks too: its function (addTimerTaskEntry) drops them.
    Ours calls the function once, with the whole list."""
    counter = [0]
    bucket = Bucket(counter)
    tasks = [TimerTask(1) for _ in range(3)]
    for task in tasks:
        bucket.add(task)
    tasks[1].cancel()
    seen = []
    bucket.flush(seen.append)
    assert seen == [tasks] and counter[0] == 0 and _members(bucket) == []
    assert all(t._bucket is None and t._prev is None for t in tasks)
    bucket.add(tasks[0])  # the emptied sentinel links again
    assert _members(bucket) == [tasks[0]] and counter[0] == 1


# --- TimingWheel rules (reference §1) ----------------------------------------------------


def test_wheel_add_rules_and_lazy_overflow():
    wheel = TimingWheel(tick_ms=1, wheel_size=20, start_ms=0)
    cancelled = TimerTask(5)
    cancelled.cancel()
    cancelled.expiration_ms = 5
    assert wheel.add(cancelled) is None
    due = TimerTask(0)
    due.expiration_ms = 0
    assert wheel.add(due) is None  # exp < current + tick
    near = TimerTask(5)
    near.expiration_ms = 5
    assert wheel.add(near) is near._bucket
    assert near._bucket.expiration == 5 and wheel.overflow is None
    far = TimerTask(222)
    far.expiration_ms = 222
    assert wheel.add(far) is far._bucket
    # 222 >= 20 and >= 400? no: lands in the second level (tick 20), bucket 220.
    assert wheel.overflow is not None and wheel.overflow.tick_ms == 20
    assert far._bucket.expiration == 220
    assert wheel.counter[0] == 2
    assert sorted(e for e, _ in wheel.queue) == [5, 220]


def test_wheel_advance_clock_is_lazy_and_aligned():
    wheel = TimingWheel(tick_ms=10, wheel_size=4, start_ms=37)
    assert wheel.current_ms == 30
    wheel.advance_clock(35)  # less than one tick: no move
    assert wheel.current_ms == 30
    wheel.advance_clock(57)
    assert wheel.current_ms == 50


# --- SystemTimer: thread behaviour -------------------------------------------------------


def test_batches_reach_owner_callback_from_timer_thread():
    batches: list[list] = []
    got = threading.Event()

    def expire_batch(batch):
        batches.append((threading.current_thread().name, list(batch)))
        got.set()

    clock = ManualClock(0)
    with SystemTimer(clock=clock, expire_batch=expire_batch, name="t1") as timer:
        tasks = [TimerTask(50) for _ in range(100)]
        for task in tasks:
            timer.add(task)
        tasks[0].cancel()
        clock.advance(49)
        assert not got.wait(0.05)
        clock.advance(1)
        assert got.wait(BOUND_S)
    (thread_name, batch), *rest = batches
    assert thread_name == "timer-t1" and rest == []
    assert batch == tasks[1:]


def test_idle_timer_does_not_wake():
    clock = ManualClock(0)
    with SystemTimer(clock=clock) as timer:
        ran = threading.Event()
        timer.add(Recorder(0, 0, [], ran))
        assert ran.wait(BOUND_S)
        before = timer.wakeups
        # No adds, no buckets: the thread sleeps without timeouts.
        threading.Event().wait(0.1)
        assert timer.wakeups == before


def test_adds_far_from_their_deadline_are_linked_in_batches():
    """A burst of long timeouts is linked every DRAIN_BATCH adds, not all at once when the
    first comes due (that one drain would hold up every expiry behind it)."""
    with SystemTimer() as timer:
        timer.add(TimerTask(60_000))
        wait_until(lambda: timer._engine.size == 1, BOUND_S, "the first add", poll=0.002)
        # Now asleep until the ~60 s bucket is due.
        for _ in range(DRAIN_BATCH - 1):
            timer.add(TimerTask(60_000))
        assert timer._engine.size == 1  # below the batch: no wake-up was asked for
        timer.add(TimerTask(60_000))
        wait_until(
            lambda: timer._engine.size == DRAIN_BATCH + 1, BOUND_S, "a batch linked", poll=0.002
        )
        assert timer.size == DRAIN_BATCH + 1


def test_close_does_not_run_pending_and_joins():
    out: list[int] = []
    timer = SystemTimer().start()
    for i in range(10):
        timer.add(Recorder(60_000, i, out))
    assert timer.size == 10
    timer.shutdown()
    assert not timer._thread.is_alive()
    assert out == []


def test_size_counts_live_tasks_and_cancel_leaves_at_once():
    timer = ManualTimer(ManualClock(0), wheel_size=4)
    tasks = [TimerTask(d) for d in (5, 50, 500, 5000)]
    for task in tasks:
        timer.add(task)
    assert timer.size == 4
    tasks[2].cancel()
    assert timer.size == 3
    timer.advance(5)
    assert timer.size == 2
    timer.advance(10_000)
    assert timer.size == 0


@pytest.mark.parametrize("delays", [(100, 200, 300)])
def test_reaper_expires_in_order(delays):
    """SystemTimerReaperTest.testReaper: tasks at 100/200/300 ms all time out."""
    out: list[int] = []
    latch = CountDown(len(delays))
    with SystemTimer() as timer:
        for d in delays:
            timer.add(Recorder(d, d, out, latch))
        assert latch.event.wait(BOUND_S)
    assert out == list(delays)


def test_switch_interval_is_one_tick_and_never_above_cpythons_default():
    assert switch_interval_for(1) == 0.001
    assert switch_interval_for(2) == 0.002
    assert switch_interval_for(50) == 0.005


# --- the Timer protocol and the engine ------------------------------------------------------


@pytest.mark.parametrize("kind", ["manual", "system"])
def test_both_timers_serve_the_timer_protocol(kind):
    """Purgatory uses only add, remove, size (and the broker shutdown): both timers give
    the same answers through them."""
    clock = ManualClock(0)
    out: list[int] = []
    timer: Timer = ManualTimer(clock) if kind == "manual" else SystemTimer(clock=clock).start()
    tasks = [Recorder(d, d, out) for d in (5, 5, 50)]
    for task in tasks:
        timer.add(task)
    timer.remove(tasks[1])
    wait_until(lambda: timer.size == 2, BOUND_S, "the remove", poll=0.002)
    if kind == "manual":
        assert timer.advance(4) is False and timer.advance(1) is True
    else:
        clock.advance(5)
        assert timer.advance(0) is True  # the thread runs: this only hurries it
    wait_until(lambda: out == [5], BOUND_S, "the first expiry", poll=0.002)
    assert timer.size == 1
    timer.shutdown()
    clock.advance(100)
    assert out == [5] and tasks[2].timer is timer  # shut down: the pending task never ran


def test_engine_links_runs_of_a_deadline_and_hands_out_what_is_due():
    """addTimerTaskEntry for many: tasks sharing a deadline go to one bucket in order;
    a due task goes to ``due``; a done task is dropped."""
    engine = TimerEngine(tick_ms=1, wheel_size=4, start_ms=100)
    tasks = [TimerTask(0) for _ in range(6)]
    for task, exp in zip(tasks, (102, 102, 100, 102, 130, 102), strict=True):
        task.expiration_ms = exp
    tasks[3].cancel()
    engine.add_all(tasks)
    assert engine.take_due() == [tasks[2]] and engine.size == 4
    assert tasks[0]._bucket is tasks[1]._bucket is tasks[5]._bucket
    assert _members(tasks[0]._bucket) == [tasks[0], tasks[1], tasks[5]]
    engine.advance(102)
    assert engine.take_due() == [tasks[0], tasks[1], tasks[5]]
    # 130 went to an overflow wheel (tick 4): its bucket is due at 128, then cascades.
    engine.advance(128)
    assert engine.take_due() == [] and engine.size == 1
    assert tasks[4]._bucket.whole  # now in the finest wheel
    engine.advance(130)
    assert engine.take_due() == [tasks[4]] and engine.size == 0
