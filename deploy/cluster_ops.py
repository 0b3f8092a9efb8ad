"""What `cluster up` and `cluster status` need from a running cluster, through the client."""

from __future__ import annotations

import time

import psutil
import trio

from client import Admin, Consumer, NewTopic, Producer
from protocol.errors import KafkaError, TopicAlreadyExists

from .cluster import ClusterError, ClusterState

HEALTH_TOPIC = "__minibroker_health"


async def acks_all_write(bootstrap: str, replication: int, timeout: float = 30) -> None:
    """Wait until the cluster acknowledges an acks=all write to a fully replicated topic."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with Admin(bootstrap) as admin:
                try:
                    await admin.create_topics([NewTopic(HEALTH_TOPIC, 1, replication)])
                except TopicAlreadyExists:
                    pass
            async with Producer(
                bootstrap,
                acks="all",
                **{"linger.ms": 0, "delivery.timeout.ms": 10000, "request.timeout.ms": 5000},
            ) as producer:
                await producer.send(HEALTH_TOPIC, b"ready")
            return
        except KafkaError:
            if time.monotonic() > deadline:
                raise
            await trio.sleep(0.02)


def first_acks_all_write(state: ClusterState, timeout: float = 30) -> None:
    """Block until the cluster acknowledges an acks=all write to a fully replicated topic."""
    try:
        trio.run(acks_all_write, state.bootstrap, min(state.brokers, 3), timeout)
    except KafkaError as exc:
        raise ClusterError(f"the cluster did not accept an acks=all write: {exc}") from None


async def _demo(bootstrap: str, replication: int) -> list[str]:
    lines = []
    async with Admin(bootstrap) as admin:
        try:
            await admin.create_topics([NewTopic("demo", 3, replication)])
            lines.append(f"created topic 'demo' (3 partitions, replication factor {replication})")
        except TopicAlreadyExists:
            lines.append("topic 'demo' exists")
    async with Producer(bootstrap, acks="all") as producer:
        sent = [
            await producer.send("demo", f"hello {i}".encode(), key=f"k{i}".encode())
            for i in range(5)
        ]
    for md in sent:
        lines.append(f"produced acks=all -> demo[{md.partition}] offset {md.offset}")
    async with Consumer(bootstrap) as consumer:
        wanted = {(md.partition, md.offset) for md in sent}
        consumer.assign([("demo", p) for p in range(3)])
        for p in range(3):
            consumer.seek(("demo", p), min((o for q, o in wanted if q == p), default=0))
        deadline = time.monotonic() + 10
        while wanted and time.monotonic() < deadline:
            for record in await consumer.poll(timeout_ms=500):
                if (record.partition, record.offset) in wanted:
                    wanted.discard((record.partition, record.offset))
                    lines.append(
                        f"consumed demo[{record.partition}]@{record.offset}: "
                        f"{record.key.decode()}={record.value.decode()}"
                    )
    return lines


def run_demo(state: ClusterState) -> list[str]:
    return trio.run(_demo, state.bootstrap, min(state.brokers, 3))


async def _stats(state: ClusterState) -> dict[int, dict]:
    out: dict[int, dict] = {}

    async def one(broker_id: int) -> None:
        try:
            with trio.fail_after(2):
                async with Admin(f"{state.host}:{state.port(broker_id)}") as admin:
                    out[broker_id] = (await admin.broker_stats(broker_id))["stats"]
        except (KafkaError, trio.TooSlowError, OSError):
            pass

    async with trio.open_nursery() as nursery:
        for i in range(state.brokers):
            if state.status_of(i) == "alive":
                nursery.start_soon(one, i)
    return out


def gather_status(state: ClusterState) -> dict:
    stats = trio.run(_stats, state)
    brokers = []
    partitions: dict[tuple[str, int], dict] = {}
    for i in range(state.brokers):
        proc = state.process(i)
        entry = {
            "id": i,
            "port": state.port(i),
            "pid": state.pids.get(i),
            "state": state.status_of(i),
            "rss_mb": None,
            "cpu_percent": None,
            "partitions_led": 0,
            "purgatory": None,
        }
        if proc is not None:
            try:
                entry["rss_mb"] = round(proc.memory_info().rss / 2**20, 1)
                entry["cpu_percent"] = proc.cpu_percent(interval=0.05)
            except psutil.Error:
                pass
        s = stats.get(i)
        if s is not None:
            entry["purgatory"] = s["purgatory"]
            for p in s["partitions"]:
                key = (p["topic"], p["partition"])
                view = partitions.setdefault(
                    key,
                    {
                        "topic": p["topic"],
                        "partition": p["partition"],
                        "replicas": p["replicas"],
                        "leo": {},
                    },
                )
                view["leo"][i] = p["log_end_offset"]
                if p["leader"] == i:
                    entry["partitions_led"] += 1
                    view.update(
                        leader=i,
                        leader_epoch=p["leader_epoch"],
                        isr=p["isr"],
                        high_watermark=p["high_watermark"],
                        log_end_offset=p["log_end_offset"],
                    )
        brokers.append(entry)
    return {
        "bootstrap": state.bootstrap,
        "brokers": brokers,
        "partitions": sorted(partitions.values(), key=lambda v: (v["topic"], v["partition"])),
    }


def render_status(status: dict) -> str:
    lines = [
        f"bootstrap {status['bootstrap']}",
        "",
        f"{'id':>3} {'port':>6} {'pid':>8} {'state':<7} {'rss_mb':>7} {'cpu%':>6} {'led':>4}  purgatory (pending produce/fetch)",
    ]
    for b in status["brokers"]:
        purg = b["purgatory"]
        purg_text = f"{purg['produce']['pending']}/{purg['fetch']['pending']}" if purg else "-"
        lines.append(
            f"{b['id']:>3} {b['port']:>6} {b['pid'] or '-':>8} {b['state']:<7} "
            f"{b['rss_mb'] if b['rss_mb'] is not None else '-':>7} "
            f"{b['cpu_percent'] if b['cpu_percent'] is not None else '-':>6} {b['partitions_led']:>4}  {purg_text}"
        )
    lines += [
        "",
        f"{'topic-partition':<28} {'leader':>6} {'epoch':>5} {'replicas':<12} {'isr':<12} {'hw':>8} {'leo':>8}",
    ]
    for p in status["partitions"]:
        if p["topic"].startswith("__"):
            continue
        leader = p.get("leader", "none")
        lines.append(
            f"{p['topic'] + '-' + str(p['partition']):<28} {leader:>6} {p.get('leader_epoch', '-'):>5} "
            f"{','.join(map(str, p['replicas'])):<12} {','.join(map(str, p.get('isr', []))):<12} "
            f"{p.get('high_watermark', '-'):>8} {p.get('log_end_offset', '-'):>8}"
        )
    return "\n".join(lines)
