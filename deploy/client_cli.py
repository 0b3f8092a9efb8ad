"""`minibroker topics|produce|consume`: the client library on the command line.

Every failure ends as one line on stderr that names the problem (by its Kafka error
code where there is one) and what to do, and a non-zero exit; never a traceback.

The argument definitions import nothing heavy: trio and the client's classes are imported
by the functions that run a command, so `minibroker topics list --help` (or a typo in an
option) starts in a few tens of ms, not the ~0.2 s the client costs to import.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from minibroker.client.config import DEFAULT_BOOTSTRAP, parse_properties
from minibroker.deploy import exit_codes, interrupt
from minibroker.protocol.errors import (
    BrokerNotAvailable,
    KafkaError,
    ThrottlingQuotaExceeded,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)

if TYPE_CHECKING:
    from minibroker.client import Consumer, Producer

EXIT_ERROR = exit_codes.USER_ERROR
EXIT_NOT_DELIVERED = exit_codes.NOT_DELIVERED


class CliError(Exception):
    """A failure already phrased for the user."""


def default_bootstrap() -> str:
    return os.environ.get("MINIBROKER_BOOTSTRAP") or DEFAULT_BOOTSTRAP


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap",
        default=None,
        metavar="HOST:PORT",
        help=f"a broker to start from (default: $MINIBROKER_BOOTSTRAP or {DEFAULT_BOOTSTRAP})",
    )
    p.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any client setting by its Kafka name, e.g. linger.ms=5 (repeatable)",
    )


def add_topics_arguments(topics: argparse.ArgumentParser) -> None:
    tsub = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    create = tsub.add_parser("create", help="create a topic")
    create.add_argument("topic", help="the new topic's name")
    create.add_argument(
        "--partitions",
        type=int,
        default=-1,
        help="partition count (default: broker's num.partitions)",
    )
    create.add_argument(
        "--replication-factor",
        type=int,
        default=-1,
        help="copies of each partition (default: broker's default.replication.factor)",
    )
    create.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="topic setting, e.g. min.insync.replicas=2 (repeatable)",
    )
    create.set_defaults(func=_cmd(_topics_create))
    lst = tsub.add_parser("list", help="list topic names")
    lst.add_argument(
        "--include-internal",
        action="store_true",
        help="also list internal topics (names starting with '__'), hidden by default",
    )
    lst.set_defaults(func=_cmd(_topics_list))
    describe = tsub.add_parser("describe", help="partitions, leaders, replicas and ISR")
    describe.add_argument("topic", nargs="*", help="topics to describe (default: all)")
    describe.set_defaults(func=_cmd(_topics_describe))
    delete = tsub.add_parser("delete", help="delete topics, their partitions and files")
    delete.add_argument("topics", nargs="+", metavar="TOPIC", help="topics to delete")
    delete.set_defaults(func=_cmd(_topics_delete))
    alter = tsub.add_parser("alter", help="add partitions to a topic (kafka-topics.sh --alter)")
    alter.add_argument("topic", help="the topic to grow")
    alter.add_argument("--partitions", type=int, required=True, help="the new partition count")
    alter.add_argument(
        "--replica-assignment",
        metavar="B:B,B:B",
        help="replicas of each new partition: partitions split by ',', brokers by ':' "
        "(default: the controller places them)",
    )
    alter.add_argument("--validate-only", action="store_true", help="check, change nothing")
    alter.set_defaults(func=_cmd(_topics_alter))
    for p in (create, lst, describe, delete, alter):
        _common(p)


def add_produce_arguments(produce: argparse.ArgumentParser) -> None:
    produce.add_argument("topic", help="the topic to send to (it must exist)")
    produce.add_argument(
        "--key-separator", metavar="SEP", help="split each line at the first SEP into key and value"
    )
    produce.add_argument("--acks", choices=["all", "-1", "0", "1"], help="acks (default: all)")
    produce.add_argument(
        "--partition",
        type=int,
        help="send every record to this partition (default: the key's hash, else sticky)",
    )
    _common(produce)
    produce.set_defaults(func=_cmd(_produce))


def add_consume_arguments(consume: argparse.ArgumentParser) -> None:
    consume.add_argument("topic", help="the topic to read")
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the earliest record")
    start.add_argument(
        "--offset", type=int, help="start at this offset (default: the end, only new records)"
    )
    consume.add_argument("--partition", type=int, help="read only this partition (default: all)")
    consume.add_argument(
        "--max-messages", type=int, help="exit after this many records (default: no limit)"
    )
    consume.add_argument(
        "--timeout-ms",
        type=int,
        help="exit when no record arrives for this long (default: wait for ever)",
    )
    consume.add_argument("--print-key", action="store_true", help="print KEY<separator>VALUE")
    consume.add_argument(
        "--key-separator",
        default="\t",
        metavar="SEP",
        help="separator for --print-key (default: tab)",
    )
    consume.add_argument(
        "--group", metavar="G", help="consume as a member of group G (subscribe; commits offsets)"
    )
    consume.add_argument(
        "--group-instance-id",
        metavar="ID",
        help="with --group: a static member (group.instance.id): run again with the same ID "
        "within session.timeout.ms and it gets its partitions back without a rebalance",
    )
    consume.add_argument(
        "--print-offset",
        action="store_true",
        help="prefix each record with Partition:P<TAB>Offset:O<TAB> (Kafka's print.offset)",
    )
    _common(consume)
    consume.set_defaults(func=_cmd(_consume))


# --- error handling ---------------------------------------------------------------------------


def describe_error(exc: BaseException, args: argparse.Namespace) -> str:
    """One line saying what went wrong and what to do."""
    from minibroker.client.cluster import NO_BROKER_ANSWERED

    if isinstance(exc, BrokerNotAvailable) and exc.message.startswith(
        (NO_BROKER_ANSWERED, "cannot connect to ")
    ):
        from minibroker.deploy.kafka_probe import kafka_listener_hint

        hint = kafka_listener_hint(
            exc.message, getattr(args, "bootstrap", None) or default_bootstrap()
        )
        if hint is not None:
            return hint
    if isinstance(exc, BrokerNotAvailable) and exc.message.startswith(NO_BROKER_ANSWERED):
        # Every address was tried, and the message says what happened to each.
        return (
            f"{exc.message}: is the cluster running? 'minibroker cluster up' starts one, "
            "'minibroker cluster status' shows which brokers are down or paused; give every "
            "broker in --bootstrap (or MINIBROKER_BOOTSTRAP)"
        )
    if isinstance(exc, BrokerNotAvailable) and exc.message.startswith("cannot connect to "):
        where, _, reason = exc.message.removeprefix("cannot connect to ").partition(": ")
        return (
            f"cannot connect to {where} ({reason}): is a broker running? "
            "start one with 'minibroker cluster up'; if a cluster runs, give every broker "
            "in --bootstrap (or MINIBROKER_BOOTSTRAP) and see 'minibroker cluster status'"
        )
    if isinstance(exc, UnknownTopicOrPartition):
        topic = getattr(args, "topic", None)
        if isinstance(topic, list) and len(topic) == 1:  # topics describe T
            topic = topic[0]
        hint = (
            f": create it with 'minibroker topics create {topic}'" if isinstance(topic, str) else ""
        )
        return f"{exc}{hint}"
    if isinstance(exc, TopicAlreadyExists):
        return f"{exc}: choose another name, or 'minibroker topics describe' it"
    if isinstance(exc, ThrottlingQuotaExceeded):
        return (
            f"{exc.code.name}: this client id's controller_mutation_rate (partitions created "
            "or deleted a second) is spent; try again in a few seconds, or see 'minibroker "
            "configs describe --entity-type clients'"
        )
    if isinstance(exc, KafkaError):
        return str(exc)
    if isinstance(exc, ValueError):
        return f"{exc} (see 'minibroker {args.command} --help')"
    return f"{type(exc).__name__}: {exc}"


def _cmd(
    main: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
) -> Callable[[argparse.Namespace], int]:
    @interrupt.handles_signals
    def run(args: argparse.Namespace) -> int:
        try:
            return interrupt.run(main, args)
        except BrokenPipeError:
            raise  # stdout's reader left: not an error to report (deploy/pipes.py)
        except CliError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_ERROR
        except (KafkaError, ValueError, OSError) as exc:
            print(f"error: {describe_error(exc, args)}", file=sys.stderr)
            return exit_codes.of(exc)

    return run


def _settings(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    settings = {"bootstrap.servers": args.bootstrap or default_bootstrap(), **extra}
    settings.update(parse_properties(args.property))
    return settings


# --- topics -----------------------------------------------------------------------------------


def is_internal(topic: str) -> bool:
    """minibroker's own topics (``__minibroker_health``), like Kafka's ``__consumer_offsets``."""
    return topic.startswith("__")


async def _topics_create(args: argparse.Namespace) -> int:
    from minibroker.client import Admin, NewTopic

    configs = parse_properties(args.config, "--config")
    async with Admin(config=_settings(args)) as admin:
        # Refused over the mutation quota: said at once, as kafka-topics.sh does.
        await admin.create_topics(
            [NewTopic(args.topic, args.partitions, args.replication_factor, configs)],
            retry_on_quota_violation=False,
        )
        desc = (await admin.describe_topics([args.topic]))[args.topic]
    print(f"Created topic {args.topic} with {len(desc.partitions)} partition(s).")
    return 0


async def _topics_delete(args: argparse.Namespace) -> int:
    from minibroker.client import Admin

    async with Admin(config=_settings(args)) as admin:
        await admin.delete_topics(args.topics, retry_on_quota_violation=False)
    for name in args.topics:
        print(f"Deleted topic {name}.")
    return 0


async def _topics_alter(args: argparse.Namespace) -> int:
    from minibroker.client import Admin, NewPartitions

    assignments = None
    if args.replica_assignment:
        try:
            assignments = [
                [int(b) for b in part.split(":")] for part in args.replica_assignment.split(",")
            ]
        except ValueError:
            raise CliError(
                f"--replica-assignment {args.replica_assignment!r}: expected broker ids, "
                "e.g. 0:1,1:2 (one replica list per new partition)"
            ) from None
    async with Admin(config=_settings(args)) as admin:
        await admin.create_partitions(
            {args.topic: NewPartitions(args.partitions, assignments)},
            validate_only=args.validate_only,
            retry_on_quota_violation=False,
        )
    verb = "Would grow" if args.validate_only else "Grew"
    print(f"{verb} topic {args.topic} to {args.partitions} partition(s).")
    return 0


async def _topics_list(args: argparse.Namespace) -> int:
    from minibroker.client import Admin

    async with Admin(config=_settings(args)) as admin:
        names = await admin.list_topics()
    for name in names:
        if args.include_internal or not is_internal(name):
            print(name)
    return 0


async def _topics_describe(args: argparse.Namespace) -> int:
    from minibroker.client import Admin

    async with Admin(config=_settings(args)) as admin:
        topics = await admin.describe_topics(args.topic or None)
    for name, desc in topics.items():
        rf = len(desc.partitions[0].replicas) if desc.partitions else 0
        print(f"Topic: {name}\tPartitionCount: {len(desc.partitions)}\tReplicationFactor: {rf}")
        for p in desc.partitions:
            print(
                f"\tTopic: {name}\tPartition: {p.partition}\tLeader: {p.leader}\tEpoch: {p.leader_epoch}"
                f"\tReplicas: {','.join(map(str, p.replicas))}\tIsr: {','.join(map(str, p.isr))}"
            )
    return 0


# --- produce ----------------------------------------------------------------------------------


async def _stdin_lines() -> Any:
    """Lines of stdin as bytes, read in chunks off the trio thread (interactive use works too).

    The thread reads the file descriptor, not ``sys.stdin.buffer``: an interrupt abandons
    a read that waits for a terminal, and a thread left holding the buffer's lock would
    stop the interpreter's exit ("could not acquire lock for <stdin>")."""
    import trio

    fd = sys.stdin.fileno()
    rest = b""
    while True:
        chunk = await trio.to_thread.run_sync(os.read, fd, 1 << 16, abandon_on_cancel=True)
        if not chunk:
            break
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            yield line.removesuffix(b"\r")
    if rest:
        yield rest


