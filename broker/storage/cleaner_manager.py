"""The broker's log cleaner task (Kafka's LogCleanerManager and CleanerThread): pick the
compacted log with the highest dirty ratio, clean it, repeat; back off
``log.cleaner.backoff.ms`` when no log needs it.

The trio loop plans and swaps; the reading, writing and fsyncs run in a worker thread (one
at a time, as Kafka's default ``log.cleaner.threads=1``), so a pass never holds the loop
for longer than a swap's few renames and unlinks. A log whose cleaning fails (a corrupt batch, a full
disk) is left alone until the broker restarts, as Kafka marks a partition uncleanable.
A batch that cannot be cleaned in the memory budget is not such a failure: it is copied
as it is, logged (``log_cleaner_batch_copied``), and the rest of the log is cleaned.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import trio

from minibroker.broker.common.atomic_file import fsync_dir
from minibroker.broker.storage import cleaner, swap
from minibroker.broker.storage.log import Log
from minibroker.protocol.batch import CorruptBatch


class LogCleanerManager:
    def __init__(
        self,
        logs: Callable[[], Iterable[tuple[Log, int]]],
        backoff_ms: int,
        logger: Any,
        budget: cleaner.Budget | None = None,
    ) -> None:
        """``logs``: every replica's log with its high watermark, asked afresh each time."""
        self.logs = logs
        self.backoff_ms = backoff_ms
        self.log = logger
        self.budget = budget or cleaner.Budget()
        self.batches_copied = 0
        # Logs whose cleaning failed (the objects: a topic deleted and created again under
        # the same name gets a new log, which is cleaned).
        self.uncleanable: weakref.WeakSet[Log] = weakref.WeakSet()
        self.passes = 0
        self.bytes_read = 0
        self.bytes_written = 0
        self._stop = threading.Event()

    def stats(self) -> dict:
        """For ``minibroker stats`` (Kafka's cleaner metrics, in short)."""
        return {
            "passes": self.passes,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "batches_copied_uncleaned": self.batches_copied,
            "uncleanable_partitions": sorted(log.dir.name for log in self.uncleanable),
        }

    async def run(self) -> None:
        """Clean until cancelled."""
        try:
            while True:
                if not await self.clean_filthiest():
                    await trio.sleep(self.backoff_ms / 1000)
        finally:
            self._stop.set()  # an abandoned worker stops at its next read

    def filthiest(self) -> cleaner.Plan | None:
        best = None
        for log, high_watermark in self.logs():
            if log in self.uncleanable:
                continue
            plan = cleaner.plan(log, high_watermark, log.now_ms(), self.budget)
            if plan is not None and (best is None or plan.dirty_ratio > best.dirty_ratio):
                best = plan
        return best

    async def clean_filthiest(self) -> bool:
        """One pass over the dirtiest log; False when no log needed one."""
        plan = self.filthiest()
        if plan is None:
            return False
        try:
            await self.clean(plan)
        except (OSError, CorruptBatch, cleaner.CleaningAborted) as exc:
            if self._stop.is_set() or plan.log.closed:
                return True  # shutting down, or the partition went (deleted, moved)
            self.uncleanable.add(plan.log)
            self.log.error("log_cleaner_failed", dir=str(plan.log.dir), error=str(exc))
        except Exception as exc:
            # A bug or input nothing foresaw: the log is left alone, never the broker
            # taken down (which, the data unchanged, would fail again at every restart).
            if self._stop.is_set() or plan.log.closed:
                return True
            self.uncleanable.add(plan.log)
            self.log.exception(
                "log_cleaner_failed", dir=str(plan.log.dir), error=f"{type(exc).__name__}: {exc}"
            )
        return True

    async def clean(self, plan: cleaner.Plan) -> None:
        log = plan.log
        log.cleaning = True
        try:
            await self._clean(plan)
        except OSError:
            if log.changes != plan.changes:
                return  # retention or a truncation discarded our copy: plan again later
            swap.discard_uncommitted(log.dir)
            raise
        except Exception:  # CorruptBatch, CleaningAborted, and whatever else
            swap.discard_uncommitted(log.dir)
            raise
        finally:
            log.cleaning = False

    async def _clean(self, plan: cleaner.Plan) -> None:
        latest = await self._in_thread(cleaner.build_offset_map, plan, self._stop)
        read = written = 0
        directory = plan.log.dir
        for group, end in cleaner.with_ends(plan, latest):
            if not cleaner.still_planned(plan, group):
                return  # retention or a truncation got there first: plan again later
            made, stats = await self._in_thread(
                cleaner.clean_group, plan, group, end, latest, self._stop
            )
            if not cleaner.still_planned(plan, group):
                cleaner.discard(plan, made.base)
                return
            # The commit's fsync in the thread; then the renames on the loop, unless the
            # segments changed meanwhile (their change discarded the swap file then).
            await self._in_thread(swap.commit, directory, made.base, made.end)
            if not cleaner.still_planned(plan, group):
                swap.discard_pending(directory)
                return
            cleaner.swap_in(plan, group, made)
            self._report_copied(plan, stats)
            read += stats.bytes_read
            written += stats.bytes_written
        await self._in_thread(fsync_dir, directory)
        cleaner.finish(plan, latest)
        self.passes += 1
        self.bytes_read += read
        self.bytes_written += written
        self.log.info(
            "log_cleaned",
            dir=str(plan.log.dir),
            dirty_ratio=round(plan.dirty_ratio, 3),
            first_uncleanable=plan.first_uncleanable,
            cleaned_to=latest.reached,
            bytes_before=read,
            bytes_after=written,
            keys=len(latest),
        )

    def _report_copied(self, plan: cleaner.Plan, stats: cleaner.Stats) -> None:
        """Name the batches the budget made us copy uncleaned (at most MAX_REPORTED per
        group: a log of a million such batches must not log a million lines)."""
        self.batches_copied += stats.copied_count
        partition = plan.log.dir.name
        for offset, reason in stats.copied:
            self.log.warning(
                "log_cleaner_batch_copied", partition=partition, offset=offset, reason=reason
            )
        if stats.copied_count > len(stats.copied):
            self.log.warning(
                "log_cleaner_batches_copied",
                partition=partition,
                count=stats.copied_count,
                named=len(stats.copied),
            )

    async def _in_thread(self, fn: Callable, *args: Any) -> Any:
        # abandon_on_cancel: shutdown does not wait out a segment's worth of work; the
        # thread sees _stop at its next read, and its .cleaned files go at the next open.
        try:
            return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
        except trio.Cancelled:
            self._stop.set()
            raise
