"""Kafka's DelayedOperationTest behaviours, plus the estimated-count purge and races."""

from __future__ import annotations

import gc
import itertools
import random
import threading
import weakref

import pytest

from minibroker.broker.purgatory import (
    DelayedOperation,
    ManualClock,
    ManualTimer,
    Purgatory,
    SystemTimer,
    TimerTask,
    Watchers,
)

BOUND_S = 10.0


class MockOp(DelayedOperation):
    __slots__ = ("__weakref__", "completable", "completions", "data", "expirations")

    def __init__(self, delay_ms: int, data: object = None) -> None:
        super().__init__(delay_ms)
        self.completable = False
        self.completions = 0
        self.expirations = 0
        self.data = data

    def try_complete(self) -> bool:
        return self.completable and self.force_complete()

    def on_complete(self) -> None:
        self.completions += 1
        self.data = None  # drop heavy references (KAFKA-19389)

    def on_expiration(self) -> None:
        self.expirations += 1


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(0)


@pytest.fixture
def purgatory(clock: ManualClock) -> Purgatory:
    return Purgatory("mock", ManualTimer(clock), purge_interval=1000)


def test_request_satisfaction(purgatory: Purgatory):
    r1, r2 = MockOp(100_000), MockOp(100_000)
    assert purgatory.check_and_complete("test1") == 0
    assert purgatory.try_complete_else_watch(r1, ["test1"]) is False
    assert purgatory.check_and_complete("test1") == 0
    assert purgatory.try_complete_else_watch(r2, ["test2"]) is False
    assert purgatory.check_and_complete("test2") == 0
    r1.completable = True
    assert purgatory.check_and_complete("test1") == 1
    assert purgatory.check_and_complete("test1") == 0
    r2.completable = True
    assert purgatory.check_and_complete("test2") == 1
    assert purgatory.check_and_complete("test2") == 0
    assert (r1.completions, r2.completions) == (1, 1)
    assert purgatory.stats()["completed"] == 2 and purgatory.pending == 0


def test_completes_immediately_without_watching(purgatory: Purgatory):
    op = MockOp(100)
    op.completable = True
    assert purgatory.try_complete_else_watch(op, ["k"]) is True
    assert purgatory.watched() == 0 and purgatory.timer.size == 0


def test_request_expiry(purgatory: Purgatory, clock: ManualClock):
    expiration = 20
    r1, r2 = MockOp(expiration), MockOp(200_000)
    start = clock.now_ms()
    assert purgatory.try_complete_else_watch(r1, ["test1"]) is False
    assert purgatory.try_complete_else_watch(r2, ["test1", "test2"]) is False
    clock.advance(expiration - 1)
    assert not r1.is_completed
    clock.advance(1)
    assert r1.is_completed and r1.expirations == 1 and r1.completions == 1
    assert clock.now_ms() - start >= expiration
    assert not r2.is_completed
    stats = purgatory.stats()
    assert stats["expired"] == 1 and stats["pending"] == 1 and purgatory.timer.size == 1


def test_request_purge(purgatory: Purgatory):
    r1, r2, r3 = MockOp(100_000), MockOp(100_000), MockOp(100_000)
    purgatory.try_complete_else_watch(r1, ["test1"])
    purgatory.try_complete_else_watch(r2, ["test1", "test2"])
    purgatory.try_complete_else_watch(r3, ["test1", "test2", "test3"])
    assert purgatory.pending == 3 and purgatory.timer.size == 3
    assert purgatory.watched() == 6
    r2.completable = True
    r2.try_complete()
    assert purgatory.pending == 2 and purgatory.timer.size == 2
    r3.completable = True
    r3.try_complete()
    assert purgatory.pending == 1 and purgatory.timer.size == 1
    purgatory.check_and_complete("test1")
    assert purgatory.watched() == 4
    purgatory.check_and_complete("test2")
    assert purgatory.watched() == 2
    purgatory.check_and_complete("test3")
    assert purgatory.watched() == 1


def test_cancel_for_key_returns_cancelled_operations(purgatory: Purgatory, clock: ManualClock):
    r1, r2, r3 = MockOp(10), MockOp(10), MockOp(10)
    purgatory.try_complete_else_watch(r1, ["key"])
    purgatory.try_complete_else_watch(r2, ["key"])
    purgatory.try_complete_else_watch(r3, ["key2"])
    cancelled = purgatory.cancel_for_key("key")
    assert cancelled == [r1, r2]
    assert purgatory.pending == 1 and purgatory.timer.size == 1 and purgatory.watched() == 1
    clock.advance(10)
    # Cancelled ops are neither completed nor expired; the other one expires.
    assert not r1.is_completed and r1.expirations == 0 and r3.expirations == 1