class DeliveryTally:
    """Counts outcomes as handles finish, so memory stays flat on endless input."""

    def __init__(self) -> None:
        self.pending: list[Any] = []
        self.sent = 0
        self.failed: Counter[str] = Counter()
        self.first_error: BaseException | None = None

    def add(self, handle: Any) -> None:
        self.sent += 1
        self.pending.append(handle)
        if len(self.pending) >= 10000:
            self.collect()

    def collect(self) -> None:
        still = []
        for handle in self.pending:
            if not handle.done():
                still.append(handle)
                continue
            error = handle.exception()
            if error is not None:
                self.failed[
                    getattr(getattr(error, "code", None), "name", type(error).__name__)
                ] += 1
                self.first_error = self.first_error or error
        self.pending = still


TOPIC_WAIT_S = 1.0


async def _require_topic(producer: Producer, topic: str) -> None:
    """Fail fast on a topic the cluster says does not exist (UNKNOWN_TOPIC_OR_PARTITION
    for TOPIC_WAIT_S: with auto.create.topics.enable a metadata request would have created
    it). Only a broker's answer counts: other answers (no leader yet) and no answer at
    all (brokers down or silent) are left to the producer's own max.block.ms wait, whose
    error names them. A refresh is never cut short: one cut short has heard nothing."""
    import trio

    cluster = producer._cluster  # the producer's own metadata: no second connection
    deadline = trio.current_time() + TOPIC_WAIT_S
    while True:
        try:
            await cluster.refresh([topic])
        except KafkaError as exc:
            if not exc.retriable:
                raise
            return
        if cluster.partition_count(topic) is not None:
            return
        if cluster.topic_errors.get(topic, (0, None))[0] != UnknownTopicOrPartition.code:
            return
        if trio.current_time() >= deadline:
            raise UnknownTopicOrPartition(f"topic '{topic}' does not exist")
        await trio.sleep(0.1)


