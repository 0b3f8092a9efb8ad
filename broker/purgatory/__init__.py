"""The purgatory: a hierarchical timing wheel run by a timer thread, and watcher lists.

Knows nothing of sockets or trio; the broker hands expired batches to its loop.
"""

from .bucket import Bucket, TimerTask
from .clock import Clock, ManualClock, MonotonicClock
from .delivery import run_inline
from .manual_timer import ManualTimer
from .operation import DelayedOperation
from .purgatory import Purgatory
from .system_timer import SystemTimer, switch_interval_for
from .wheel import TimingWheel

__all__ = [
    "Bucket",
    "Clock",
    "DelayedOperation",
    "ManualClock",
    "ManualTimer",
    "MonotonicClock",
    "Purgatory",
    "SystemTimer",
    "TimerTask",
    "TimingWheel",
    "run_inline",
    "switch_interval_for",
]
