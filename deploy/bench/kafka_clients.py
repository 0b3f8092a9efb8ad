"""`minibroker bench kafka-clients`: stock Kafka clients through the Kafka listener.

Produces ``--records`` records of ``--size`` bytes with acks=all into a new topic (3
partitions, replication factor min(3, brokers)), then consumes them from the beginning
(assign), with one of confluent-kafka (librdkafka), kafka-python or aiokafka.
``--client mock`` drives confluent-kafka against librdkafka's own mock cluster
(``test.mock.num.brokers=3``: no replication, acks ignored) as the reference of the same
sitting; its consumer figure is no reference (the mock keeps 5 MiB a partition).

Latency (confluent): ``--rate R`` paces the producer at R records/s, ``--rate-of-max F``
first produces flat out and then paces at F times the rate it reached (the issue's
"p99 at 80 % of our own maximum" in one command). Pacing sleeps in the client's own poll
until the next record is due and then produces every record due by now, so a client
descheduled on a loaded machine catches up in one burst instead of spinning; the figures
say whether it held the rate (``rate_achieved``, ``held``) and how late its bursts were
(``lateness_ms_p99``, ``_max``). Delivery latency is librdkafka's own, from produce() to
the acknowledgement (Message.latency), of every tenth record. One JSON line, as every benchmark.

``--idle-topics N`` first creates N 3-partition topics nobody writes to, waits until
their followers are in sync, and deletes them after the run: what a development cluster
that gathered topics pays for them on each write (the leader still reads every partition
of a follower's fetch session each round).

The clients come with the ``test`` extra (``pip install 'minibroker[test]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from minibroker.deploy.bench.common import percentile, report

CLIENTS = ("confluent", "kafka-python", "aiokafka", "mock")
# What the confluent clients get unless --producer-property / --consumer-property say
# otherwise. The consumer's one change: with queued.min.messages (100,000) records
# prefetched, librdkafka stops fetching a partition for fetch.queue.backoff.ms (1,000 ms
# by default), so a broker that answers faster than the application drains the queue
# leaves its consumer idle most of each second (200,000 records took 1.2 s, 1 s of it
# this pause; debug=fetch: "Fetch backoff for 1000ms: Local: Queue full"), against
# Kafka as against us. At 10 ms the figure is the broker's and the client's work, not
# the pause; ``--consumer-property fetch.queue.backoff.ms=1000`` measures the default.
PRODUCER_DEFAULTS = {
    "acks": "all",
    "linger.ms": "5",
    "queue.buffering.max.messages": "1000000",
}
CONSUMER_DEFAULTS = {"fetch.queue.backoff.ms": "10"}
# A paced run times one record in this many (the others cost no Python callback).
LATENCY_SAMPLE = 10
# A paced run holds its rate if it produced at this fraction of it or more.
HELD = 0.97
# The shortest wait between bursts (librdkafka's poll counts whole milliseconds).
_MIN_WAIT_S = 0.001


def _property(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", default="127.0.0.1:9192", help="Kafka listeners (cluster up's)")
    p.add_argument(
        "--client", choices=CLIENTS, default="confluent", help="the Kafka client library"
    )
    p.add_argument("--records", type=int, default=200_000, help="records produced, then consumed")
    p.add_argument("--size", type=int, default=100, help="value bytes (default 100)")
    pacing = p.add_mutually_exclusive_group()
    pacing.add_argument(
        "--rate",
        type=int,
        default=0,
        help="records/s to pace at (confluent; 0: flat out)",
    )
    pacing.add_argument(
        "--rate-of-max",
        type=float,
        default=0.0,
        metavar="F",
        help="produce flat out, then paced at F times that rate (confluent), e.g. 0.8",
    )
    for role, defaults in (
        ("producer", PRODUCER_DEFAULTS),
        ("consumer", CONSUMER_DEFAULTS),
    ):
        p.add_argument(
            f"--{role}-property",
            type=_property,
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=f"confluent {role} setting, librdkafka's name (bench defaults: {defaults})",
        )
    p.add_argument("--no-consume", action="store_true", help="produce only")
    p.add_argument(
        "--idle-topics",
        type=int,
        default=0,
        metavar="N",
        help="first create N idle 3-partition topics (deleted after the run): what the "
        "brokers pay for partitions nobody writes to",
    )


def paced(
    produce: Callable[[int], None],
    wait: Callable[[float], None],
    records: int,
    rate: float,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Call ``produce(i)`` for each of ``records`` at ``rate`` a second: ``wait(s)`` until
    the next record is due, then every record due by now in one burst. A late wake-up
    (a loaded machine) is made up at once, not spread, and a client behind its schedule
    does not wait at all: the schedule is the clock's, so the rate achieved is the rate
    asked unless the client cannot produce that fast."""
    start = clock()
    sent = 0
    lateness = []  # per burst: how long after its due time its first record went
    while sent < records:
        now = clock()
        due = min(records, int((now - start) * rate) + 1)
        if due > sent:
            lateness.append(now - start - sent / rate)
            for i in range(sent, due):
                produce(i)
            sent = due
        else:  # nothing due: sleep until the next record is
            wait(max(start + sent / rate - now, _MIN_WAIT_S))
    # N records at ``rate`` fill N / rate seconds: the last one is due 1 / rate before.
    achieved = records / (clock() - start + 1 / rate)
    lateness.sort()
    return {
        "rate": round(rate),
        "rate_achieved": round(min(achieved, rate)),
        "held": achieved >= HELD * rate,
        "lateness_ms_p99": round(percentile(lateness, 0.99) * 1000, 2),
        "lateness_ms_max": round(lateness[-1] * 1000, 2),
    }


