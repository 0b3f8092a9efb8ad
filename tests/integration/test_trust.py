"""Inter-broker trust against a live 3-broker cluster: only members drive internal APIs.

A plain client sending the cluster's internal APIs (registration, heartbeats, ISR
changes, metadata pushes, follower fetches) gets CLUSTER_AUTHORIZATION_FAILED and the
cluster does not change: same leaders, ISRs and epochs, no file outside the data dirs,
every acknowledged acks=all record still readable. A peer with the wrong secret is
refused; a member may speak only for itself; even the controller's snapshots are checked.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import trio

import minibroker.protocol as p
from minibroker.broker.network.cluster_auth import ClusterCredentials, load_credentials
from minibroker.broker.network.peer import PeerConnection
from minibroker.client import Admin, Consumer, NewTopic, Producer
from minibroker.deploy.cluster_ops import gather_status, render_status
from minibroker.deploy.cluster_secret import SECRET_FILE
from minibroker.deploy.launcher import free_port
from minibroker.protocol import ApiKey, ErrorCode
from minibroker.protocol.errors import (
    ClusterAuthorizationFailed,
    InvalidRequest,
    SaslAuthenticationFailed,
)

from .cluster_helpers import broker_stats, wait_for

pytestmark = pytest.mark.integration

DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
RECORDS = 20


class Raw:
    """A plain client speaking raw requests (no authentication)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream, self.decoder, self.corr = stream, p.FrameDecoder(), 0

    @classmethod
    async def open(cls, state, broker_id: int) -> Raw:
        return cls(await trio.open_tcp_stream(state.host, state.port(broker_id)))

    async def request(self, api_key: int, body: dict) -> dict:
        self.corr += 1
        await self.stream.send_all(p.encode_request(api_key, 0, self.corr, "attacker", body))
        while True:
            with trio.fail_after(10):
                data = await self.stream.receive_some(1 << 16)
            assert data, "broker closed the connection"
            frames = self.decoder.feed(data)
            if frames:
                corr, body = p.decode_response_envelope(frames[0])
                assert corr == self.corr
                return body


async def view(state) -> dict:
    """What must not change: per broker, its metadata epoch and every partition's state."""
    out = {}
    for b in range(state.brokers):
        stats = await broker_stats(state, b)
        out[b] = (
            stats["metadata_epoch"],
            sorted(
                (
                    x["topic"],
                    x["partition"],
                    x["leader"],
                    x["leader_epoch"],
                    sorted(x["isr"]),
                    x["high_watermark"],
                )
                for x in stats["partitions"]
            ),
        )
    async with Admin(state.bootstrap) as admin:
        brokers, controller = await admin.describe_cluster()
    out["brokers"] = sorted((b.node_id, b.host, b.port) for b in brokers)
    out["controller"] = controller
    return out


async def read_back(state, topic: str) -> list[bytes]:
    async with Consumer(state.bootstrap) as consumer:
        consumer.assign([(topic, 0)])
        consumer.seek_to_beginning()
        values: list[bytes] = []
        while len(values) < RECORDS:
            batch = await consumer.poll(timeout_ms=3000)
            assert batch, f"only {len(values)} of {RECORDS} acknowledged records readable"
            values += [r.value for r in batch]
    return values


def files_outside(state) -> list[str]:
    """Anything under the test's tmp dir that is not the cluster's own layout."""
    root = state.data_dir.parent
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if "pwned" in path or not path.startswith(str(state.data_dir)):
                found.append(path)
    return found


@pytest.fixture
async def cluster(cluster_factory):
    state = await cluster_factory(3, {"min.insync.replicas": 2})
    async with Admin(state.bootstrap) as admin:
        await admin.create_topics([NewTopic("orders", 1, 3)])
    async with Producer(state.bootstrap, acks="all") as producer:
        for i in range(RECORDS):
            await producer.send("orders", f"v{i}".encode())

    async def settled():
        # Full ISR, and every follower has learnt the final HW (one more fetch round).
        v = await view(state)
        expected = {"orders": RECORDS, "__minibroker_health": 1}
        return all(x[4] == [0, 1, 2] and x[5] == expected[x[0]] for b in range(3) for x in v[b][1])

    await wait_for(settled, 20, "every replica at the final HW")
    return state


def snapshot(epoch: int, topics: list[dict], brokers=((0,), (1,), (2,))) -> dict:
    return {
        "controller_id": 0,
        "epoch": epoch,
        "brokers": [{"node_id": b[0], "host": "127.0.0.1", "port": 1} for b in brokers],
        "live_brokers": [b[0] for b in brokers],
        "topics": topics,
    }


