"""The transactional producer's requests (Kafka's TransactionManager, the I/O half).

The producer's methods call these; the rules (states, which error is fatal) are in
client/txn_state.py. Requests go to the transactional id's coordinator (FindCoordinator
key_type 1, followed when it moves: client/coordinator.py), and TxnOffsetCommit to the
group's. An answer the coordinator gives while a previous commit or abort is still
completing (CONCURRENT_TRANSACTIONS), while it loads (COORDINATOR_LOAD_IN_PROGRESS) or
about a partition left out of a failed request (OPERATION_NOT_ATTEMPTED) is retried
after retry.backoff.ms, up to max.block.ms, as Kafka's blocking methods wait. A method
that timed out (RequestTimedOut) may be called again: it resumes where it stopped.

AddPartitionsToTxn is not a method: the sender asks for it (``add_partitions``) the
first time a batch for a partition of the open transaction is ready, and holds that
partition's batches until the coordinator has added it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import trio

from minibroker.client.cluster import Cluster
from minibroker.client.coordinator import GROUP, TRANSACTION, CoordinatorRoute
from minibroker.client.idempotence import IdempotenceState
from minibroker.client.txn_state import (
    RETRY,
    TopicPartition,
    TransactionState,
    TxnState,
    coordinator_error,
)
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, KafkaError, RequestTimedOut


class ConsumerGroupMetadata(NamedTuple):
    """Kafka's ConsumerGroupMetadata: what a consumer's group_metadata() gives
    send_offsets_to_transaction, so the group can fence a zombie member's commit
    (KIP-447)."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


