"""The purgatory: watcher lists by key, a timer for timeouts, an estimated-count purge.

Threading contract. One *owner* thread (the broker's trio thread) calls
``try_complete_else_watch``, ``check_and_complete``, ``cancel_for_key``, ``maybe_purge``
and runs ``expire_batch``: watcher lists are touched by that thread only, so they are
plain lists (``Watchers``) with no lock. ``DelayedOperation.force_complete`` may be
called from any thread; its one-shot claim keeps completion exactly-once, and it counts
the completion here through ``count_completion``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable

from minibroker.broker.common.histogram import Histogram
from minibroker.broker.purgatory.bucket import TimerTask
from minibroker.broker.purgatory.operation import DelayedOperation
from minibroker.broker.purgatory.timer import Timer
from minibroker.broker.purgatory.watchers import Watchers

ExpiryHandoff = Callable[[list], None]

# A running purge takes one step on every (PURGE_STEP_MASK + 1)th watch, paced to end
# within PURGE_PACE of the watches before the next purge can be due (at least
# max(pending, purge_interval) more), and never more finely than PURGE_STEP_MIN entries
# a step (a step's call and slice cost as much as scanning ~30 entries). Spread this
# thin, the owner thread never falls behind long enough to keep the timer thread off
# the GIL: a purge done at once took 20-30 ms at 250k ops/s and held expiry up as long.
PURGE_STEP_MASK = 7
PURGE_STEP_MIN = 64
PURGE_PACE = 0.5
# A purge visits the lists in rounds of about PURGE_ROUND entries: the ops one round reads
# (~5k ops, ~1 MB) stay in the core's cache (2 MB L2 here) while their other keys' lists
# are scanned; smaller rounds pay more visits (a call and a slice each), larger ones miss
# (replay: 4096 -> 16384 saved 0.1-0.4 us an op, 131072 lost it again). A list
# visited for fewer than PURGE_CHUNK_MIN entries a round costs more in calls than it saves.
PURGE_ROUND = 16384
PURGE_CHUNK_MIN = 16


class _ListScan:
    """One watcher list under a purge: ``done`` of the ``end`` entries it had when the
    purge began are scanned, and the next one is at ``pos`` (the live ops scanned so far
    are ``ops[:pos]``, compacted in place). ``ops`` None: the scan is void."""

    __slots__ = ("done", "end", "key", "ops", "pos")

    def __init__(self, key: Hashable, ops: list[DelayedOperation]) -> None:
        self.key = key
        self.ops: list[DelayedOperation] | None = ops
        self.end = len(ops)
        self.done = 0
        self.pos = 0


class Purgatory:
    """Kafka's DelayedOperationPurgatory for one kind of operation.

    ``timer`` is any Timer: a SystemTimer or a ManualTimer (several purgatories may share
    one).
    Expired operations reach ``expire_batch`` through ``expiry_handoff``: by default the
    timer thread calls ``expire_batch`` itself; the broker passes a function that does
    ``trio_token.run_sync_soon(purgatory.expire_batch, batch)``.
    ``purge_interval`` is ``purgatory.purge.interval.requests``. ``purge_dead_share``: the
    purge also waits until completed ops are at least this share of the estimated total,
    so each purge's O(watched) scan is paid for by as many completions (0: Kafka's rule).
    """

    def __init__(
        self,
        name: str,
        timer: Timer,
        purge_interval: int = 1000,
        *,
        expiry_handoff: ExpiryHandoff | None = None,
        purge_dead_share: float = 0.5,
    ) -> None:
        self.name = name
        self.timer = timer
        self.purge_interval = purge_interval
        self.purge_dead_share = purge_dead_share
        self._watchers: dict[Hashable, Watchers] = {}
        self._handoff: ExpiryHandoff = expiry_handoff or self.expire_batch
        # Stored once: the timer groups expired ops by sink identity, and a bound method
        # made afresh on every access would be a new object (and an allocation) per op.
        self._sink = self._deliver_expired
        # E (the estimated count) is _watched_ops - _estimate_base: one counter per op on
        # the hot path; a purge resets E to pending by moving the base.
        self._estimate_base = 0
        self._check_step = max(1, min(64, purge_interval // 16))
        self._next_check = self._check_step
        self._watched_ops = 0
        self._cancelled = 0
        self._expired = 0
        # Deadline to completion of each expired op (trio thread only).
        self.expiry_lateness = Histogram()
        # Completions (expiry included), counted by whichever thread completes an op
        # (force_complete calls count_completion): an itertools.count's __next__ is one C
        # call, atomic under the GIL, so no lock; _completed() reads it.
        self._completions = itertools.count()
        self.count_completion = self._completions.__next__
        self._completion_reads = 0
        self._purges = 0
        # The running purge: one _ListScan per watcher list, visited a share at a time,
        # round by round; where the next step goes on (round, index in _scan_order).
        self._purging = False
        self._scans: dict[Hashable, _ListScan] = {}  # by key: a trigger voids its scan
        self._scan_order: list[_ListScan] = []
        self._scan_rounds = 1
        self._scan_round = 0
        self._scan_next = 0  # the next list of the round, an index in _scan_order
        self._purge_budget = PURGE_STEP_MIN  # entries per step, set as each purge starts
        self._checking = False

    def set_expiry_handoff(self, handoff: ExpiryHandoff) -> None:
        self._handoff = handoff

    def _deliver_expired(self, batch: list[DelayedOperation]) -> None:
        self._handoff(batch)

    # --- owner thread -----------------------------------------------------------------

    def try_complete_else_watch(self, op: DelayedOperation, keys: Iterable[Hashable]) -> bool:
        """Complete ``op`` now if possible; otherwise watch it on every key and time it.

        Order matters (reference §2): a check first (cheap, and most ops never wait); then
        watch on *every* key, so that from here on no trigger on any key can be missed;
        then check again, because a trigger may have fired between the first check and
        the watch; only then add to the timer, so an op completed by that second check
        never enters the timer at all.
        """
        if type(keys) is not tuple and type(keys) is not list:
            keys = list(keys)
        if not keys:
            raise ValueError("an operation must be watched on at least one key")
        if op.try_complete():
            return True
        op.owner = self
        watched = self._watched_ops = self._watched_ops + 1  # E grows with it
        watchers = self._watchers
        for key in keys:
            if op.is_completed:  # completed meanwhile (another thread): stop watching (KAFKA-18027)
                break
            ops = watchers.get(key)
            if ops is None:
                watchers[key] = Watchers((op,))
            else:
                ops.watch(op)
        if op.try_complete():
            return True
        if not op.is_completed:
            op.sink = self._sink
            self.timer.add(op)
            if op.is_completed:
                # Completed by another thread between the check and the add: take it out
                # of the timer (TimerTask.cancel: the op is completed, not cancelled).
                TimerTask.cancel(op)
        if self._purging:
            if not watched & PURGE_STEP_MASK:
                self._purge_step(self._purge_budget)
        elif watched >= self._next_check:
            self.maybe_purge(paced=True)
        return False

    def check_and_complete(self, key: Hashable) -> int:
        """Try to complete every op watched on ``key``; drop finished ones from its list."""
        ops = self._watchers.get(key)
        if not ops:
            return 0
        self._checking = True
        try:
            completed = ops.try_complete_watched()
        finally:
            self._checking = False
        if self._purging:
            scan = self._scans.pop(key, None)
            if scan is not None and scan.ops is ops:
                # Just compacted here: the purge's partial scan of it is void.
                scan.ops = None
        if not ops and self._watchers.get(key) is ops:
            del self._watchers[key]
        return completed

    def cancel_for_key(self, key: Hashable) -> list[DelayedOperation]:
        """Stop watching ``key``; its ops leave the timer uncompleted and are returned."""
        ops = self._watchers.pop(key, None)
        return ops.cancel() if ops else []

    def expire_batch(self, batch: list[DelayedOperation]) -> int:
        """Expire a batch the timer handed over; returns how many this call expired.

        Expiry lateness (deadline to answer handed over: the connection writes it in the
        completion) is measured to the end of the batch, with one clock read, and counted
        once per run of ops that share a deadline (a timer bucket's worth, hundreds at
        high rates): a read and an observation per op cost more than the rest of expiry.
        It is never less than the truth: an op answered early in the batch counts the
        whole batch's time.
        """
        expired = 0
        runs: list[tuple[int, int]] = []  # (deadline, ops expired here with it)
        last = None
        n = 0
        try:
            for op in batch:
                if op.force_complete():  # a trigger may have got there first
                    if op.owner is self:
                        expired += 1
                    op.on_expiration()
                    if op.expiration_ms != last:
                        if n:
                            runs.append((last, n))
                        last = op.expiration_ms
                        n = 0
                    n += 1
        finally:
            self._expired += expired
            if n:
                runs.append((last, n))
                now_ms = self.timer.clock.now_ms()
                observe = self.expiry_lateness.observe
                for deadline, times in runs:
                    late_ms = now_ms - deadline
                    observe(late_ms / 1000 if late_ms > 0 else 0.0, times)
        return expired

    def count_cancel(self) -> None:
        """An op watched here was cancelled (DelayedOperation.cancel; owner thread)."""
        self._cancelled += 1

    def maybe_purge(self, *, paced: bool = False) -> bool:
        """Seed's estimated-count purge: start one only when E - pending > purge_interval.

        E resets to pending when a purge *starts*; ops watched while it runs add to E
        again (the seed's rule). ``paced``: scan only the first step now and the rest on
        later watches (the watch path); otherwise the whole purge runs now.
        """
        pending = self.pending
        watched = self._watched_ops
        estimated = watched - self._estimate_base
        self._next_check = watched + self._check_step
        dead = estimated - pending
        if self._purging or dead <= self.purge_interval:
            return False
        if dead < self.purge_dead_share * estimated:
            return False
        self._estimate_base = watched - pending  # E := pending
        self._start_purge(pending)
        self._purge_step(self._purge_budget if paced else None)
        return True

    def _start_purge(self, pending: int) -> None:
        self._purges += 1
        self._purging = True
        scans = {key: _ListScan(key, ops) for key, ops in self._watchers.items()}
        self._scans = scans
        self._scan_order = list(scans.values())
        self._scan_next = 0
        self._scan_round = 0
        entries = sum(scan.end for scan in self._scan_order)
        # Rounds of about PURGE_ROUND entries, each list scanned by the same share in each
        # round, but at least PURGE_CHUNK_MIN entries a list on average (a visit costs a
        # call's worth), and one round when there is little to scan.
        chunked = entries // (PURGE_CHUNK_MIN * max(1, len(scans)))
        self._scan_rounds = max(1, min(entries // PURGE_ROUND, chunked))
        steps = max(pending, self.purge_interval) * PURGE_PACE / (PURGE_STEP_MASK + 1)
        self._purge_budget = max(PURGE_STEP_MIN, int(entries / steps) + 1)

    def _purge_step(self, budget: int | None) -> None:
        """Scan about ``budget`` watcher entries (None: finish the purge now).

        Incremental, and across the lists rather than one list after another: round ``r``
        of ``R`` scans each list's ``r``-th ``R``-th. Lists are in watch order, so a round
        covers about the same span of watches in every list, and an op watched on three
        keys is read three times within one round, from cache, instead of three times a
        list apart (a cache miss each: the scan's main cost, ~100 ns an entry). Each
        scanned slice is compacted in place at once, so a dead op is released while it is
        still in cache too; entries appended meanwhile (past the scanned ones) are kept.
        """
        if self._checking:
            return  # never compact a list check_and_complete is iterating
        order = self._scan_order
        rounds = self._scan_rounds
        rnd = self._scan_round
        i = self._scan_next
        left = budget
        while left is None or left > 0:
            if i == len(order):
                i = 0
                rnd += 1
                if rnd == rounds:
                    self._end_purge()
                    return
            scan = order[i]
            ops = scan.ops
            if ops is None:
                i += 1
                continue  # compacted by a trigger meanwhile
            done = scan.done
            last = rnd == rounds - 1
            target = scan.end if last else scan.end * (rnd + 1) // rounds
            size = target - done
            if left is not None and size > left:
                size = left
            if size > 0:
                pos = scan.pos
                stop = pos + size
                live = [op for op in ops[pos:stop] if not op.is_completed]
                if len(live) != size:
                    ops[pos:stop] = live
                scan.pos = pos + len(live)
                scan.done = done = done + size
                if left is not None:
                    left -= size
            if done < target:
                break  # out of budget within this list's share: go on from here next step
            i += 1
            if last and not ops:
                key = scan.key
                if self._watchers.get(key) is ops:
                    del self._watchers[key]
        self._scan_round = rnd
        self._scan_next = i

    def _end_purge(self) -> None:
        self._purging = False
        self._scans = {}
        self._scan_order = []

    # --- metrics ----------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Ops watched here and not yet completed, expired or cancelled."""
        return self._watched_ops - self._completed() - self._cancelled

    def _completed(self) -> int:
        """Completions so far, expiry included (owner thread).

        ``next`` is the only way to read an itertools.count, and it advances it: each read
        is one more call to subtract, so this counts its own reads.
        """
        completed = next(self._completions) - self._completion_reads
        self._completion_reads += 1
        return completed

    def watched(self) -> int:
        """Kafka's PurgatorySize: entries on all lists (O(keys); over-counts by design)."""
        return sum(len(ops) for ops in self._watchers.values())

    def stats(self) -> dict:
        completed = self._completed()
        return {
            "name": self.name,
            "pending": self._watched_ops - completed - self._cancelled,
            "watched": self.watched(),
            "completed": completed - self._expired,  # by a trigger or a completer
            "expired": self._expired,
            "purges": self._purges,
            "estimated": self._watched_ops - self._estimate_base,
            "keys": len(self._watchers),
            "timer_size": self.timer.size,
            "expiry_lateness": self.expiry_lateness.summary(),
        }