async def _produce(args: argparse.Namespace) -> int:
    from minibroker.client import Producer

    extra: dict[str, Any] = {"max.block.ms": 10000}
    if args.acks is not None:
        extra["acks"] = args.acks
    sep = args.key_separator.encode() if args.key_separator else None
    tally = DeliveryTally()
    async with Producer(config=_settings(args, **extra)) as producer:
        missing: KafkaError | None = None
        # An interrupt stops reading; the lines read so far are still delivered (flush).
        with interrupt.work():
            try:
                await _require_topic(producer, args.topic)
            except UnknownTopicOrPartition as exc:
                missing = exc
            async for line in _stdin_lines():
                key = None
                if sep is not None:
                    key, found, value = line.partition(sep)
                    if not found:
                        key, value = None, line
                else:
                    value = line
                try:
                    if missing is not None:
                        raise missing
                    tally.add(
                        await producer.enqueue(args.topic, value, key=key, partition=args.partition)
                    )
                except KafkaError as exc:
                    # Stop reading: the input may be endless, and nothing more would get through.
                    tally.sent += 1
                    tally.failed[exc.code.name] += 1
                    tally.first_error = tally.first_error or exc
                    break
        if missing is not None and tally.sent == 0:
            raise missing  # no input at all: still say that the topic is missing
        await producer.flush()
    tally.collect()
    if tally.failed:
        total = sum(tally.failed.values())
        codes = ", ".join(f"{code} x{n}" for code, n in tally.failed.most_common())
        print(
            f"error: {total} of {tally.sent} record(s) were not delivered: {codes}"
            f"{delivery_hint(tally.first_error, producer.config, args)}",
            file=sys.stderr,
        )
        return EXIT_NOT_DELIVERED
    return 0