def _confluent(args: argparse.Namespace, topic: str) -> dict[str, Any]:
    from confluent_kafka import Producer

    mock = args.client == "mock"
    conf: dict[str, Any] = (
        {"test.mock.num.brokers": 3} if mock else {"bootstrap.servers": args.bootstrap}
    )
    if not mock:
        create_rdkafka_topic(args.bootstrap, topic, 3)
    producer_conf = {**conf, **PRODUCER_DEFAULTS, **dict(args.producer_property)}
    value = b"x" * args.size
    out: dict[str, Any] = {}

    def produce_all(rate: float) -> dict[str, Any]:
        latencies: list[float] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                latencies.append(msg.latency())

        producer = Producer(producer_conf)
        # Paced, every LATENCY_SAMPLE-th record is timed: a Python callback per record
        # cost the client ~1 us each, enough to make it miss the rate it was asked for.
        sample = LATENCY_SAMPLE if rate else 0

        def produce(i: int) -> None:
            while True:
                try:
                    if sample and i % sample == 0:
                        producer.produce(topic, value, partition=i % 3, on_delivery=delivered)
                    else:
                        producer.produce(topic, value, partition=i % 3)
                    return
                except BufferError:
                    producer.poll(0.01)

        start = time.perf_counter()
        if rate:
            figures = paced(produce, producer.poll, args.records, rate)
        else:
            for i in range(args.records):
                produce(i)
            figures = {}
        figures["unflushed"] = producer.flush(120)
        elapsed = time.perf_counter() - start
        figures["produce_records_per_s"] = round(args.records / elapsed)
        if latencies:
            latencies.sort()
            for name, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0)):
                figures[f"delivery_ms_{name}"] = round(percentile(latencies, q) * 1000, 2)
        return figures  # the producer goes: its threads would compete with what follows

    if args.rate_of_max:
        out |= produce_all(0)
        out["paced"] = produce_all(args.rate_of_max * out["produce_records_per_s"])
    else:
        out |= produce_all(args.rate)
    if args.no_consume or mock:
        return out
    consumer_conf = {**conf, **CONSUMER_DEFAULTS, **dict(args.consumer_property)}
    expected = args.records * (2 if args.rate_of_max else 1)
    _, got, elapsed = rdkafka_consume(consumer_conf, topic, 3, expected)
    out["consume_records_per_s"] = round(got / elapsed)
    return out


def create_rdkafka_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create ``topic`` with confluent-kafka's AdminClient, replication factor min(3, brokers)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: the futures die with it
    brokers = len(admin.list_topics(timeout=10).brokers)
    futures = admin.create_topics([NewTopic(topic, partitions, min(3, brokers))])
    for future in futures.values():
        future.result(30)


def create_idle_topics(bootstrap: str, topics: list[str], timeout: float = 120) -> None:
    """Create ``topics`` (3 partitions each, replication factor min(3, brokers)) and wait
    until every replica of every partition is in sync: only then do the followers fetch
    them, which is the cost the run is to include."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    rf = min(3, len(admin.list_topics(timeout=10).brokers))
    for future in admin.create_topics([NewTopic(t, 3, rf) for t in topics]).values():
        future.result(timeout)
    deadline = time.monotonic() + timeout
    wanted = set(topics)
    while True:
        listed = admin.list_topics(timeout=10).topics
        if all(
            t in listed
            and len(listed[t].partitions) == 3
            and all(len(p.isrs) == rf for p in listed[t].partitions.values())
            for t in wanted
        ):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(topics)} idle topics were not all in sync after {timeout} s")
        time.sleep(0.1)


def delete_topics(bootstrap: str, topics: list[str], timeout: float = 120) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(topics).values():
        future.result(timeout)


def rdkafka_consume(
    conf: dict[str, Any],
    topic: str,
    partitions: int,
    expected: int,
    timeout: float = 120,
    from_first: bool = False,
) -> tuple[int, int, float]:
    """Read ``topic`` from the start (assign, no group) with a confluent-kafka consumer of
    ``conf`` until ``expected`` records came or ``timeout`` s passed: (records read,
    records timed, seconds). Control records (transaction markers) are never counted:
    librdkafka does not hand them out. ``from_first``: the clock starts when the first
    records arrive and they are not counted, so the rate is the reading's, without the
    consumer's connections and first fetch (on a small topic those would be most of it)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**conf, "group.id": "unused", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = uncounted = 0
    start = opened = time.perf_counter()
    while got < expected:
        # consume(n, timeout) returns when n records came or the timeout passed: asking for
        # more than are left made every read of a record count not a multiple of 10,000
        # wait out the timeout at its end (2,000 records "read at 1,997/s").
        messages = consumer.consume(min(10000, expected - got), 1)
        if not messages and time.perf_counter() - opened > timeout:
            break
        got += sum(1 for m in messages if m.error() is None)
        if from_first and got and not uncounted and got < expected:
            uncounted, start = got, time.perf_counter()
    elapsed = time.perf_counter() - start
    consumer.close()
    return got, got - uncounted, elapsed