def topic(name: str, leader: int, epoch: int) -> dict:
    return {
        "name": name,
        "configs": {},
        "partitions": [
            {
                "leader": leader,
                "leader_epoch": epoch,
                "replicas": [0, 1, 2],
                "isr": [leader],
                "partition_epoch": epoch,
            }
        ],
    }


async def test_plain_client_cannot_drive_internal_apis(cluster):
    state = cluster
    before = await view(state)
    orders = next(x for x in before[0][1] if x[0] == "orders")
    leader, leader_epoch = orders[2], orders[3]
    follower = next(b for b in range(3) if b != leader and b != 0) if leader == 0 else 0
    controller = await Raw.open(state, 0)
    attacks = [
        (controller, ApiKey.BROKER_REGISTRATION, {"broker_id": 7, "host": "10.9.9.9", "port": 1}),
        # A leader's id at a fake address: followers would truncate to what it answers.
        (controller, ApiKey.BROKER_REGISTRATION, {"broker_id": leader, "host": "h", "port": 1}),
        (
            controller,
            ApiKey.BROKER_HEARTBEAT,
            {"broker_id": 1, "metadata_epoch": 0, "shutting_down": True},
        ),
        (
            controller,
            ApiKey.ALTER_PARTITION,
            {
                "broker_id": leader,
                "topic": "orders",
                "partition": 0,
                "leader_epoch": leader_epoch,
                "partition_epoch": leader_epoch,
                "new_isr": [leader],
            },
        ),
    ]
    for b in range(3):
        conn = await Raw.open(state, b)
        # A huge epoch (two leaders) and names that are paths, pushed to every broker.
        attacks.append(
            (
                conn,
                ApiKey.UPDATE_METADATA,
                {"metadata": snapshot(2**62, [topic("orders", b, 2**30)])},
            )
        )
        for name in ("../../../x/pwned", "zz/../orders"):
            attacks.append(
                (conn, ApiKey.UPDATE_METADATA, {"metadata": snapshot(2**62, [topic(name, b, 0)])})
            )
    # Posing as a caught-up follower would move the HW past what replicas hold.
    leader_conn = await Raw.open(state, leader)
    for replica in (follower, 7):
        attacks.append(
            (
                leader_conn,
                ApiKey.FETCH,
                {
                    "replica_id": replica,
                    "max_wait_ms": 0,
                    "min_bytes": 0,
                    "topics": [
                        {"name": "orders", "partitions": [{"partition": 0, "fetch_offset": 10**9}]}
                    ],
                },
            )
        )
    # A replica's view of offsets reaches past the HW (records a failover may take back).
    for replica in (follower, 7):
        attacks += [
            (
                leader_conn,
                ApiKey.LIST_OFFSETS,
                {
                    "replica_id": replica,
                    "topics": [
                        {"name": "orders", "partitions": [{"partition": 0, "timestamp": -1}]}
                    ],
                },
            ),
            (
                leader_conn,
                ApiKey.OFFSET_FOR_LEADER_EPOCH,
                {
                    "replica_id": replica,
                    "topics": [
                        {"name": "orders", "partitions": [{"partition": 0, "leader_epoch": 0}]}
                    ],
                },
            ),
        ]
    # The metadata quorum's APIs: a huge epoch would depose the leader, a fetch would count
    # as a voter's acknowledgement (commit), a snapshot fetch would leak the metadata.
    huge = 2**30
    for b in range(3):
        conn = await Raw.open(state, b)
        attacks += [
            (
                conn,
                ApiKey.VOTE,
                {
                    "candidate_epoch": huge,
                    "candidate_id": b,
                    "last_offset_epoch": huge,
                    "last_offset": 10**9,
                },
            ),
            (conn, ApiKey.BEGIN_QUORUM_EPOCH, {"leader_epoch": huge, "leader_id": (b + 1) % 3}),
            (
                conn,
                ApiKey.END_QUORUM_EPOCH,
                {"leader_epoch": huge, "leader_id": b, "preferred_successors": [0]},
            ),
            (
                conn,
                ApiKey.QUORUM_FETCH,
                {
                    "correlation_id": 1,
                    "replica_id": (b + 1) % 3,
                    "current_leader_epoch": 1,
                    "fetch_offset": 10**9,
                    "last_fetched_epoch": 1,
                    "max_wait_ms": 0,
                },
            ),
            (
                conn,
                ApiKey.FETCH_SNAPSHOT,
                {
                    "correlation_id": 1,
                    "replica_id": (b + 1) % 3,
                    "current_leader_epoch": 1,
                    "snapshot_id": {"offset": 0, "epoch": 0},
                },
            ),
        ]
    for conn, api, body in attacks:
        answer = await conn.request(api, body)
        assert answer["error_code"] == DENIED, (api, answer)
        assert "authenticated cluster members" in answer["error_message"]

    for b in range(3):
        assert (await broker_stats(state, b))["quorum"]["epoch"] < huge
    assert await view(state) == before
    assert files_outside(state) == []
    assert await read_back(state, "orders") == [f"v{i}".encode() for i in range(RECORDS)]
    # A consumer fetch (replica_id -1) is no internal API: still served.
    async with Producer(state.bootstrap, acks="all") as producer:
        await producer.send("orders", b"after")
    # So is a consumer's offset lookup (replica_id -1): up to the high watermark.
    answer = await leader_conn.request(
        ApiKey.LIST_OFFSETS,
        {"topics": [{"name": "orders", "partitions": [{"partition": 0, "timestamp": -1}]}]},
    )
    assert answer["topics"][0]["partitions"][0]["offset"] == RECORDS + 1


