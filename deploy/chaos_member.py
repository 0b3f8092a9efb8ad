"""One consumer-group member of ``minibroker chaos --workload groups``, as its own process
(so the nemesis can pause it with SIGSTOP: no polls, no heartbeats, as a stalled host).

``python -m minibroker.deploy.chaos_member BOOTSTRAP GROUP TOPIC NAME LOG``

It subscribes, and after every poll that returned records "processes" them (sleeps up to
PROCESS_MAX_S, as an application does its work between polls: a rebalance signalled
meanwhile waits for the next poll while the heartbeat thread goes on, as in Kafka) and
commits the positions it reached (enable.auto.commit=false), so what it consumed beyond
its last successful commit is exactly its uncommitted window. Everything it does goes to LOG as JSON lines, stamped
with wall-clock time (shared by every process on the machine) and the generation it held:
``assigned``/``revoked``/``lost`` (from its rebalance listener), ``consumed``,
``committed``/``commit_failed``, and the client's own group events (``client``: joined,
a stale answer ignored, ...). SIGTERM: it closes (leaves the group) and exits 0.
"""

from __future__ import annotations

import json
import random
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import trio

from minibroker.client import Consumer
from minibroker.protocol.errors import KafkaError

# Short timeouts so that a fault shows within a few seconds (the brokers are configured
# with group.min.session.timeout.ms low enough for them, see chaos.GROUP_BROKER_CONFIG).
MEMBER = {
    "session.timeout.ms": 4000,
    # (short, so that a member busy with a batch has sent another heartbeat by the time
    # it polls and joins, after the answer that asked it to rejoin: see PROCESS_MAX_S)
    "heartbeat.interval.ms": 100,
    "max.poll.interval.ms": 8000,  # also the rebalance timeout the member asks for
    "request.timeout.ms": 3000,
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "fetch.max.wait.ms": 200,
    # Enough per poll that PROCESS_MAX_S per batch keeps up with the producers.
    "max.poll.records": 10000,
}
# Longer than heartbeat.interval.ms: a heartbeat goes out between the answer that asked
# for a rebalance and the poll that joins, as with any application that works a while
# on each batch (the stale-answer interleaving of issue 35 needs one in flight).
PROCESS_MAX_S = 0.5


class Log:
    """A member's log line, stamped with the (generation, member id) ``held`` says the
    member's client holds right now (chaos_member_rdkafka.py writes the same lines)."""

    def __init__(self, out: TextIO, held: Callable[[], tuple[int, str]], name: str) -> None:
        self.out, self.held, self.name = out, held, name

    def __call__(self, event: str, **fields: Any) -> None:
        generation, member_id = self.held()
        line = {"t": time.time(), "m": self.name, "ev": event, "gen": generation}
        self.out.write(json.dumps({**line, "mid": member_id, **fields}) + "\n")
        self.out.flush()


class Listener:
    """The member's own assignment log: what it was given and when, in which generation."""

    def __init__(self, log: Log) -> None:
        self.log = log

    def on_partitions_assigned(self, partitions) -> None:
        self.log("assigned", tps=sorted(tp.partition for tp in partitions))

    def on_partitions_revoked(self, partitions) -> None:
        self.log("revoked", tps=sorted(tp.partition for tp in partitions))

    def on_partitions_lost(self, partitions) -> None:
        self.log("lost", tps=sorted(tp.partition for tp in partitions))


async def run(bootstrap: str, group: str, topic: str, name: str, out: TextIO) -> None:
    stop = trio.Event()
    rng = random.Random()
    async with trio.open_nursery() as nursery:

        async def on_sigterm() -> None:
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    stop.set()
                    return

        nursery.start_soon(on_sigterm)
        consumer = Consumer(bootstrap, group_id=group, **MEMBER)
        async with consumer:
            log = Log(out, lambda: consumer.group_metadata()[1:3], name)
            consumer.subscribe([topic], Listener(log))
            log("started")
            while not stop.is_set():
                try:
                    records = await consumer.poll(timeout_ms=200)
                except KafkaError as exc:
                    log("poll_error", error=exc.code.name)
                    await trio.sleep(0.1)
                    continue
                finally:
                    while consumer.group_events:  # joined, stale answers ignored, ...
                        event, fields = consumer.group_events.popleft()
                        log("client", what=event, **{k: str(v) for k, v in fields.items()})
                if not records:
                    continue
                log("consumed", recs=[[r.partition, r.offset, r.value.decode()] for r in records])
                await trio.sleep(rng.uniform(0, PROCESS_MAX_S))
                reached: dict[tuple[str, int], int] = {}
                for r in records:
                    reached[(topic, r.partition)] = r.offset + 1
                try:
                    await consumer.commit(reached)
                except KafkaError as exc:
                    log("commit_failed", error=exc.code.name)
                else:
                    log("committed", offsets={str(p): o for (_, p), o in reached.items()})
            log("stopping")
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    bootstrap, group, topic, name, path = argv if argv is not None else sys.argv[1:]
    with open(path, "a") as out:
        trio.run(run, bootstrap, group, topic, name, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
