"""A confluent-kafka (librdkafka) transactional producer for ``minibroker chaos --workload
transactions``, on the brokers' Kafka listener: a stock client's transactions judged by
the same checks as the bundled producer's.

It offers the bundled Producer's transactional methods (async, as ``TxnWorkload``
drives both the same way): librdkafka's blocking calls run in a worker thread, and its
errors are raised as the exception it is given, named after librdkafka's error (its broker
codes are Kafka's names; local ones start with ``_``, e.g. ``_TIMED_OUT``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import trio
from confluent_kafka import KafkaException, Producer


def rdkafka_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The bundled producer's settings under librdkafka's names (request.timeout.ms is
    socket.timeout.ms there; message.timeout.ms must not exceed transaction.timeout.ms)."""
    return {
        "transaction.timeout.ms": settings["transaction.timeout.ms"],
        "message.timeout.ms": settings["delivery.timeout.ms"],
        "socket.timeout.ms": settings["request.timeout.ms"],
        "retry.backoff.ms": settings["retry.backoff.ms"],
        "linger.ms": settings["linger.ms"],
    }


class RdkafkaTxnProducer:
    """``async with RdkafkaTxnProducer(kafka_bootstrap, transactional_id, settings, error)
    as p``: ``settings`` are the bundled producer's (max.block.ms bounds each blocking
    call), ``error(name)`` what librdkafka's errors are raised as."""

    def __init__(
        self,
        bootstrap: str,
        transactional_id: str,
        settings: Mapping[str, Any],
        error: Callable[[str], Exception],
    ) -> None:
        self.config = {**rdkafka_config(settings), "bootstrap.servers": bootstrap}
        self.config["transactional.id"] = transactional_id
        self.block_s = settings["max.block.ms"] / 1000
        self.error = error
        self.producer: Producer | None = None

    async def __aenter__(self) -> RdkafkaTxnProducer:
        self.producer = Producer(self.config)
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        producer, self.producer = self.producer, None

        def close() -> None:
            # Dropped in the worker thread: librdkafka's destroy waits for its threads.
            try:
                producer.purge()
                producer.flush(1)
            except KafkaException:
                pass  # a producer in a fatal state refuses even that; it is dropped anyway

        await trio.to_thread.run_sync(close, abandon_on_cancel=True)

    async def _blocking(self, method: str, *args: Any) -> Any:
        call = getattr(self.producer, method)
        try:
            return await trio.to_thread.run_sync(call, *args, abandon_on_cancel=True)
        except KafkaException as exc:
            raise self.error(exc.args[0].name()) from exc

    async def init_transactions(self) -> None:
        await self._blocking("init_transactions", self.block_s)

    def begin_transaction(self) -> None:
        try:
            self.producer.begin_transaction()
        except KafkaException as exc:
            raise self.error(exc.args[0].name()) from exc

    async def enqueue(self, topic: str, value: bytes, partition: int) -> None:
        self.producer.produce(topic, value, partition=partition)
        self.producer.poll(0)

    async def flush(self) -> None:
        if await self._blocking("flush", self.block_s):
            raise self.error("_TIMED_OUT")  # records still undelivered

    async def abort_transaction(self) -> None:
        await self._blocking("abort_transaction", self.block_s)

    async def commit_transaction(self) -> None:
        await self._blocking("commit_transaction", self.block_s)