def delivery_hint(
    error: BaseException | None, config: dict[str, Any], args: argparse.Namespace
) -> str:
    """What the failure means and where to look, in a parenthesis."""
    message = getattr(error, "message", "") or ""
    if isinstance(error, UnknownTopicOrPartition):
        return (
            f" ({message}: create it with 'minibroker topics create {args.topic}'; "
            "stopped reading input at the first failure)"
        )
    detail = f"{message}; " if message else ""
    if isinstance(error, KafkaError) and error.retriable:
        return (
            f" ({detail}still failing after delivery.timeout.ms={config['delivery.timeout.ms']}:"
            " check the brokers with 'minibroker cluster status')"
        )
    return f" ({message})" if message else ""


# --- consume ----------------------------------------------------------------------------------


async def _consume(args: argparse.Namespace) -> int:
    from minibroker.client import Consumer

    if args.group:
        return await _consume_group(args)
    if args.group_instance_id is not None:
        raise CliError("--group-instance-id names a member of a group: add --group G")
    settings = _settings(args)
    async with Consumer(config=settings) as consumer:
        count = await consumer.partitions_for(args.topic)
        if count is None:
            raise UnknownTopicOrPartition(f"topic '{args.topic}' does not exist")
        if args.partition is not None and not 0 <= args.partition < count:
            raise CliError(
                f"topic '{args.topic}' has {count} partition(s); there is no partition {args.partition}"
            )
        parts = [
            (args.topic, p)
            for p in ([args.partition] if args.partition is not None else range(count))
        ]
        consumer.assign(parts)
        if args.offset is not None:
            for tp in parts:
                consumer.seek(tp, args.offset)
        elif args.from_beginning:
            consumer.seek_to_beginning()
        elif "auto.offset.reset" not in settings:
            consumer.seek_to_end()
        printer = RecordPrinter(args)
        with interrupt.work():
            await printer.run(consumer)
    print(f"Processed a total of {printer.seen} messages", file=sys.stderr)
    return 0


