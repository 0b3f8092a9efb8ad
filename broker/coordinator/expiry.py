"""Offset expiry (Kafka's GroupMetadataManager.cleanupGroupMetadata and
GroupMetadata.removeExpiredOffsets, with KIP-211's rule).

Every ``offsets.retention.check.interval.ms`` the coordinator drops committed offsets
older than ``offsets.retention.minutes``, measured from:

- when the group became Empty, for a group that had members (KIP-211: a live group's
  offsets never expire, however old its last commit);
- the commit itself, for a group that never had a protocol (a consumer that assigns its
  partitions and only stores offsets here).

Expired offsets become tombstones in ``__consumer_offsets`` (the log cleaner then removes
them and what they delete), and an Empty group left with no offsets is deleted (Dead),
its metadata tombstoned too. Kafka also expires, in a Stable consumer group, the offsets
of topics no member subscribes to any more; that needs the subscriptions, which this
broker never reads, so such offsets stay until the group empties.

Clocks: commit timestamps are wall-clock (they survive restarts and failover); a group's
``state_timestamp`` is the coordinator's monotonic clock, converted here. A group loaded
from the log takes the wall time of its latest metadata record (written when it became
Empty) as the moment it became Empty.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from minibroker.broker.coordinator.coordinator import DEAD, EMPTY, GroupCoordinator
from minibroker.broker.coordinator.group import GroupMetadata
from minibroker.broker.coordinator.records import PartitionContents, group_key, offset_key
from minibroker.protocol.errors import ErrorCode


class OffsetExpiry:
    def __init__(
        self,
        coordinator: GroupCoordinator,
        config: Any,
        logger: Any,
        wall_ms: Callable[[], int],
    ) -> None:
        self.coordinator = coordinator
        self.retention_ms = config["offsets.retention.minutes"] * 60_000
        self.interval_ms = config["offsets.retention.check.interval.ms"]
        self.log = logger
        self.wall_ms = wall_ms
        self.expired_offsets = 0
        self.deleted_groups = 0

    async def run(self) -> None:
        """Clean up every ``offsets.retention.check.interval.ms`` until cancelled."""
        while True:
            await trio.sleep(self.interval_ms / 1000)
            self.cleanup()

    def expired(self, group: GroupMetadata, wall_now: int) -> list[tuple[str, int]]:
        """The group's offsets past retention now (Kafka's getExpiredOffsets)."""
        if group.protocol_type is None:
            # Never had members: each offset from its own commit.
            horizon = wall_now - self.retention_ms
            return [tp for tp, o in group.offsets.items() if o.commit_timestamp <= horizon]
        if not group.is_in(EMPTY):
            return []
        empty_since = wall_now - (self.coordinator.now_ms() - group.state_timestamp)
        if wall_now - empty_since < self.retention_ms:
            return []
        return list(group.offsets)

    def cleanup(self) -> tuple[int, int]:
        """One pass over the groups this broker coordinates; (offsets, groups) removed."""
        coordinator = self.coordinator
        manager = coordinator.manager
        wall_now = self.wall_ms()
        writes: dict[int, list[tuple[bytes, None]]] = {}
        offsets_removed = groups_removed = 0
        for group in list(coordinator.groups.values()):
            if group.is_in(DEAD) or group.partition not in manager.owned:
                continue
            expired = self.expired(group, wall_now)
            entries = writes.setdefault(group.partition, [])
            for tp in expired:
                del group.offsets[tp]
                entries.append((offset_key(group.group_id, *tp), None))
            offsets_removed += len(expired)
            if group.is_in(EMPTY) and not group.offsets and not group.members:
                group.transition_to(DEAD, coordinator.now_ms())
                del coordinator.groups[group.group_id]
                entries.append((group_key(group.group_id), None))
                groups_removed += 1
                self.log.info("group_expired", group=group.group_id)
        for partition, entries in writes.items():
            if entries:
                manager.append(partition, entries, self._written(partition, len(entries)))
        if offsets_removed or groups_removed:
            self.expired_offsets += offsets_removed
            self.deleted_groups += groups_removed
            self.log.info("offsets_expired", offsets=offsets_removed, groups=groups_removed)
        return offsets_removed, groups_removed

    def _written(self, partition: int, count: int) -> Callable[[ErrorCode], None]:
        def done(error: ErrorCode) -> None:
            # Best effort, as Kafka's: a tombstone that did not make it is written again
            # by the next leader's expiry (the offset is old there too).
            if error is not ErrorCode.NONE:
                self.log.warning(
                    "offset_expiry_append_failed",
                    partition=partition,
                    records=count,
                    error=error.name,
                )

        return done

    def partition_loaded(self, partition: int, contents: PartitionContents) -> None:
        """Loaded Empty groups became Empty when their last metadata record was written."""
        coordinator = self.coordinator
        now, wall_now = coordinator.now_ms(), self.wall_ms()
        for group in coordinator.manager.groups_of(partition):
            written = contents.group_timestamps.get(group.group_id)
            if written is not None and group.is_in(EMPTY):
                group.state_timestamp = now - max(0, wall_now - written)