def test_cancel_for_missing_key_returns_nothing(purgatory: Purgatory):
    assert purgatory.cancel_for_key("nope") == []


def test_try_complete_before_and_after_watch(purgatory: Purgatory):
    """The second check catches a trigger that fired while the op was being watched."""

    class FlipOp(MockOp):
        __slots__ = ("checks",)

        def try_complete(self) -> bool:
            self.checks = getattr(self, "checks", 0) + 1 if hasattr(self, "checks") else 1
            return self.checks >= 2 and self.force_complete()

    op = FlipOp(1000)
    op.checks = 0
    assert purgatory.try_complete_else_watch(op, ["a", "b"]) is True
    assert op.completions == 1 and purgatory.timer.size == 0


def test_no_watch_on_empty_keys(purgatory: Purgatory):
    with pytest.raises(ValueError):
        purgatory.try_complete_else_watch(MockOp(10), [])


def test_estimated_count_purge(clock: ManualClock):
    purgatory = Purgatory("p", ManualTimer(clock), purge_interval=10, purge_dead_share=0.0)
    live = MockOp(1_000_000)
    purgatory.try_complete_else_watch(live, ["live"])
    ops = [MockOp(1_000_000) for _ in range(40)]
    for op in ops[:11]:
        purgatory.try_complete_else_watch(op, ["a", "b"])
    for op in ops[:11]:
        op.force_complete()
    assert purgatory.stats()["purges"] == 0  # nothing watched since: no check yet
    assert purgatory.maybe_purge() is True  # E - pending = 11 > 10
    assert purgatory.watched() == 1 and purgatory.stats()["estimated"] == 1
    # Below the interval nothing is scanned.
    for op in ops[11:20]:
        purgatory.try_complete_else_watch(op, ["a"])
        op.force_complete()
    assert purgatory.maybe_purge() is False
    assert purgatory.stats()["purges"] == 1


def test_purge_waits_for_dead_share(clock: ManualClock):
    purgatory = Purgatory("p", ManualTimer(clock), purge_interval=2, purge_dead_share=0.5)
    ops = [MockOp(1_000_000) for _ in range(20)]
    for op in ops:
        purgatory.try_complete_else_watch(op, ["k"])
    for op in ops[:5]:
        op.force_complete()
    assert purgatory.maybe_purge() is False  # 5 dead of 20: not worth a full scan yet
    for op in ops[5:10]:
        op.force_complete()
    assert purgatory.maybe_purge() is True
    assert purgatory.watched() == 10


def test_completed_ops_do_not_keep_data_alive(purgatory: Purgatory):
    """KAFKA-19389: an op completed via key A lingers on key B's list, but not its data."""

    class Blob:
        pass

    blob = Blob()
    ref = weakref.ref(blob)
    op = MockOp(100_000, data=blob)
    purgatory.try_complete_else_watch(op, ["a", "b"])
    del blob
    op.completable = True
    assert purgatory.check_and_complete("a") == 1
    assert purgatory.watched() == 1  # still on "b" until a purge or a trigger on "b"
    gc.collect()
    assert ref() is None


def test_expiry_handoff_is_used(clock: ManualClock):
    handed: list[list] = []
    purgatory = Purgatory("p", ManualTimer(clock), expiry_handoff=handed.append)
    op = MockOp(5)
    purgatory.try_complete_else_watch(op, ["k"])
    clock.advance(5)
    assert handed == [[op]] and not op.is_completed  # delivery is the owner's business
    assert purgatory.expire_batch(handed[0]) == 1
    assert op.expirations == 1 and purgatory.stats()["expired"] == 1


def test_two_purgatories_share_one_timer(clock: ManualClock):
    timer = ManualTimer(clock)
    got: dict[str, list] = {"a": [], "b": []}
    pa = Purgatory("a", timer, expiry_handoff=got["a"].extend)
    pb = Purgatory("b", timer, expiry_handoff=got["b"].extend)
    oa, ob = MockOp(3), MockOp(3)
    pa.try_complete_else_watch(oa, ["k"])
    pb.try_complete_else_watch(ob, ["k"])
    clock.advance(3)
    assert got == {"a": [oa], "b": [ob]}


def test_on_complete_runs_before_on_expiration(purgatory: Purgatory, clock: ManualClock):
    order: list[str] = []

    class Ordered(DelayedOperation):
        __slots__ = ()

        def on_complete(self) -> None:
            order.append("complete")

        def on_expiration(self) -> None:
            order.append("expire")

    purgatory.try_complete_else_watch(Ordered(1), ["k"])
    clock.advance(1)
    assert order == ["complete", "expire"]