class TransactionManager:
    """One transactional producer's conversation with its coordinators."""

    def __init__(
        self,
        config: Mapping[str, Any],
        cluster: Cluster,
        idempotence: IdempotenceState,
        state: TransactionState,
        log: Callable[..., None],
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.idem = idempotence
        self.state = state
        self.log = log
        self.transactional_id: str = config["transactional.id"]
        self.timeout_ms: int = config["transaction.timeout.ms"]
        self.max_block: float = config["max.block.ms"] / 1000
        self.backoff: float = config["retry.backoff.ms"] / 1000
        self.route = CoordinatorRoute(cluster, self.transactional_id, TRANSACTION, config)
        self.adding = False  # an AddPartitionsToTxn is in flight

    def _producer(self) -> dict:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.idem.producer_id,
            "producer_epoch": self.idem.epoch,
        }

    async def _call(
        self,
        api_key: int,
        body: dict | Callable[[], dict],
        codes: Callable[[dict], list[int]],
        route: CoordinatorRoute | None = None,
    ) -> dict:
        """Ask the coordinator until its answer has no retriable code (or max.block.ms
        passes: RequestTimedOut); a code that is not retried is raised (fatal or
        abortable per txn_state.FATAL). ``body`` may be a function: asked each time."""
        route = route or self.route
        deadline = time.monotonic() + self.max_block
        failed: KafkaError | None = None  # the last retriable failure, for the timeout's message
        while True:
            left = deadline - time.monotonic()
            try:
                answer = await route.call(api_key, body() if callable(body) else body, max(left, 0))
            except KafkaError as exc:
                if not exc.retriable:
                    raise
                answer, failed = None, exc
            if answer is not None:
                found = [ErrorCode.parse(c) for c in codes(answer) if c]
                if not found:
                    return answer
                final = [c for c in found if c not in RETRY]
                if final:
                    raise coordinator_error(final[0], answer.get("error_message") or "")
                if (
                    ErrorCode.NOT_COORDINATOR in found
                    or ErrorCode.COORDINATOR_NOT_AVAILABLE in found
                ):
                    route.coordinator = None
                self.log("txn_retry", api=ApiKey(api_key).name, error=found[0].name)
            if time.monotonic() + self.backoff >= deadline:
                # Named after the call and the id, whatever timed out underneath (a
                # coordinator that never answered, or kept answering "retry").
                raise RequestTimedOut(
                    f"{ApiKey(api_key).name} for transactional.id {self.transactional_id} did "
                    f"not complete within max.block.ms ({int(self.max_block * 1000)})"
                    + (f" ({failed})" if failed is not None else "")
                    + "; call the method again to resume"
                ) from failed
            await trio.sleep(self.backoff)

    async def _guarded(self, request: Any) -> Any:
        """Run a coordinator request; an error that is not a timeout decides the state."""
        try:
            return await request
        except RequestTimedOut:
            raise
        except KafkaError as exc:
            self.state.coordinator_failed(exc)
            raise

    # --- InitProducerId ---------------------------------------------------------------------

    async def init_producer_id(self, bump: bool = False) -> None:
        """A producer id and a new epoch for this transactional id: the coordinator fences
        every older epoch (and aborts what it left open). ``bump``: keep the id, ask for
        the next epoch (KIP-360, after an abort that left a sequence hole)."""
        body = {
            "transactional_id": self.transactional_id,
            "transaction_timeout_ms": self.timeout_ms,
            "producer_id": self.idem.producer_id if bump else -1,
            "producer_epoch": self.idem.epoch if bump else -1,
        }
        answer = await self._guarded(
            self._call(ApiKey.INIT_PRODUCER_ID, body, lambda a: [a["error_code"]])
        )
        self.idem.set_producer_id(answer["producer_id"], answer["producer_epoch"])
        self.log(
            "txn_producer_id",
            transactional_id=self.transactional_id,
            producer_id=answer["producer_id"],
            epoch=answer["producer_epoch"],
        )

    # --- AddPartitionsToTxn (asked by the sender) -------------------------------------------

    async def add_partitions(self, wanted: Callable[[], Iterable[TopicPartition]]) -> None:
        """Add the partitions ``wanted()`` names that the transaction lacks, in one request
        per round, until none is missing. Errors decide the state; the sender then fails
        what waits."""
        state = self.state
        try:
            while state.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING_TRANSACTION):
                missing = sorted(set(wanted()) - state.partitions)
                if not missing:
                    return
                topics: dict[str, list[int]] = {}
                for topic, partition in missing:
                    topics.setdefault(topic, []).append(partition)
                body = {
                    **self._producer(),
                    "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
                }
                await self._guarded(
                    self._call(
                        ApiKey.ADD_PARTITIONS_TO_TXN,
                        body,
                        lambda a: [p["error_code"] for t in a["results"] for p in t["partitions"]],
                    )
                )
                state.partitions.update(missing)
                state.started = True
        except RequestTimedOut as exc:
            state.abortable(exc)
        except KafkaError:
            pass  # the state says what happened (fatal or abortable)
        finally:
            self.adding = False

    # --- offsets (AddOffsetsToTxn, then TxnOffsetCommit) ------------------------------------

    async def send_offsets(
        self, offsets: Mapping[TopicPartition, int], group: ConsumerGroupMetadata
    ) -> None:
        """The group's offsets become part of the transaction: committed with it, dropped
        if it aborts (KIP-98's AddOffsetsToTxn, KIP-447's TxnOffsetCommit)."""
        await self._guarded(
            self._call(
                ApiKey.ADD_OFFSETS_TO_TXN,
                {**self._producer(), "group_id": group.group_id},
                lambda a: [a["error_code"]],
            )
        )
        self.state.started = True
        topics: dict[str, list[dict]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            topics.setdefault(topic, []).append(
                {"partition": partition, "committed_offset": offset, "committed_metadata": ""}
            )
        body = {
            **self._producer(),
            "group_id": group.group_id,
            "generation_id": group.generation_id,
            "member_id": group.member_id,
            "group_instance_id": group.group_instance_id,
            "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
        }
        group_route = CoordinatorRoute(self.cluster, group.group_id, GROUP, self.config)
        await self._guarded(
            self._call(
                ApiKey.TXN_OFFSET_COMMIT,
                body,
                lambda a: [p["error_code"] for t in a["topics"] for p in t["partitions"]],
                group_route,
            )
        )

    # --- EndTxn ---------------------------------------------------------------------------

    async def end_txn(self, commit: bool) -> None:
        """Commit or abort at the coordinator (a retry of one that completed is answered
        as done)."""
        if not self.state.started:
            return  # the coordinator never heard of this transaction: nothing to end
        await self._guarded(
            self._call(
                ApiKey.END_TXN,
                {**self._producer(), "committed": commit},
                lambda a: [a["error_code"]],
            )
        )
