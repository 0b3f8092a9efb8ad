"""The chaos runs' readers: a live consumer that reads every partition of a topic while
the nemesis works, and the final read after the heal. The producers' workload reads
read_uncommitted; the transactional workload reads the same way with
``isolation.level=read_committed`` (and once more read_uncommitted, to see what aborts
wrote)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from minibroker.client import Consumer
from minibroker.protocol.errors import KafkaError

LIVE = {"fetch.max.wait.ms": 200, "request.timeout.ms": 3000}
FINAL_READ_TIMEOUT_S = 60.0


async def consume(
    bootstrap: str,
    topic: str,
    partitions: int,
    into: list[tuple[int, int, bytes]],
    stop: trio.Event,
    log: Callable[[str], None],
    **settings: Any,
) -> None:
    """Append (partition, offset, value) of every record read, in the order read, until
    ``stop``; a failed poll (a broker down) is retried."""
    async with Consumer(bootstrap, **{**LIVE, **settings}) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        while not stop.is_set():
            try:
                records = await consumer.poll(timeout_ms=200)
            except KafkaError as exc:
                log(f"consumer of {topic}: {exc.code.name}; retrying")
                await trio.sleep(0.2)
                continue
            into.extend((r.partition, r.offset, r.value) for r in records)


async def read_to_end(
    bootstrap: str, topic: str, partitions: int, **settings: Any
) -> tuple[dict[tuple[int, int], bytes], bool]:
    """Every record from the start to the high watermark each partition has now:
    ((partition, offset) -> value, whether every partition was read to its end within
    FINAL_READ_TIMEOUT_S). A read_committed reader gets there only once every
    transaction in the log is decided (it reads up to the last stable offset)."""
    final: dict[tuple[int, int], bytes] = {}
    tps = [(topic, p) for p in range(partitions)]
    async with Consumer(bootstrap, **{"fetch.max.wait.ms": 100, **settings}) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning()
        ends = await consumer.end_offsets(tps)  # ListOffsets latest: the high watermarks
        with trio.move_on_after(FINAL_READ_TIMEOUT_S):
            while True:
                positions = [await consumer.position(tp) for tp in tps]
                if all(at >= ends[tp] for at, tp in zip(positions, tps, strict=True)):
                    return final, True
                for r in await consumer.poll(timeout_ms=500):
                    final[(r.partition, r.offset)] = r.value
    return final, False