async def _consume_group(args: argparse.Namespace) -> int:
    """As a group member: the group assigns partitions and remembers where it stopped."""
    if args.partition is not None or args.offset is not None:
        raise CliError(
            "--group takes its partitions and offsets from the group: drop "
            "--partition/--offset (reset a group with `minibroker groups reset-offsets`)"
        )
    import trio

    from minibroker.client import Consumer

    extra = {"auto.offset.reset": "earliest"} if args.from_beginning else {}
    async with Consumer(
        config=_settings(args, **extra),
        group_id=args.group,
        group_instance_id=args.group_instance_id,
    ) as consumer:
        if await consumer.partitions_for(args.topic) is None:
            raise UnknownTopicOrPartition(f"topic '{args.topic}' does not exist")
        consumer.subscribe([args.topic])
        printer = RecordPrinter(args)
        # An interrupt ends the printing; closing the consumer then commits and leaves.
        with interrupt.work():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_say_why_the_first_assignment_waits, consumer, args.group)
                await printer.run(consumer)
                nursery.cancel_scope.cancel()
    print(f"Processed a total of {printer.seen} messages", file=sys.stderr)
    return 0


FIRST_ASSIGNMENT_NOTICE_S = 1.0


async def _say_why_the_first_assignment_waits(consumer: Consumer, group: str) -> None:
    """One stderr line when the first assignment is late: the member has joined (the
    coordinator gave it a member id) but no generation has formed after
    FIRST_ASSIGNMENT_NOTICE_S. A new group's first rebalance waits
    group.initial.rebalance.delay.ms (3 s by default), again after each member that
    arrives meanwhile: two consumers started together waited 6 s, and nothing said why."""
    import trio

    await trio.sleep(FIRST_ASSIGNMENT_NOTICE_S)
    while True:
        _, generation, member_id, _ = consumer.group_metadata()
        if generation >= 0:
            return  # assigned: nothing to explain
        if member_id:
            print(
                f"waiting for group '{group}' to assign partitions: a new group's first "
                "rebalance waits group.initial.rebalance.delay.ms (broker setting, 3000 ms by "
                "default) for more members, again after each one that joins",
                file=sys.stderr,
                flush=True,
            )
            return
        await trio.sleep(0.1)


class RecordPrinter:
    """Prints records to stdout; ``seen`` counts them, also when an interrupt cut it short."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.seen = 0

    async def run(self, consumer: Consumer) -> None:
        args = self.args
        out = sys.stdout.buffer
        sep = args.key_separator.encode()
        idle_ms = args.timeout_ms if args.timeout_ms is not None else None
        while args.max_messages is None or self.seen < args.max_messages:
            want = None if args.max_messages is None else args.max_messages - self.seen
            records = await consumer.poll(
                timeout_ms=idle_ms if idle_ms is not None else 60_000, max_records=want
            )
            if not records:
                if idle_ms is not None:
                    break
                continue
            lines = []
            for r in records:
                value = b"null" if r.value is None else r.value
                if getattr(args, "print_offset", False):
                    value = f"Partition:{r.partition}\tOffset:{r.offset}\t".encode() + value
                if args.print_key:
                    lines.append((b"null" if r.key is None else r.key) + sep + value)
                else:
                    lines.append(value)
            self.seen += len(records)
            out.write(b"\n".join(lines) + b"\n")
            out.flush()  # `| head` that has had enough: BrokenPipeError, a quiet exit (pipes.py)
