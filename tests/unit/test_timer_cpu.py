"""SystemTimer.thread_cpu_s: the timer thread's own CPU clock, which stats and
`bench quotas --sockets` read to say what the timer costs apart from the loop."""

from __future__ import annotations

import time

from minibroker.broker.purgatory import SystemTimer, TimerTask
from tests.waiting import wait_until


class _Burn(TimerTask):
    """Runs on the timer thread (the default sink runs expired tasks inline)."""

    def __init__(self) -> None:
        super().__init__(1)
        self.done_burning = False

    def run(self) -> None:
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        self.done_burning = True


def test_thread_cpu_counts_the_timer_thread_and_not_the_caller():
    timer = SystemTimer(name="cpu")
    assert timer.thread_cpu_s() == 0.0  # not started
    timer.start()
    try:
        task = _Burn()
        timer.add(task)
        wait_until(lambda: task.done_burning, 10, "the task ran on the timer thread")
        assert timer.thread_cpu_s() >= 0.05
        # The caller burning its own CPU does not move the timer thread's clock.
        before = timer.thread_cpu_s()
        end = time.thread_time() + 0.1
        while time.thread_time() < end:
            pass
        assert timer.thread_cpu_s() - before < 0.05
    finally:
        timer.shutdown()
    assert timer.thread_cpu_s() == 0.0
