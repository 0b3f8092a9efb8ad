"""One confluent-kafka (librdkafka) member of ``minibroker chaos --workload groups``, as its
own process, through the brokers' Kafka listener: a stock client in the same group as
the bundled members (deploy/chaos_member.py), judged by the same checks.

``python -m minibroker.deploy.chaos_member_rdkafka KAFKA_BOOTSTRAP GROUP TOPIC NAME LOG``

It behaves as the bundled member does (same timeouts, works on each batch for up to
PROCESS_MAX_S, commits synchronously what it reached after every batch) and writes the
same log lines: ``assigned``/``revoked``/``lost`` from confluent-kafka's on_assign,
on_revoke and on_lost callbacks, ``consumed``, ``committed``/``commit_failed``, each
stamped with the generation and member id librdkafka holds at that moment. SIGTERM: it
closes (leaves the group) and exits 0.
"""

from __future__ import annotations

import random
import signal
import struct
import sys
import time
from typing import TextIO

from confluent_kafka import Consumer, KafkaException, TopicPartition

from minibroker.deploy.chaos_member import MEMBER, PROCESS_MAX_S, Log

# The bundled member's settings under librdkafka's names (request.timeout.ms is
# socket.timeout.ms there; it has no max.poll.records: consume() is given the number).
RDKAFKA = {
    "session.timeout.ms": MEMBER["session.timeout.ms"],
    "heartbeat.interval.ms": MEMBER["heartbeat.interval.ms"],
    "max.poll.interval.ms": MEMBER["max.poll.interval.ms"],
    "socket.timeout.ms": MEMBER["request.timeout.ms"],
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "fetch.wait.max.ms": MEMBER["fetch.max.wait.ms"],
    # The bundled members' assignors, so that one protocol suits the whole group.
    "partition.assignment.strategy": "range,roundrobin",
}
_CGMD_MAGIC = b"CGMDv2:"


def generation(consumer: Consumer) -> int:
    """The generation librdkafka holds now (-1: none). confluent-kafka does not expose it
    but in the serialized consumer group metadata it hands to transactions:
    ``CGMDv2:``, then the generation as a native int32 (rd_kafka_consumer_group_metadata_write)."""
    raw = consumer.consumer_group_metadata()
    if not raw.startswith(_CGMD_MAGIC):
        raise ValueError(f"unexpected consumer group metadata {raw[:16]!r} from librdkafka")
    return struct.unpack_from("=i", raw, len(_CGMD_MAGIC))[0]


def held(consumer: Consumer) -> tuple[int, str]:
    try:
        member_id = consumer.memberid() or ""
    except (KafkaException, RuntimeError):
        member_id = ""
    return generation(consumer), member_id


def run(bootstrap: str, group: str, topic: str, name: str, out: TextIO) -> None:
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **RDKAFKA})
    log = Log(out, lambda: held(consumer), name)

    def on_assign(_, partitions) -> None:
        log("assigned", tps=sorted(tp.partition for tp in partitions))

    def on_revoke(_, partitions) -> None:
        log("revoked", tps=sorted(tp.partition for tp in partitions))

    def on_lost(_, partitions) -> None:
        log("lost", tps=sorted(tp.partition for tp in partitions))

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    log("started")
    rng = random.Random()
    while not stopping:
        messages = consumer.consume(MEMBER["max.poll.records"], 0.2)
        records = []
        for m in messages:
            if m.error() is not None:
                log("poll_error", error=m.error().name())
            else:
                records.append(m)
        if not records:
            continue
        log("consumed", recs=[[m.partition(), m.offset(), m.value().decode()] for m in records])
        time.sleep(rng.uniform(0, PROCESS_MAX_S))
        reached: dict[int, int] = {}
        for m in records:
            reached[m.partition()] = m.offset() + 1
        offsets = [TopicPartition(topic, p, o) for p, o in sorted(reached.items())]
        try:
            answered = consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log("commit_failed", error=exc.args[0].name())
            continue
        failed = [tp for tp in answered or () if tp.error is not None]
        if failed:
            log("commit_failed", error=failed[0].error.name())
        else:
            log("committed", offsets={str(p): o for p, o in reached.items()})
    log("stopping")
    consumer.close()


def main(argv: list[str] | None = None) -> int:
    bootstrap, group, topic, name, path = argv if argv is not None else sys.argv[1:]
    with open(path, "a") as out:
        run(bootstrap, group, topic, name, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
