"""What `cluster up` and `cluster status` need from a running cluster, through the client."""

from __future__ import annotations

import time

import psutil
import trio

from minibroker.client import Admin, Consumer, NewTopic, Producer
from minibroker.deploy.cluster import ClusterError, ClusterState
from minibroker.protocol import ADMIN_CLIENT_ID, HEALTH_TOPIC
from minibroker.protocol.errors import KafkaError, TopicAlreadyExists


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
            # The health topic is internal: only the admin client id may write it.
            settings = {
                "client.id": ADMIN_CLIENT_ID,
                "linger.ms": 0,
                "delivery.timeout.ms": 10000,
                "request.timeout.ms": 5000,
            }
            async with Producer(bootstrap, acks="all", **settings) as producer:
                await producer.send(HEALTH_TOPIC, b"ready")
            return
        except KafkaError:
            if time.monotonic() > deadline:
                raise
            await trio.sleep(0.02)


async def _controller_id(bootstrap: str) -> int | None:
    with trio.move_on_after(3):
        async with Admin(bootstrap) as admin:
            return (await admin.describe_cluster())[1]
    return None


def active_controller(state: ClusterState) -> int | None:
    """The active controller's id, as any live broker knows it (None: no answer in 3 s)."""
    try:
        found = trio.run(_controller_id, state.bootstrap)
    except KafkaError:
        return None
    return found if found is not None and 0 <= found < state.brokers else None


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


async def broker_stats_of(
    state: ClusterState, broker_ids: list[int] | None = None
) -> dict[int, dict]:
    """BROKER_STATS of each live broker asked (default: all) that answers within 2 s."""
    out: dict[int, dict] = {}

    async def one(broker_id: int) -> None:
        try:
            with trio.fail_after(2):
                async with Admin(f"{state.host}:{state.port(broker_id)}") as admin:
                    out[broker_id] = (await admin.broker_stats(broker_id))["stats"]
        except (KafkaError, trio.TooSlowError, OSError):
            pass

    async with trio.open_nursery() as nursery:
        for i in range(state.brokers) if broker_ids is None else broker_ids:
            if state.status_of(i) == "alive":
                nursery.start_soon(one, i)
    return out


def _process_figures(state: ClusterState) -> dict[int, tuple[float, float]]:
    """(RSS MB, CPU %) per live broker; CPU measured over one shared 0.2 s window."""
    procs = {i: state.process(i) for i in range(state.brokers)}
    before = {}
    for i, proc in procs.items():
        try:
            if proc is not None:
                before[i] = sum(proc.cpu_times()[:2])
        except psutil.Error:
            pass
    t0 = time.monotonic()
    time.sleep(0.2)
    wall = time.monotonic() - t0
    out = {}
    for i, start in before.items():
        try:
            proc = procs[i]
            cpu = (sum(proc.cpu_times()[:2]) - start) / wall * 100
            out[i] = (round(proc.memory_info().rss / 2**20, 1), round(cpu, 1))
        except psutil.Error:
            pass
    return out


def gather_status(state: ClusterState) -> dict:
    """Brokers (process, RSS, CPU, purgatories) and partitions (leader, epoch, ISR, HW, LEO).

    Leader, epoch and ISR come from the newest metadata any live broker holds; HW and LEO
    from the leader itself. A partition whose leader is -1 has no live ISR member: offline.
    """
    stats = trio.run(broker_stats_of, state)
    figures = _process_figures(state)
    newest: dict[tuple[str, int], tuple[int, dict]] = {}
    leo_by_replica: dict[tuple[str, int], dict[int, int]] = {}
    for broker_id, s in stats.items():
        for p in s["partitions"]:
            key = (p["topic"], p["partition"])
            leo_by_replica.setdefault(key, {})[broker_id] = p["log_end_offset"]
            if key not in newest or s["metadata_epoch"] > newest[key][0]:
                newest[key] = (s["metadata_epoch"], p)
    partitions = []
    for key, (_, p) in sorted(newest.items()):
        leader = p["leader"]
        view = {
            "topic": key[0],
            "partition": key[1],
            "leader": leader,
            "leader_epoch": p["leader_epoch"],
            "replicas": p["replicas"],
            "isr": p["isr"],
            "offline": leader < 0,
            "high_watermark": None,
            "log_end_offset": None,
            "replica_leo": leo_by_replica[key],
        }
        leader_view = next(
            (
                q
                for q in stats.get(leader, {}).get("partitions", [])
                if (q["topic"], q["partition"]) == key
            ),
            None,
        )
        if leader_view is not None:
            view["high_watermark"] = leader_view["high_watermark"]
            view["log_end_offset"] = leader_view["log_end_offset"]
        partitions.append(view)
    brokers = []
    for i in range(state.brokers):
        rss, cpu = figures.get(i, (None, None))
        s = stats.get(i)
        proc = state.process(i)  # the live pid, even one cluster.json lost (issue 35)
        brokers.append(
            {
                "id": i,
                "port": state.port(i),
                "pid": proc.pid if proc is not None else state.pids.get(i),
                "state": state.status_of(i),
                "rss_mb": rss,
                "cpu_percent": cpu,
                "partitions_led": sum(1 for p in partitions if p["leader"] == i),
                "purgatory": s["purgatory"] if s else None,
                # Kafka's offline log dirs: which failed on this broker, and why.
                "offline_log_dirs": [
                    d for d in (s.get("log_dirs", []) if s else []) if not d["online"]
                ],
            }
        )
    return {
        "bootstrap": state.bootstrap,
        "kafka_bootstrap": state.kafka_bootstrap,
        "brokers": brokers,
        "partitions": partitions,
        "quorum": quorum_view(stats),
    }


