"""`minibroker bench transactions`: issue 37's targets for exactly-once, in one sitting.

With confluent-kafka (librdkafka) through the Kafka listener, per round (``--rounds``,
figures are medians; the order of each pair alternates from round to round, so neither
side always runs on a warmer cluster):

- **produce**: ``--records`` records into a new topic (3 partitions, replication factor
  min(3, brokers)) in transactions of ``--txn-size`` (begin, produce, commit), against
  the idempotent producer flushing every ``--txn-size`` records into another new topic:
  both rates and their ratio (target: >= 0.8);
- **consume**: the transactional topic read from the start under ``read_committed``
  and under ``read_uncommitted``, each timed from its first records (not its
  connections), after an untimed read that warms the broker: both rates and their
  ratio (target: >= 0.9);
- **commit latency**: ``--commits`` / ``--rounds`` transactions of one record each,
  ``commit_transaction()`` timed from the call (the record produced just before, so the
  call covers what an application waits for: AddPartitionsToTxn and the produce it
  holds back, EndTxn, PrepareCommit on the ISR): p50/p99/max over all rounds (target:
  p99 <= 50 ms).

``--failover N`` adds N coordinator failovers mid-commit, always on a cluster this bench
started itself (it kills a broker). A transactional id coordinated by a broker other than
the active controller (killing that one would be a controller failover too) has its
markers held by a fault (WriteTxnMarkers answered NOT_ENOUGH_REPLICAS on the other data
leaders); EndTxn is answered (PrepareCommit), the coordinator's broker is SIGKILLed and
the faults cleared; timed until the new coordinator reports CompleteCommit (target:
within ``broker.session.timeout.ms`` + 1 s). The killed broker is restarted and
leadership put back before the next round.

Without ``--bootstrap`` it starts its own cluster (``cluster up``'s settings) and stops it
afterwards. Ends with one JSON line. The clients come with the ``test`` extra.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

from minibroker.broker.common.config import DEFS
from minibroker.client import Admin
from minibroker.client.config import parse_properties
from minibroker.deploy.bench.common import load_average, percentile, report
from minibroker.deploy.bench.kafka_clients import (
    CONSUMER_DEFAULTS,
    PRODUCER_DEFAULTS,
    create_rdkafka_topic,
    rdkafka_consume,
)
from minibroker.deploy.broker_cli import CommandError
from minibroker.deploy.cluster import LOCAL_CLUSTER_CONFIG

PARTITIONS = 3
SESSION_TIMEOUT = "broker.session.timeout.ms"
# How often the failover round asks the new coordinator for the transaction's state.
POLL_S = 0.01
TIMEOUT_S = 60.0
# Transactional ids tried for one whose coordinator is not the active controller.
CANDIDATE_IDS = 20
# Reads of the transactional topic per isolation level and round.
CONSUME_READS = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap",
        default=None,
        metavar="HOST:PORT",
        help="Kafka listeners of a running cluster (cluster up's: 127.0.0.1:9192); "
        "default: start a cluster of --brokers for the run",
    )
    p.add_argument("--brokers", type=int, default=3, help="brokers of the bench's own cluster")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (figures: medians)")
    p.add_argument("--records", type=int, default=100_000, help="records produced per round")
    p.add_argument("--txn-size", type=int, default=1000, help="records per transaction")
    p.add_argument("--size", type=int, default=100, help="value bytes (default 100)")
    p.add_argument("--commits", type=int, default=200, help="1-record commits timed in all")
    p.add_argument(
        "--failover",
        type=int,
        nargs="?",
        const=3,
        default=0,
        metavar="ROUNDS",
        help="coordinator kills mid-commit (3 if no number), on a cluster of the bench's own",
    )
    p.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="broker setting of the bench's own cluster, e.g. broker.session.timeout.ms=6000",
    )


def run(args: argparse.Namespace) -> int:
    return report(measure, args)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if min(args.rounds, args.txn_size, args.brokers, args.commits) < 1 or args.failover < 0:
        raise ValueError("--rounds, --txn-size, --brokers and --commits must be at least 1")
    if args.records < args.txn_size:
        raise ValueError("--records must be at least --txn-size (one whole transaction)")
    if args.failover and args.brokers < 3:
        raise ValueError("--failover needs --brokers 3 or more: the ISR must survive a kill")
    config = {
        **LOCAL_CLUSTER_CONFIG,
        **{k: str(v) for k, v in parse_properties(args.property).items()},
    }
    if args.failover:
        config["faults.enable"] = "true"
    load_before = load_average()
    with _own_cluster(args, config) as cluster:
        bootstrap = args.bootstrap or cluster.kafka_bootstrap
        rounds = [_round(bootstrap, args, n) for n in range(args.rounds)]
        commits = sorted(ms for r in rounds for ms in r.pop("commit_ms"))
        out: dict[str, Any] = {
            "bench": "transactions",
            **_medians(rounds),
            "commit_ms": {
                "p50": round(percentile(commits, 0.5), 2),
                "p99": round(percentile(commits, 0.99), 2),
                "max": round(commits[-1], 2),
                "count": len(commits),
            },
            "rounds": rounds,
        }
        if args.failover:
            failover = cluster if not args.bootstrap else None
            with _own_cluster(args, config, force=failover is None) as started:
                out["failover"] = _failovers(failover or started, args, config)
    out["load_average_before"] = load_before
    out["load_average_after"] = load_average()
    out["cpus"] = os.cpu_count()
    out["params"] = {
        "bootstrap": args.bootstrap or "own cluster",
        "brokers": None if args.bootstrap else args.brokers,
        "records": args.records // args.txn_size * args.txn_size,
        "txn_size": args.txn_size,
        "size": args.size,
        "partitions": PARTITIONS,
        "producer": PRODUCER_DEFAULTS,
        "consumer": CONSUMER_DEFAULTS,
        "cluster_config": None if args.bootstrap else config,
    }
    return out


@contextmanager
def _own_cluster(
    args: argparse.Namespace, config: dict[str, str], force: bool = False
) -> Iterator[Any]:
    """A LocalCluster (the pytest plugin's: faults, kill, restart, waits on metadata) the
    bench starts and stops; None when ``--bootstrap`` names one and ``force`` is off."""
    if args.bootstrap and not force:
        yield None
        return
    try:
        from minibroker.deploy.testing import start_cluster
    except ModuleNotFoundError as exc:
        raise CommandError(
            f"bench transactions needs {exc.name}: pip install 'minibroker[test]'"
        ) from None
    with tempfile.TemporaryDirectory(prefix="minibroker-txnbench-") as tmp:
        cluster = start_cluster(Path(tmp), args.brokers, config)
        try:
            yield cluster
        finally:
            cluster.close()


def _medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def median(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    return {
        "idempotent_records_per_s": round(median("idempotent_records_per_s")),
        "transactional_records_per_s": round(median("transactional_records_per_s")),
        "produce_ratio": round(median("produce_ratio"), 3),
        "read_uncommitted_records_per_s": round(median("read_uncommitted_records_per_s")),
        "read_committed_records_per_s": round(median("read_committed_records_per_s")),
        "consume_ratio": round(median("consume_ratio"), 3),
    }


def _producer(bootstrap: str, **conf: Any) -> Any:
    try:
        from confluent_kafka import Producer
    except ImportError as exc:
        raise CommandError(
            f"bench transactions needs {exc.name}: pip install 'minibroker[test]'"
        ) from None
    return Producer({"bootstrap.servers": bootstrap, **PRODUCER_DEFAULTS, **conf})


def _produce(producer: Any, topic: str, value: bytes, count: int) -> None:
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value, partition=i % PARTITIONS)
                break
            except BufferError:  # the client's queue is full: let it send
                producer.poll(0.01)


def _round(bootstrap: str, args: argparse.Namespace, n: int) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    value = b"x" * args.size
    txns = args.records // args.txn_size
    records = txns * args.txn_size
    topics = {kind: f"txnbench-{run_id}-{kind}" for kind in ("idempotent", "transactional")}
    for topic in topics.values():
        create_rdkafka_topic(bootstrap, topic, PARTITIONS)

    def idempotent() -> float:
        producer = _producer(bootstrap, **{"enable.idempotence": True})
        # Its producer id before the clock, as init_transactions gets the other's.
        _produce(producer, topics["idempotent"], value, 1)
        producer.flush(TIMEOUT_S)
        start = time.perf_counter()
        for _ in range(txns):
            _produce(producer, topics["idempotent"], value, args.txn_size)
            if producer.flush(TIMEOUT_S):
                raise ValueError("the idempotent producer could not flush in 60 s")
        return records / (time.perf_counter() - start)

    def transactional() -> float:
        producer = _producer(bootstrap, **{"transactional.id": f"txnbench-{run_id}"})
        producer.init_transactions(TIMEOUT_S)
        start = time.perf_counter()
        for _ in range(txns):
            producer.begin_transaction()
            _produce(producer, topics["transactional"], value, args.txn_size)
            producer.commit_transaction(TIMEOUT_S)
        return records / (time.perf_counter() - start)

    def consume(level: str) -> tuple[int, float]:
        conf = {"bootstrap.servers": bootstrap, **CONSUMER_DEFAULTS, "isolation.level": level}
        got, timed, elapsed = rdkafka_consume(
            conf, topics["transactional"], PARTITIONS, records, from_first=True
        )
        if got != records:
            raise ValueError(f"a {level} consumer read {got} of {records} committed records")
        return timed, elapsed

    out: dict[str, Any] = {}
    first, second = (idempotent, transactional) if n % 2 == 0 else (transactional, idempotent)
    for produce in (first, second):
        out[f"{produce.__name__}_records_per_s"] = round(produce())
    out["produce_ratio"] = round(
        out["transactional_records_per_s"] / out["idempotent_records_per_s"], 3
    )
    # An untimed read first: whichever consumer read the new topic first was the slower
    # by up to 2x. Then each level reads it CONSUME_READS times, the order alternating
    # (a read of 100,000 records takes ~0.1 s: one alone is mostly noise).
    consume("read_uncommitted")
    timed = {"read_uncommitted": [0, 0.0], "read_committed": [0, 0.0]}
    for i in range(CONSUME_READS):
        levels = list(timed) if (n + i) % 2 == 0 else list(timed)[::-1]
        for level in levels:
            count, seconds = consume(level)
            timed[level][0] += count
            timed[level][1] += seconds
    for level, (count, seconds) in timed.items():
        out[f"{level}_records_per_s"] = round(count / seconds)
    out["consume_ratio"] = round(
        out["read_committed_records_per_s"] / out["read_uncommitted_records_per_s"], 3
    )
    share = args.commits // args.rounds + (n < args.commits % args.rounds)
    out["commit_ms"] = _commit_latencies(bootstrap, topics["transactional"], run_id, share)
    _delete_topics(bootstrap, list(topics.values()))
    return out


def _commit_latencies(bootstrap: str, topic: str, run_id: str, count: int) -> list[float]:
    """Milliseconds each ``commit_transaction()`` of a 1-record transaction took."""
    producer = _producer(bootstrap, **{"transactional.id": f"txnbench-{run_id}-commits"})
    producer.init_transactions(TIMEOUT_S)
    latencies = []
    for i in range(count):
        producer.begin_transaction()
        producer.produce(topic, b"c", partition=i % PARTITIONS)
        start = time.perf_counter()
        producer.commit_transaction(TIMEOUT_S)
        latencies.append((time.perf_counter() - start) * 1000)
    return latencies


def _delete_topics(bootstrap: str, topics: list[str]) -> None:
    """The round's topics go: a `cluster up` cluster need not keep the bench's records."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(topics).values():
        future.result(30)


# --- coordinator failover mid-commit ----------------------------------------------------


async def _describe(bootstrap: str, transactional_id: str) -> Any:
    async with Admin(bootstrap, **{"retry.backoff.ms": 10}) as admin:
        return (await admin.describe_transactions([transactional_id]))[transactional_id]


def _failovers(cluster: Any, args: argparse.Namespace, config: dict[str, str]) -> dict[str, Any]:
    session_ms = int(config.get(SESSION_TIMEOUT, DEFS[SESSION_TIMEOUT].default))
    topic = f"txnbench-failover-{uuid.uuid4().hex[:8]}"
    create_rdkafka_topic(cluster.kafka_bootstrap, topic, PARTITIONS)
    rounds = [_failover(cluster, topic, n) for n in range(args.failover)]
    took = sorted(r["complete_commit_s"] for r in rounds)
    bound = session_ms / 1000 + 1
    return {
        "complete_commit_s": {"median": statistics.median(took), "max": took[-1]},
        SESSION_TIMEOUT: session_ms,
        "within_session_timeout_plus_1s": took[-1] <= bound,
        "rounds": rounds,
    }


def _coordinated_elsewhere(cluster: Any, n: int) -> tuple[str, Any, int]:
    """A transactional id whose coordinator is not the active controller, its producer
    (initialised) and its coordinator. Killing the controller too would be another
    failover: a new active controller starts every broker's session afresh (Kafka's
    does too), so the dead broker would be fenced only broker.session.timeout.ms after
    the controller election, ~1 s later than the target assumes."""
    controller = cluster.controller
    for k in range(CANDIDATE_IDS):
        tid = f"txnbench-failover-{n}-{k}"
        # Quiet: its coordinator's connection is meant to break (librdkafka logs to stderr).
        producer = _producer(cluster.kafka_bootstrap, **{"transactional.id": tid, "log_level": 2})
        producer.init_transactions(TIMEOUT_S)
        coordinator = trio.run(_describe, cluster.bootstrap, tid).coordinator_id
        if coordinator != controller:
            return tid, producer, coordinator
    raise ValueError(f"the first {CANDIDATE_IDS} ids were all coordinated by the controller")


def _failover(cluster: Any, topic: str, n: int) -> dict[str, Any]:
    tid, producer, coordinator = _coordinated_elsewhere(cluster, n)
    held = {cluster.leader(topic, p) for p in range(PARTITIONS)} - {coordinator}
    if not held:
        raise ValueError(f"every partition of {topic} is led by the coordinator: no marker to hold")
    producer.begin_transaction()
    _produce(producer, topic, b"f", 20)
    producer.flush(TIMEOUT_S)
    for leader in held:
        cluster.fail_api(leader, "write_txn_markers", "NOT_ENOUGH_REPLICAS")
    producer.commit_transaction(TIMEOUT_S)  # answered once PrepareCommit is on the ISR
    state = trio.run(_describe, cluster.bootstrap, tid).state
    if state != "PrepareCommit":
        raise ValueError(f"{tid} is {state}, not PrepareCommit: the markers were not held")
    cluster.kill(coordinator)
    killed = time.monotonic()
    cluster.clear_faults()
    survivors = ",".join(cluster.address(b) for b in range(cluster.brokers) if b != coordinator)
    deadline = killed + TIMEOUT_S
    while True:
        answer = trio.run(_describe, survivors, tid)
        if answer.state == "CompleteCommit":
            break
        if time.monotonic() > deadline:
            raise ValueError(f"{tid} still {answer.state} {TIMEOUT_S:.0f} s after the kill")
        time.sleep(POLL_S)
    took = time.monotonic() - killed
    # Back to the whole cluster, leaders where they were, before the next kill.
    cluster.restart(coordinator)
    for p in range(PARTITIONS):
        cluster.wait_for_isr(topic, p, timeout=TIMEOUT_S)
    cluster.elect_preferred_leaders()
    return {
        "killed": coordinator,
        "new_coordinator": answer.coordinator_id,
        "complete_commit_s": round(took, 3),
    }
