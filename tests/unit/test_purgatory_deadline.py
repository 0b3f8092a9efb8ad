"""Lazy deadlines (purgatory/deadline.py) on the manual clock: a moved deadline is kept
exactly, a real expiry is never early or late, and the timer is re-armed, not refilled."""

from __future__ import annotations

import pytest

from minibroker.broker.purgatory import (
    DeadlineOperation,
    DeadlinePurgatory,
    ManualClock,
    ManualTimer,
    MonotonicClock,
    SystemTimer,
)
from minibroker.broker.purgatory.deadline import REARM_GRID_MS


class Session(DeadlineOperation):
    __slots__ = ("clock", "expired_at")

    def __init__(self, delay_ms: int, clock: ManualClock) -> None:
        super().__init__(delay_ms)
        self.clock = clock
        self.expired_at: int | None = None

    def on_expiration(self) -> None:
        self.expired_at = self.clock.now_ms()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(0)


@pytest.fixture
def purgatory(clock: ManualClock) -> DeadlinePurgatory:
    return DeadlinePurgatory("Heartbeat", ManualTimer(clock))


def watch(purgatory: DeadlinePurgatory, clock: ManualClock, delay_ms: int) -> Session:
    op = Session(delay_ms, clock)
    assert purgatory.try_complete_else_watch(op, ["member"]) is False
    return op


def test_an_op_never_extended_expires_at_its_delay(purgatory, clock):
    op = watch(purgatory, clock, 6000)
    clock.advance(5999)
    assert op.expired_at is None
    clock.advance(1)
    assert op.expired_at == 6000


def test_each_extension_moves_the_expiry_to_the_last_deadline(purgatory, clock):
    op = watch(purgatory, clock, 6000)
    for _ in range(20):  # a heartbeat a second for 20 s
        clock.advance(1000)
        assert purgatory.extend_by(op, 6000)
    last = clock.now_ms()
    clock.advance(6000 - 1)
    assert op.expired_at is None and not op.is_completed
    clock.advance(1)
    assert op.expired_at == last + 6000
    stats = purgatory.stats()
    assert stats["expired"] == 1 and stats["pending"] == 0


def test_re_arms_gather_on_the_grid_until_the_deadline_is_near(purgatory, clock):
    op = watch(purgatory, clock, 1000)
    deadline = 30 * REARM_GRID_MS + 37
    assert purgatory.extend_by(op, deadline)
    clock.advance(1000)  # the original expiration: re-armed for the grid instant
    assert op.expiration_ms == deadline - 37
    clock.advance(op.expiration_ms - clock.now_ms())  # then for the deadline itself
    assert op.expiration_ms == deadline and op.expired_at is None
    clock.advance(37)
    assert op.expired_at == deadline
    assert purgatory.stats()["rearmed"] == 2  # the grid instant, then the deadline


def test_an_earlier_deadline_or_a_completed_op_cannot_be_extended(purgatory, clock):
    op = watch(purgatory, clock, 300_000)
    assert not purgatory.extend_by(op, 6000)  # the timer would fire 294 s late: replace it
    assert op.force_complete()
    assert not purgatory.extend_by(op, 400_000)
    clock.advance(400_000)
    assert op.expired_at is None


def test_a_completion_between_expiry_and_re_arm_wins(clock):
    """The timer hands the op over; it completes before the owner thread gets to it."""
    batches: list[list] = []
    purgatory = DeadlinePurgatory("Heartbeat", ManualTimer(clock), expiry_handoff=batches.append)
    op = watch(purgatory, clock, 1000)
    assert purgatory.extend_by(op, 5000)
    clock.advance(1000)
    assert batches == [[op]]
    assert op.force_complete()
    assert purgatory.expire_batch(batches.pop()) == 0
    clock.advance(10_000)
    assert batches == [] and op.expired_at is None


def test_extend_by_reads_the_monotonic_clock_itself():
    """The heartbeat path's clock read is inlined for MonotonicClock: it must agree."""
    clock = MonotonicClock()
    timer = SystemTimer(clock=clock)  # never started: adds only queue
    purgatory = DeadlinePurgatory("Heartbeat", timer)
    op = Session(300_000, ManualClock())
    assert purgatory.try_complete_else_watch(op, ["member"]) is False
    before = clock.now_ms()
    assert purgatory.extend_by(op, 310_000)
    assert before + 310_000 <= op.deadline_ms <= clock.now_ms() + 310_000
    assert not purgatory.extend_by(op, 1000)  # earlier than the timer's expiration


class BusyClock(ManualClock):
    """Each reading finds the clock ``step`` ms on: time passes while a batch is handled."""

    def __init__(self) -> None:
        super().__init__(0)
        self.step = 0

    def now_ms(self) -> int:
        self._now += self.step
        return self._now


def test_a_re_arm_for_the_deadline_lands_on_it_however_long_the_batch_took():
    """The timer adds a delay to its own reading of the clock: a delay taken from the
    batch's first reading would put each later op further past its deadline."""
    clock = BusyClock()
    batches: list[list] = []
    purgatory = DeadlinePurgatory("Heartbeat", ManualTimer(clock), expiry_handoff=batches.append)
    ops = [watch(purgatory, clock, 1000) for _ in range(5)]
    for op in ops:
        assert purgatory.extend_by(op, 1050)  # nearer the 1000 grid instant than the grid
    clock.advance(1000)
    clock.step = 1
    assert purgatory.expire_batch(batches.pop()) == 0
    # Re-armed for 1050, one reading (1 ms) late at most: the timer's own reading.
    assert [op.expiration_ms for op in ops] == [1051] * 5
