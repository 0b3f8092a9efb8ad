"""One replica fetcher task per follower partition, long-polling its leader.

The task's requests travel in its leader's LeaderLink (leader_link.py): one connection
and one Fetch in flight per leader, carrying every partition followed from it, as
Kafka's fetcher thread does. The fetch goes through the leader's fetch purgatory
(``replica.fetch.wait.max.ms``, ``replica.fetch.min.bytes``), so idle followers cost
one parked request per leader, not a busy loop. This module is the I/O half of a
follower: requests, backoff and injected faults. Every change to the replica (append,
HW, truncation, epoch cache) is a Partition method, so the rules live in one place and
are tested without sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from minibroker.broker.network.peer import log_peer_failure
from minibroker.broker.quota import ReplicationQuota
from minibroker.broker.replication.leader_link import LeaderLink
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, KafkaError, error_class

if TYPE_CHECKING:
    from minibroker.broker.metadata.image import BrokerInfo
    from minibroker.broker.replication.partition import Partition


# Answers that mean "the leader has not applied the metadata we act on yet": every broker
# applies each commit on its own, so a follower of a new topic (or a new leader epoch)
# often asks a moment before its leader knows. Retried after a short pause that doubles
# up to replica.fetch.backoff.ms, not after the whole backoff: a new topic's first acks=all
# write would otherwise wait up to a second for it.
LEADER_NOT_CAUGHT_UP = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
    }
)
FIRST_RETRY_S = 0.01


class ReplicaFetcher:
    def __init__(
        self,
        partition: Partition,
        leader: BrokerInfo,
        broker_id: int,
        config: Any,
        logger: Any,
        on_hw_change: Callable[[Partition], None],
        faults: Any,
        link: LeaderLink,
        on_storage_error: Callable[[OSError, str], None],
    ) -> None:
        self.partition = partition
        self.leader = leader
        self.leader_epoch = partition.leader_epoch
        self.broker_id = broker_id
        self.config = config
        self.logger = logger.bind(
            topic=partition.topic, partition=partition.index, leader=leader.node_id
        )
        self.on_hw_change = on_hw_change
        self.cancel_scope = trio.CancelScope()
        self.faults = faults
        self.link = link
        self.on_storage_error = on_storage_error
        # The follower's replication quota (fetcher_manager sets both).
        self.quota: ReplicationQuota | None = None
        self.topic_configs: Callable[[str], dict | None] = lambda topic: None
        link.join(self)

    async def run(self) -> None:
        with self.cancel_scope:
            await self._loop()

    def stop(self) -> None:
        """Leave the link at once (its next round no longer waits for us), then end."""
        self.link.leave(self)
        self.cancel_scope.cancel()

    def _fetch_part(self) -> dict:
        return {
            "partition": self.partition.index,
            "fetch_offset": self.partition.log_end_offset,
            "partition_max_bytes": self.config["replica.fetch.max.bytes"],
            "current_leader_epoch": self.leader_epoch,
            # The leader leaves us out of its answer while we have all of it, HW
            # included; our ask then rides the link's next round (leader_link.py).
            "high_watermark": self.partition.high_watermark,
            "log_start_offset": self.partition.log.log_start_offset,
        }

    async def _truncate(self) -> None:
        """Cut our log where it diverges from the new leader's, by leader epoch (KIP-101).

        Without this, a follower that was once leader (or missed the end of an old epoch)
        could keep records the new leader never had, and two replicas would hold two
        different records at one offset. The fetcher asks; the partition decides and cuts.
        """
        p = self.partition
        epoch = p.latest_epoch
        if epoch < 0:
            target = p.high_watermark  # no epochs known: keep what is committed
        else:
            answer = await self.link.ask(
                self,
                ApiKey.OFFSET_FOR_LEADER_EPOCH,
                p.key,
                {"partition": p.index, "leader_epoch": epoch},
            )
            error = ErrorCode.parse(answer["error_code"])
            if error is not ErrorCode.NONE:
                raise error_class(error)(
                    f"{error.name} from leader {self.leader.node_id} for OffsetsForLeaderEpoch"
                )
            target = p.offset_for_truncation(answer["leader_epoch"], answer["end_offset"])
        leo = p.log_end_offset
        if p.truncate_to(target):
            self.logger.warning(
                "follower_truncating_to_leader",
                from_offset=leo,
                to_offset=target,
                leader_epoch=self.leader_epoch,
            )

    async def _loop(self) -> None:
        backoff = self.config["replica.fetch.backoff.ms"] / 1000
        link, key = self.link, self.partition.key
        retry = FIRST_RETRY_S
        while True:
            try:
                await self._truncate()
                break
            except KafkaError as exc:
                log_peer_failure(self.logger, "truncation_check_failed", exc)
                retry = await self._pause_after(exc, retry, backoff)
            except Exception:
                self.logger.exception("truncation_error")
                await link.pause(self, backoff)
        retry = FIRST_RETRY_S
        while True:
            try:
                delay_ms, _ = self.faults.replication(key)
                if delay_ms:
                    await link.pause(self, delay_ms / 1000)
                quota = self.quota
                throttled = quota is not None and quota.throttles(
                    self.topic_configs(key[0]), key[1]
                )
                if throttled and quota.exceeded():
                    # Kafka's shouldFollowerThrottle: no fetch for this replica until the
                    # follower's replication rate is back under its bound.
                    wait_ms = max(quota.wait_ms(), 1)
                    quota.throttled_ms += wait_ms
                    await link.pause(self, wait_ms / 1000)
                    continue
                data = await link.ask(self, ApiKey.FETCH, key, self._fetch_part())
                # Asked again: a fault injected while this fetch was parked applies to its data.
                if self.faults.replication(key)[1]:
                    # Dropped replication: the leader saw the fetch, we discard the data.
                    await link.pause(self, backoff)
                    continue
                self._process(data)
                if throttled:
                    quota.record(len(data["records"]))
                retry = FIRST_RETRY_S
            except KafkaError as exc:
                log_peer_failure(self.logger, "replica_fetch_failed", exc)
                retry = await self._pause_after(exc, retry, backoff)
            except OSError as exc:
                # Our disk, not the leader: retrying would keep this replica in the ISR
                # while it holds nothing new. The log dir goes offline (Kafka's
                # LogDirFailureChannel), which stops every fetcher, this one included;
                # the leader then shrinks the ISR at replica.lag.time.max.ms.
                self.on_storage_error(exc, f"appending to {key[0]}-{key[1]} as a follower")
                await link.pause(self, backoff)
            except Exception:
                # A bug or a bad answer must cost this partition a retry, not the broker.
                self.logger.exception("replica_fetch_error")
                await link.pause(self, backoff)

    async def _pause_after(self, exc: KafkaError, retry: float, backoff: float) -> float:
        """Back off after a refusal; returns the next short retry. A leader that has not
        caught up with the metadata is asked again soon, and the retry calls back the
        Fetch round that went out meanwhile without this partition (LeaderLink.rejoin)."""
        if exc.code not in LEADER_NOT_CAUGHT_UP:
            await self.link.pause(self, backoff)
            return retry
        self.link.rejoin(self)
        await self.link.pause(self, min(retry, backoff))
        return retry * 2

    def _process(self, data: dict) -> None:
        p = self.partition
        error = ErrorCode.parse(data["error_code"])
        if error is ErrorCode.OFFSET_OUT_OF_RANGE:
            self._handle_out_of_range(data)
            return
        if error is not ErrorCode.NONE:
            raise error_class(error)(f"from leader {self.leader.node_id}")
        records = data["records"]
        if records:
            p.append_records_to_follower(records)
        if p.maybe_update_follower_hw(data["high_watermark"]):
            self.on_hw_change(p)
        # The leader's DeleteRecords (or retention) moved its start: ours follows, up to
        # our HW (Kafka's maybeIncrementLogStartOffset on the follower).
        start = min(data.get("log_start_offset", -1), p.high_watermark)
        if start > p.log.log_start_offset:
            p.log.delete_records_before(start)

    def _handle_out_of_range(self, data: dict) -> None:
        """Kafka's handleOutOfRangeError: follow the leader's end, or restart at its start."""
        p = self.partition
        leo = p.log_end_offset
        leader_leo = data.get("log_end_offset", -1)
        leader_start = data.get("log_start_offset", -1)
        if 0 <= leader_leo < leo:
            # The leader is behind us: drop our unreplicated suffix.
            self.logger.warning("follower_truncating", from_offset=leo, to_offset=leader_leo)
            p.truncate_to(leader_leo)
        elif leader_start > leo:
            self.logger.warning("follower_reset_to_leader_start", offset=leader_start)
            p.truncate_fully_and_start_at(leader_start)
        else:
            raise KafkaError(f"OFFSET_OUT_OF_RANGE from leader {self.leader.node_id}")
