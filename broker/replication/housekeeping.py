"""A broker's periodic replica chores (Kafka's scheduled isr-expiration, log retention,
recovery-point checkpoint and producer-id expiration tasks, and its log cleaner): each a
loop on its config key's interval."""

from __future__ import annotations

import time
from typing import Any

import trio

from minibroker.broker.common.clock import Clock
from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.replication.replica_manager import ReplicaManager
from minibroker.broker.storage.cleaner_batch import Budget
from minibroker.broker.storage.cleaner_manager import LogCleanerManager


async def run_housekeeping(
    rm: ReplicaManager, config: BrokerConfig, clock: Clock, logger: Any
) -> None:
    """Run every chore until cancelled."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_shrink_isr, rm, config["replica.lag.time.max.ms"], clock)
        nursery.start_soon(
            _delete_old_segments, rm, config["log.retention.check.interval.ms"], logger
        )
        nursery.start_soon(
            _checkpoint_recovery_points, rm, config["log.flush.offset.checkpoint.interval.ms"]
        )
        nursery.start_soon(
            _expire_producers, rm, config["producer.id.expiration.check.interval.ms"], logger
        )
        if config["log.cleaner.enable"]:
            rm.cleaner = LogCleanerManager(
                lambda: [(p.log, p.high_watermark) for p in rm.partitions.values()],
                config["log.cleaner.backoff.ms"],
                logger,
                Budget(
                    config["log.cleaner.io.buffer.size"], config["log.cleaner.dedupe.buffer.size"]
                ),
            )
            nursery.start_soon(rm.cleaner.run)


async def _shrink_isr(rm: ReplicaManager, lag_ms: int, clock: Clock) -> None:
    """Drop followers more than replica.lag.time.max.ms behind, checked twice per lag."""
    while True:
        await trio.sleep(max(lag_ms / 2, 10) / 1000)
        rm.maybe_shrink_isr(clock.now_ms(), lag_ms)


async def _delete_old_segments(rm: ReplicaManager, interval_ms: int, logger: Any) -> None:
    while True:
        await trio.sleep(interval_ms / 1000)
        try:
            deleted = rm.delete_old_segments()
        except OSError as exc:
            logger.error("retention_failed", error=str(exc))
            continue
        if deleted:
            logger.info("retention_deleted_segments", count=deleted)


async def _checkpoint_recovery_points(rm: ReplicaManager, interval_ms: int) -> None:
    """Kafka's kafka-recovery-point-checkpoint task; the file's fsyncs off the loop."""
    while True:
        await trio.sleep(interval_ms / 1000)
        try:
            await trio.to_thread.run_sync(rm.take_recovery_checkpoint())
        except OSError as exc:  # a segment's flush or the checkpoint's write failed
            rm.storage_failed(exc, "flushing segments and checkpointing recovery points")


async def _expire_producers(rm: ReplicaManager, interval_ms: int, logger: Any) -> None:
    while True:
        await trio.sleep(interval_ms / 1000)
        # Producer state keeps wall-clock timestamps (they survive restarts).
        expired = rm.remove_expired_producers(int(time.time() * 1000))
        if expired:
            logger.info("producer_ids_expired", count=expired)
