"""The purgatory: a hierarchical timing wheel run by a timer thread, and watcher lists.

Knows nothing of sockets or trio; the broker hands expired batches to its loop. One
small class a module, named after Kafka's (seed 003 walks through Kafka's code):

=====================================  ==============================================
here                                   Kafka (server/util/timer, DelayedOperation*)
=====================================  ==============================================
``TimerTask`` (bucket.py)              TimerTask and TimerTaskEntry in one object: a
                                       task carries its own links, expiration, timer
``Bucket`` (bucket.py)                 TimerTaskList: ``add``, ``remove``, ``flush``,
                                       ``set_expiration``; ``take_all`` is flush's
                                       unlink-all, returned as a list
``TimingWheel`` (wheel.py)             TimingWheel: ``add``, ``advance_clock``,
                                       overflow wheels made on demand
``TimerEngine`` (engine.py)            SystemTimer's core: the wheel, the DelayQueue
                                       (a heap of buckets), ``add`` =
                                       addTimerTaskEntry, ``advance`` = advanceClock
                                       (``bucket.flush(self.add)``)
``Timer`` (timer.py)                   Timer (the trait): add, remove, advance, size,
                                       shutdown
``SystemTimer`` (system_timer.py)      SystemTimer + its reaper thread; other threads
                                       hand it adds and removes through deques
``ManualTimer`` (manual_timer.py)      MockTimer: the engine, driven by a ManualClock
``ManualClock``, ``MonotonicClock``    MockTime, Time.SYSTEM (hiResClockMs)
(clock.py)
``deliver``, ``run_inline``            the taskExecutor: expired tasks go out in one
(delivery.py)                          batch per owner per wake-up
``DelayedOperation`` (operation.py)    DelayedOperation: ``force_complete`` is the one
                                       completion claim (Kafka: ``completed``
                                       AtomicBoolean), ``try_complete``,
                                       ``on_complete``, ``on_expiration``, ``run``
``Watchers`` (watchers.py)             Watchers: the ops watched on one key
``Purgatory`` (purgatory.py)           DelayedOperationPurgatory:
                                       ``try_complete_else_watch``,
                                       ``check_and_complete``, ``cancel_for_key``,
                                       the estimated-count purge (its expiration
                                       reaper is the timer's hand-off, ``expire_batch``)
``DeadlinePurgatory``,                 (ours) an op whose deadline keeps moving later:
``DeadlineOperation`` (deadline.py)    ``extend`` is a store, expiry re-arms it
=====================================  ==============================================
"""

from minibroker.broker.common.clock import Clock, ManualClock, MonotonicClock
from minibroker.broker.purgatory.bucket import Bucket, TimerTask
from minibroker.broker.purgatory.deadline import DeadlineOperation, DeadlinePurgatory
from minibroker.broker.purgatory.delivery import run_inline
from minibroker.broker.purgatory.manual_timer import ManualTimer
from minibroker.broker.purgatory.operation import DelayedOperation
from minibroker.broker.purgatory.purgatory import Purgatory
from minibroker.broker.purgatory.system_timer import SystemTimer, switch_interval_for
from minibroker.broker.purgatory.timer import Timer
from minibroker.broker.purgatory.watchers import Watchers
from minibroker.broker.purgatory.wheel import TimingWheel

__all__ = [
    "Bucket",
    "Clock",
    "DeadlineOperation",
    "DeadlinePurgatory",
    "DelayedOperation",
    "ManualClock",
    "ManualTimer",
    "MonotonicClock",
    "Purgatory",
    "SystemTimer",
    "Timer",
    "TimerTask",
    "TimingWheel",
    "Watchers",
    "run_inline",
    "switch_interval_for",
]