def test_force_complete_exactly_once_under_thread_races():
    """testTryCompleteWithMultipleThreads, and completer threads racing the timer thread."""
    ops = [MockOp(random.randint(0, 30)) for _ in range(2000)]
    with SystemTimer() as timer:
        purgatory = Purgatory("race", timer, purge_interval=50)
        for op in ops:
            purgatory.try_complete_else_watch(op, [random.randrange(10)])
        start = threading.Barrier(4)

        def completer(chunk):
            start.wait()
            for op in chunk:
                op.force_complete()

        threads = [threading.Thread(target=completer, args=(ops[i::2],)) for i in range(2)]
        threads += [threading.Thread(target=completer, args=(ops[::-1],)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(BOUND_S)
    assert all(op.completions == 1 for op in ops)
    assert all(op.expirations <= 1 for op in ops)
    stats = purgatory.stats()
    assert stats["pending"] == 0
    assert stats["completed"] + stats["expired"] == len(ops)


def test_expiry_via_real_timer_thread():
    done = threading.Event()

    class Op(MockOp):
        __slots__ = ()

        def on_expiration(self) -> None:
            super().on_expiration()
            done.set()

    with SystemTimer() as timer:
        purgatory = Purgatory("real", timer)
        op = Op(20)
        purgatory.try_complete_else_watch(op, ["k"])
        assert done.wait(BOUND_S)
    assert op.completions == 1 and op.expirations == 1


def _watch_until_purged(purgatory: Purgatory, keys: list[str], fresh: list[MockOp], limit: int):
    """Watch new (live) ops round-robin on ``keys`` until a started purge has finished."""
    sizes = []
    while len(fresh) < limit:
        op = MockOp(1_000_000)
        purgatory.try_complete_else_watch(op, [keys[len(fresh) % len(keys)]])
        fresh.append(op)
        sizes.append(purgatory.watched())
        if purgatory.stats()["purges"] and not purgatory._purging:
            return sizes
    raise AssertionError(f"purge not finished after {limit} watches")


def _watch_then_complete(purgatory: Purgatory, keys: list[str], n: int, dead: int):
    """Watch ``n`` ops round-robin on ``keys``, then complete the first ``dead`` of them."""
    ops = [MockOp(1_000_000) for _ in range(n)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, [keys[i % len(keys)]])
    for op in ops[:dead]:
        op.force_complete()
    return ops


def _live_per_key(ops: list[MockOp], keys: list[str]) -> dict[str, int]:
    """Live ops per key, for ops watched round-robin on ``keys``."""
    counts = dict.fromkeys(keys, 0)
    for i, op in enumerate(ops):
        if not op.is_completed:
            counts[keys[i % len(keys)]] += 1
    return counts


def _assert_every_live_op_watched(purgatory, keys, old, fresh) -> None:
    """Nothing dead is left and every live op is still watched on its own key."""
    live_old = _live_per_key(old, keys)
    live_new = _live_per_key(fresh, keys)
    assert purgatory.watched() == sum(live_old.values()) + sum(live_new.values())
    for op in old + fresh:
        op.completable = True
    for key in keys:
        assert purgatory.check_and_complete(key) == live_old[key] + live_new[key]


def test_paced_purge_is_spread_over_watches_and_keeps_every_live_op(clock: ManualClock):
    purgatory = Purgatory("p", ManualTimer(clock), purge_interval=10)
    keys = ["a", "b", "c"]
    old = _watch_then_complete(purgatory, keys, 3000, 2400)
    fresh: list[MockOp] = []
    sizes = _watch_until_purged(purgatory, keys, fresh, 10_000)
    # Spread: the watched count fell in several steps, over many watches.
    assert sum(1 for a, b in itertools.pairwise(sizes) if b < a) >= 2
    assert len(fresh) > 50
    _assert_every_live_op_watched(purgatory, keys, old, fresh)


def test_trigger_on_the_list_a_purge_is_scanning(clock: ManualClock):
    """check_and_complete rewrites the list mid-scan: the purge must not put back stale ops."""
    purgatory = Purgatory("p", ManualTimer(clock), purge_interval=10)
    keys = ["a", "b"]
    old = _watch_then_complete(purgatory, keys, 4000, 3000)
    fresh: list[MockOp] = []

    def partly_scanned() -> list:
        return [s.key for s in purgatory._scans.values() if s.ops and 0 < s.done < s.end]

    while not partly_scanned():
        op = MockOp(1_000_000)
        purgatory.try_complete_else_watch(op, [keys[len(fresh) % 2]])
        fresh.append(op)
        assert len(fresh) < 5000
    key = partly_scanned()[0]
    for op in old[3000:3500]:  # a trigger completes some ops on that key
        op.completable = True
    completed = purgatory.check_and_complete(key)
    assert completed == sum(1 for i in range(3000, 3500) if keys[i % 2] == key)
    _watch_until_purged(purgatory, keys, fresh, 20_000)
    _assert_every_live_op_watched(purgatory, keys, old, fresh)


# --- pieces that moved: Watchers, the one claim, the counters ----------------------------


def test_watchers_try_complete_keeps_survivors_and_ops_watched_meanwhile():
    """Kafka's Watchers.tryCompleteWatched: completed ops are dropped, live ones kept in
    order, and an op watched on the same key from inside a callback is not lost."""
    watchers = Watchers()
    late = MockOp(1000)

    class Rewatch(MockOp):
        __slots__ = ()

        def on_complete(self) -> None:
            super().on_complete()
            watchers.watch(late)  # a re-entrant watch while the list is being checked

    done_before, ready, waiting = MockOp(1000), Rewatch(1000), MockOp(1000)
    done_before.force_complete()
    for op in (done_before, ready, waiting):
        watchers.watch(op)
    ready.completable = True
    assert watchers.try_complete_watched() == 1
    assert list(watchers) == [waiting, late]
    assert watchers.try_complete_watched() == 0 and list(watchers) == [waiting, late]


def test_watchers_cancel_returns_live_ops_that_then_never_expire(clock: ManualClock):
    timer = ManualTimer(clock)
    live, done = MockOp(10), MockOp(10)
    for op in (live, done):
        timer.add(op)
    done.force_complete()
    watchers = Watchers((live, done))
    assert watchers.cancel() == [live]
    assert timer.size == 0
    clock.advance(10)
    assert live.completions == 0 and live.expirations == 0 and not live.is_completed


def test_expire_batch_claims_like_force_complete(purgatory: Purgatory):
    """The expiry path and a trigger make the same one-shot claim: an op completed first
    is not expired, and an op expired once is not expired again."""
    first, second = MockOp(100_000), MockOp(100_000)
    for op in (first, second):
        purgatory.try_complete_else_watch(op, ["k"])
    first.force_complete()
    assert purgatory.expire_batch([first, second, second]) == 1
    assert (first.completions, first.expirations) == (1, 0)
    assert (second.completions, second.expirations) == (1, 1)
    assert purgatory.timer.size == 0


def test_expiry_lateness_counts_each_expired_op_once_runs_of_a_deadline_together(
    clock: ManualClock,
):
    """Lateness is observed once per run of ops sharing a deadline, with that run's size,
    measured to when the batch was handed over: each expired op counts once, an op a
    trigger completed first not at all."""
    batches = []
    purgatory = Purgatory("mock", ManualTimer(clock), expiry_handoff=batches.append)
    early = [MockOp(10) for _ in range(3)]
    late = MockOp(12)
    for op in (*early, late):
        purgatory.try_complete_else_watch(op, ["k"])
    clock.advance(12)  # handed over, not expired yet: the owner expires them below
    batch = [op for handed in batches for op in handed]
    assert batch == [*early, late]
    early[1].force_complete()  # a trigger got there first
    clock.advance(3)  # the owner thread gets to the batch 3 ms after the last deadline
    assert purgatory.expire_batch(batch) == 3
    lateness = purgatory.expiry_lateness
    assert lateness.count == 3
    # Two early ops 5 ms late (15 - 10), the late one 3 ms (15 - 12).
    assert lateness.sum == pytest.approx(2 * 0.005 + 0.003)
    assert purgatory.stats()["expired"] == 3 and purgatory.pending == 0


def test_delayed_operation_starts_as_a_timer_task_does():
    """DelayedOperation sets TimerTask's fields itself (one call less per op): every
    field TimerTask.__init__ sets, it sets to the same value."""
    task, op = TimerTask(7), DelayedOperation(7)
    set_by_task = [name for name in TimerTask.__slots__ if hasattr(task, name)]
    assert set_by_task  # the comparison below compares something
    for name in set_by_task:
        assert getattr(op, name) == getattr(task, name), name


def test_stats_count_each_outcome_and_reading_them_changes_nothing(
    purgatory: Purgatory, clock: ManualClock
):
    """Completions are counted on a lock-free counter any thread may advance; reading it
    (stats, pending) must not move it."""
    ops = [MockOp(10 if i < 2 else 100_000) for i in range(6)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, ["c" if i == 5 else "k"])
    ops[2].force_complete()
    done = threading.Thread(target=ops[3].force_complete)
    done.start()
    done.join()
    clock.advance(10)  # ops 0 and 1 expire
    purgatory.cancel_for_key("c")  # op 5
    for _ in range(3):
        stats = purgatory.stats()
        assert (stats["completed"], stats["expired"], stats["pending"]) == (2, 2, 1)
        assert purgatory.pending == 1
