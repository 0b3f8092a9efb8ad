"""`minibroker bench kafka-clients`: stock Kafka clients through the Kafka listener.

Produces ``--records`` records of ``--size`` bytes with acks=all into a new topic (3
partitions, replication factor min(3, brokers)), then consumes them from the beginning
(assign), with one of confluent-kafka (librdkafka), kafka-python or aiokafka.
``--client mock`` drives confluent-kafka against librdkafka's own mock cluster
(``test.mock.num.brokers=3``: no replication, acks ignored) as the reference of the same
sitting; its consumer figure is no reference (the mock keeps 5 MiB a partition).
``--rate`` paces the confluent producer and reports per-record delivery latency (p50,
p99), to read latency at a fraction of the maximum. One JSON line, as every benchmark.

The clients come with the ``test`` extra (``pip install 'minibroker[test]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from typing import Any

from minibroker.deploy.bench.common import percentile, report

CLIENTS = ("confluent", "kafka-python", "aiokafka", "mock")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", default="127.0.0.1:9192", help="Kafka listeners (cluster up's)")
    p.add_argument("--client", choices=CLIENTS, default="confluent")
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--size", type=int, default=100, help="value bytes (default 100)")
    p.add_argument(
        "--rate", type=int, default=0, help="records/s to pace at (confluent; 0: flat out)"
    )
    p.add_argument("--no-consume", action="store_true", help="produce only")


def _confluent(args: argparse.Namespace, topic: str) -> dict[str, Any]:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    mock = args.client == "mock"
    conf = {"test.mock.num.brokers": 3} if mock else {"bootstrap.servers": args.bootstrap}
    if not mock:
        admin = AdminClient(conf)  # kept: the futures die with their client
        brokers = len(admin.list_topics(timeout=10).brokers)
        futures = admin.create_topics([NewTopic(topic, 3, min(3, brokers))])
        for future in futures.values():
            future.result(30)
    producer = Producer(
        {**conf, "acks": "all", "linger.ms": 5, "queue.buffering.max.messages": 1_000_000}
    )
    value = b"x" * args.size
    latencies: list[float] = []

    def delivered(err: Any, msg: Any, at: float) -> None:
        if err is None:
            latencies.append(time.perf_counter() - at)

    start = time.perf_counter()
    for i in range(args.records):
        if args.rate:
            due = start + i / args.rate
            while time.perf_counter() < due:
                producer.poll(0)
        now = time.perf_counter()
        while True:
            try:
                producer.produce(
                    topic, value, partition=i % 3,
                    on_delivery=(lambda e, m, at=now: delivered(e, m, at)) if args.rate else None,
                )  # fmt: skip
                break
            except BufferError:
                producer.poll(0.01)
    unflushed = producer.flush(120)
    produce_s = time.perf_counter() - start
    out: dict[str, Any] = {
        "produce_records_per_s": round(args.records / produce_s),
        "unflushed": unflushed,
    }
    if latencies:
        latencies.sort()
        out["delivery_ms_p50"] = round(percentile(latencies, 0.5) * 1000, 2)
        out["delivery_ms_p99"] = round(percentile(latencies, 0.99) * 1000, 2)
    del producer  # its threads would compete with the consumer's
    if args.no_consume or mock:
        return out
    consumer = Consumer({**conf, "group.id": "unused", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    got = 0
    start = time.perf_counter()
    while got < args.records:
        messages = consumer.consume(10000, 1)
        if not messages and time.perf_counter() - start > 120:
            break
        got += sum(1 for m in messages if m.error() is None)
    out["consume_records_per_s"] = round(got / (time.perf_counter() - start))
    consumer.close()
    return out


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
    topic = f"kbench-{uuid.uuid4().hex[:8]}"
    try:
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
    return {
        "client": args.client,
        "records": args.records,
        "size": args.size,
        **out,
        "params": {"bootstrap": None if args.client == "mock" else args.bootstrap,
                   "rate": args.rate, "acks": "all", "partitions": 3},
    }  # fmt: skip


def run(args: argparse.Namespace) -> int:
    return report(bench, args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="minibroker bench kafka-clients")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