def _kafka_python(args: argparse.Namespace, topic: str) -> dict[str, Any]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic

    servers = args.bootstrap.split(",")
    admin = KafkaAdminClient(bootstrap_servers=servers)
    admin.create_topics([NewTopic(topic, 3, min(3, len(servers)))])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=servers, acks="all", linger_ms=5)
    value = b"x" * args.size
    start = time.perf_counter()
    for i in range(args.records):
        producer.send(topic, value, partition=i % 3)
    producer.flush(300)
    out: dict[str, Any] = {
        "produce_records_per_s": round(args.records / (time.perf_counter() - start))
    }
    producer.close()
    if args.no_consume:
        return out
    consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
    consumer.assign([TopicPartition(topic, p) for p in range(3)])
    consumer.seek_to_beginning()
    got = 0
    start = time.perf_counter()
    while got < args.records and time.perf_counter() - start < 300:
        got += sum(len(r) for r in consumer.poll(timeout_ms=1000, max_records=10000).values())
    out["consume_records_per_s"] = round(got / (time.perf_counter() - start))
    consumer.close()
    return out


async def _aiokafka(args: argparse.Namespace, topic: str) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=args.bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, 3, min(3, len(args.bootstrap.split(","))))])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, acks="all", linger_ms=5)
    await producer.start()
    value = b"x" * args.size
    start = time.perf_counter()
    futures = [await producer.send(topic, value, partition=i % 3) for i in range(args.records)]
    await asyncio.gather(*futures)
    out: dict[str, Any] = {
        "produce_records_per_s": round(args.records / (time.perf_counter() - start))
    }
    await producer.stop()
    if args.no_consume:
        return out
    consumer = AIOKafkaConsumer(bootstrap_servers=args.bootstrap, enable_auto_commit=False)
    await consumer.start()
    consumer.assign([TopicPartition(topic, p) for p in range(3)])
    await consumer.seek_to_beginning()
    got = 0
    start = time.perf_counter()
    while got < args.records and time.perf_counter() - start < 300:
        batches = await consumer.getmany(timeout_ms=1000, max_records=10000)
        got += sum(len(r) for r in batches.values())
    out["consume_records_per_s"] = round(got / (time.perf_counter() - start))
    await consumer.stop()
    return out


def bench(args: argparse.Namespace) -> dict[str, Any]:
    confluent_only = (
        args.rate,
        args.rate_of_max,
        args.producer_property,
        args.consumer_property,
    )
    if any(confluent_only) and args.client not in ("confluent", "mock"):
        raise ValueError("--rate, --rate-of-max and the properties are for confluent and mock")
    if args.idle_topics and args.client == "mock":
        raise ValueError("--idle-topics needs a cluster: the mock has no replication")
    topic = f"kbench-{uuid.uuid4().hex[:8]}"
    idle = [f"{topic}-idle-{i}" for i in range(args.idle_topics)]
    try:
        if idle:
            create_idle_topics(args.bootstrap, idle)
        if args.client in ("confluent", "mock"):
            out = _confluent(args, topic)
        elif args.client == "kafka-python":
            out = _kafka_python(args, topic)
        else:
            out = asyncio.run(_aiokafka(args, topic))
    except ImportError as exc:
        raise SystemExit(
            f"error: {exc.name} is not installed: pip install 'minibroker[test]'"
        ) from None
    finally:
        if idle:
            delete_topics(args.bootstrap, idle)
    return {
        "client": args.client,
        "records": args.records,
        "size": args.size,
        **out,
        "params": {"bootstrap": None if args.client == "mock" else args.bootstrap,
                   "rate": args.rate, "rate_of_max": args.rate_of_max, "acks": "all",
                   "partitions": 3, "idle_topics": args.idle_topics,
                   **_confluent_params(args)},
    }  # fmt: skip


def _confluent_params(args: argparse.Namespace) -> dict[str, Any]:
    if args.client not in ("confluent", "mock"):
        return {}
    return {
        "producer": {**PRODUCER_DEFAULTS, **dict(args.producer_property)},
        "consumer": {**CONSUMER_DEFAULTS, **dict(args.consumer_property)},
    }


def run(args: argparse.Namespace) -> int:
    return report(bench, args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="minibroker bench kafka-clients")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