async def test_fuzzed_internal_apis_from_a_plain_client_change_nothing(cluster):
    state = cluster
    before = await view(state)
    rng = random.Random(11)

    def node() -> int:
        return rng.choice([-1, 0, 1, 2, 3, 7, 2**31 - 1])

    def name() -> str:
        return rng.choice(["orders", "../x/pwned", "a/../orders", "..", "__minibroker_health"])

    def body(api: int) -> dict:
        if api == ApiKey.BROKER_REGISTRATION:
            return {"broker_id": node() % 2**31, "host": name(), "port": rng.randrange(65536)}
        if api == ApiKey.BROKER_HEARTBEAT:
            return {
                "broker_id": node() % 2**31,
                "metadata_epoch": rng.randrange(-(2**40), 2**40),
                "shutting_down": rng.random() < 0.5,
            }
        if api == ApiKey.ALTER_PARTITION:
            return {
                "broker_id": node() % 2**31,
                "topic": name(),
                "partition": rng.randrange(3),
                "leader_epoch": rng.randrange(-2, 5),
                "partition_epoch": rng.randrange(-2, 5),
                "new_isr": [node() for _ in range(rng.randrange(4))],
            }
        if api == ApiKey.UPDATE_METADATA:
            leader = rng.choice([0, 1, 2])
            return {
                "metadata": snapshot(
                    rng.randrange(2**62), [topic(name(), leader, rng.randrange(2**31))]
                )
            }
        return {
            "replica_id": node() % 2**31,
            "max_wait_ms": 0,
            "min_bytes": 0,
            "topics": [
                {
                    "name": name(),
                    "partitions": [{"partition": 0, "fetch_offset": rng.randrange(2**40)}],
                }
            ],
        }

    conns = [await Raw.open(state, b) for b in range(3)]
    apis = [
        ApiKey.BROKER_REGISTRATION,
        ApiKey.BROKER_HEARTBEAT,
        ApiKey.ALTER_PARTITION,
        ApiKey.UPDATE_METADATA,
        ApiKey.FETCH,
    ]
    for i in range(300):
        conn = rng.choice(conns)
        if i % 10 == 0:
            # A half-done or forged handshake grants nothing.
            await conn.request(
                ApiKey.SASL_HANDSHAKE,
                {
                    "mechanism": "MINIBROKER-HMAC-SHA256",
                    "broker_id": rng.randrange(3),
                    "cluster_id": "guess",
                    "client_nonce": rng.randbytes(32),
                },
            )
            answer = await conn.request(ApiKey.SASL_AUTHENTICATE, {"auth_bytes": rng.randbytes(32)})
            assert answer["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
        api = rng.choice(apis)
        answer = await conn.request(api, body(api))
        assert answer["error_code"] == DENIED, (api, answer)
    assert await view(state) == before
    assert files_outside(state) == []
    assert await read_back(state, "orders") == [f"v{i}".encode() for i in range(RECORDS)]


async def test_wrong_secret_is_refused_and_members_speak_only_for_themselves(cluster):
    state = cluster
    before = await view(state)
    secret_file = state.data_dir / SECRET_FILE
    assert oct(secret_file.stat().st_mode & 0o777) == "0o600"
    good = load_credentials(secret_file, 1)
    # Brokers get the file's path, never the secret: not in `ps`, logs or `cluster status`.
    status = await trio.to_thread.run_sync(gather_status, state)
    assert good.secret.hex() not in json.dumps(status, default=str) + render_status(status)
    for b in range(3):
        # What `ps` shows (the warm parent's command line, brokers being its forks) and
        # the broker's own arguments: the path, never the secret.
        cmdline = " ".join(state.process(b).cmdline())
        arguments = " ".join(state.broker_process(b).arguments())
        assert f"cluster.secret.file={secret_file.resolve()}" in arguments
        assert good.secret.hex() not in cmdline + arguments
        assert good.secret.hex() not in (state.data_dir / f"broker-{b}" / "broker.log").read_text()

    async def ask(creds, to: int, api: int, body: dict, peer_id: int | None = None) -> dict:
        conn = PeerConnection(
            state.host, state.port(to), "test", credentials=creds, peer_id=peer_id
        )
        try:
            return await conn.request(api, body, timeout=10)
        finally:
            await conn.close()

    heartbeat = {"broker_id": 2, "metadata_epoch": 0, "shutting_down": True}
    for wrong in (
        ClusterCredentials(1, good.cluster_id, os.urandom(32)),
        ClusterCredentials(1, "another-cluster", good.secret),
    ):
        with pytest.raises(SaslAuthenticationFailed):
            await ask(wrong, 0, ApiKey.BROKER_HEARTBEAT, heartbeat)
    # Mutual: a broker that is not the expected one is not trusted either.
    with pytest.raises(SaslAuthenticationFailed, match="expected broker 1"):
        await ask(good, 0, ApiKey.API_VERSIONS, {}, peer_id=1)

    # Broker 1, authenticated, may not fence broker 2 nor push metadata (it is no controller).
    with pytest.raises(ClusterAuthorizationFailed, match="may not speak for broker 2"):
        await ask(good, 0, ApiKey.BROKER_HEARTBEAT, heartbeat)
    with pytest.raises(ClusterAuthorizationFailed, match="from the metadata quorum only"):
        await ask(good, 2, ApiKey.UPDATE_METADATA, {"metadata": snapshot(2**62, [])})

    # Nor run for election, or fetch the metadata log, under broker 2's name.
    vote = {"candidate_epoch": 2**30, "candidate_id": 2, "last_offset_epoch": 0, "last_offset": 0}
    with pytest.raises(ClusterAuthorizationFailed, match="may not speak for broker 2"):
        await ask(good, 0, ApiKey.VOTE, vote)
    for b in range(3):
        assert (await broker_stats(state, b))["quorum"]["epoch"] < 2**30

    # Speaking for itself, a member still cannot make the metadata unloadable.
    with pytest.raises(InvalidRequest, match="cannot register"):
        await ask(
            good,
            (await broker_stats(state, 0))["controller_id"],  # the active controller answers
            ApiKey.BROKER_REGISTRATION,
            {"broker_id": 1, "host": "", "port": 1},
        )

    # Not even a voter's pushed snapshots are taken: metadata comes from the quorum's
    # committed log (what a snapshot would be checked for: test_metadata_validation.py).
    as_controller = load_credentials(secret_file, 0)
    for bad in (
        [topic("../../../x/pwned", 1, 99)],
        [topic("zz/../orders", 1, 99)],
        [
            {
                **topic("orders", 1, 99),
                "partitions": [{**topic("orders", 1, 99)["partitions"][0], "replicas": [1, 9]}],
            }
        ],
    ):
        with pytest.raises(ClusterAuthorizationFailed, match="from the metadata quorum only"):
            await ask(as_controller, 1, ApiKey.UPDATE_METADATA, {"metadata": snapshot(2**62, bad)})

    assert await view(state) == before
    assert files_outside(state) == []
    assert await read_back(state, "orders") == [f"v{i}".encode() for i in range(RECORDS)]


def run_broker_command(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(os.getcwd())}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "minibroker.deploy.cli",
            "broker",
            "--listen",
            f"127.0.0.1:{free_port()}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


def test_broker_with_peers_but_no_secret_stops_with_one_line(tmp_path):
    result = run_broker_command(
        tmp_path,
        "--data-dir",
        str(tmp_path / "b"),
        "--id",
        "1",
        "--set",
        "controller.quorum.voters=0@127.0.0.1:1,1@127.0.0.1:2",
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cluster.secret.file' is required" in lines[0], result.stderr


def test_broker_outside_the_voter_set_stops_with_one_line(tmp_path):
    result = run_broker_command(
        tmp_path,
        "--data-dir",
        str(tmp_path / "b"),
        "--id",
        "2",
        "--set",
        "controller.quorum.voters=0@127.0.0.1:1,1@127.0.0.1:2",
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not in controller.quorum.voters (0, 1)" in lines[0], result.stderr