def quorum_view(stats: dict[int, dict]) -> dict:
    """The controller quorum as the newest-epoch leader sees it (None: no leader answered).

    A deposed leader that has not heard of the new epoch yet may still answer: the highest
    epoch wins, so the status never shows two active controllers.
    """
    leaders = [
        (s["quorum"]["epoch"], i, s["quorum"])
        for i, s in stats.items()
        if s.get("quorum", {}).get("role") == "leader"
    ]
    epochs = [s["quorum"]["epoch"] for s in stats.values() if s.get("quorum")]
    if not leaders or max(leaders)[0] < max(epochs):
        return {"active_controller": None, "epoch": max(epochs, default=None)}
    epoch, leader, q = max(leaders)
    return {
        "active_controller": leader if q["active"] else None,
        "epoch": epoch,
        "high_watermark": q["high_watermark"],
        "voter_lag": {int(k): v for k, v in q.get("voter_lag", {}).items()},
    }


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def render_status(status: dict) -> str:
    lines = [
        f"bootstrap {status['bootstrap']}"
        + (f"  Kafka clients {status['kafka_bootstrap']}" if status.get("kafka_bootstrap") else ""),
        "",
        f"{'id':>3} {'port':>6} {'pid':>8} {'state':<7} {'rss_mb':>7} {'cpu%':>6} {'led':>4}  "
        "purgatory produce / fetch: pending watched completed expired purges",
    ]
    for b in status["brokers"]:
        purg = b["purgatory"]
        if purg:
            text = "  /  ".join(
                " ".join(
                    str(purg[kind][k])
                    for k in ("pending", "watched", "completed", "expired", "purges")
                )
                for kind in ("produce", "fetch")
            )
        else:
            text = "-"
        lines.append(
            f"{b['id']:>3} {b['port']:>6} {_dash(b['pid']):>8} {b['state']:<7} {_dash(b['rss_mb']):>7} "
            f"{_dash(b['cpu_percent']):>6} {b['partitions_led']:>4}  {text}"
        )
    for b in status["brokers"]:
        for d in b.get("offline_log_dirs", []):
            lines.append(f"  broker {b['id']}: OFFLINE LOG DIR {d['dir']}: {d['error']}")
    q = status.get("quorum") or {}
    lag = " ".join(f"{v}:{n}" for v, n in sorted(q.get("voter_lag", {}).items()))
    lines += [
        "",
        f"controller quorum: active controller {_dash(q.get('active_controller'))}, "
        f"epoch {_dash(q.get('epoch'))}, commit index (hw) {_dash(q.get('high_watermark'))}, "
        f"voter lag {lag or '-'}",
    ]
    lines += [
        "",
        f"{'topic-partition':<28} {'leader':>7} {'epoch':>5} {'replicas':<12} {'isr':<12} {'hw':>8} {'leo':>8}",
    ]
    for p in status["partitions"]:
        if p["topic"].startswith("__"):
            continue
        leader = "OFFLINE" if p["offline"] else str(p["leader"])
        lines.append(
            f"{p['topic'] + '-' + str(p['partition']):<28} {leader:>7} {p['leader_epoch']:>5} "
            f"{','.join(map(str, p['replicas'])):<12} {','.join(map(str, p['isr'])):<12} "
            f"{_dash(p['high_watermark']):>8} {_dash(p['log_end_offset']):>8}"
        )
    return "\n".join(lines)
