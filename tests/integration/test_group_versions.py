"""The native group APIs' two versions against a real broker: v0 is the shape from before
static membership (a client of that time validates answers with schemas that reject
unknown keys), v1 carries group.instance.id (KIP-345).

Each answer comes through BrokerConnection.request, which validates it against the
schema of the version asked: a v0 answer carrying group_instance_id would fail there.
"""

from __future__ import annotations

import pytest
import trio

from minibroker.client.connection import BrokerConnection
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, InvalidRequest

pytestmark = pytest.mark.integration

CONFIG = {
    "group.min.session.timeout.ms": 500,
    "group.initial.rebalance.delay.ms": 0,
    "offsets.topic.num.partitions": 1,
    "offsets.topic.replication.factor": 1,
}
# Members hold Kafka's 'consumer' protocol; the broker never reads the metadata.
PROTOCOLS = [{"name": "range", "metadata": b""}]


async def join(conn: BrokerConnection, group: str, version: int, **extra) -> dict:
    """JoinGroup until it is answered with a generation (a dynamic member is first asked to
    come back with the id it was given: MEMBER_ID_REQUIRED)."""
    body = {"group_id": group, "session_timeout_ms": 10_000, "member_id": ""}
    body |= {"protocol_type": "consumer", "protocols": PROTOCOLS, **extra}
    while True:
        answer = await conn.request(ApiKey.JOIN_GROUP, body, version, timeout=30)
        if answer["error_code"] != ErrorCode.MEMBER_ID_REQUIRED:
            assert answer["error_code"] == 0, answer
            return answer
        body["member_id"] = answer["member_id"]


async def coordinator_ready(conn: BrokerConnection, group: str) -> None:
    """The offsets topic is created on the first FindCoordinator: wait until it is led."""
    with trio.fail_after(60):
        while True:
            answer = await conn.request(ApiKey.FIND_COORDINATOR, {"key": group})
            if answer["error_code"] == 0:
                return
            await trio.sleep(0.1)


async def test_v0_answers_keep_their_old_shape_and_v1_carries_the_instance_id(
    minibroker_cluster_factory,
):
    cluster = minibroker_cluster_factory(1, CONFIG)
    host, port = cluster.bootstrap.split(":")
    async with trio.open_nursery() as nursery:
        conn = await BrokerConnection.open(nursery, host, int(port), api_version_timeout=10)
        try:
            # The broker advertises v1 of each group API that names the instance, and the
            # connection picks it.
            for key in (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT):
                assert conn.versions[key] == 1
            for key in (ApiKey.LEAVE_GROUP, ApiKey.DESCRIBE_GROUPS):
                assert conn.versions[key] == 1
            assert conn.versions[ApiKey.OFFSET_COMMIT] == 2  # v2: the committed leader epoch
            assert conn.versions[ApiKey.OFFSET_FETCH] == 1  # v1: and returns it
            await coordinator_ready(conn, "static")

            # v1: the instance id goes in and comes back, in join, describe and leave.
            joined = await join(conn, "static", 1, group_instance_id="i-1")
            assert joined["members"] == [
                {"member_id": joined["member_id"], "metadata": b"", "group_instance_id": "i-1"}
            ]
            sync = {"group_id": "static", "generation_id": joined["generation_id"]}
            sync |= {"member_id": joined["member_id"], "group_instance_id": "i-1"}
            sync["assignments"] = [{"member_id": joined["member_id"], "assignment": b"a"}]
            assert (await conn.request(ApiKey.SYNC_GROUP, sync, 1))["assignment"] == b"a"
            described = await conn.request(ApiKey.DESCRIBE_GROUPS, {"groups": ["static"]}, 1)
            (member,) = described["groups"][0]["members"]
            assert member["group_instance_id"] == "i-1"

            # v0 of the same group: the static member is there, its instance id is not.
            described = await conn.request(ApiKey.DESCRIBE_GROUPS, {"groups": ["static"]}, 0)
            (member,) = described["groups"][0]["members"]
            assert member["member_id"] == joined["member_id"]
            assert "group_instance_id" not in member

            # A v0 request may not name an instance: version 0 is the shape it always was.
            heartbeat = {"group_id": "static", "generation_id": joined["generation_id"]}
            heartbeat |= {"member_id": joined["member_id"], "group_instance_id": "i-1"}
            with pytest.raises(InvalidRequest, match="group_instance_id"):
                await conn.request(ApiKey.HEARTBEAT, heartbeat, 0)
            assert (await conn.request(ApiKey.HEARTBEAT, heartbeat, 1))["error_code"] == 0

            # v1 LeaveGroup by instance id alone (an admin's removal) answers with it.
            leave = {
                "group_id": "static",
                "members": [{"member_id": "", "group_instance_id": "i-1"}],
            }
            left = await conn.request(ApiKey.LEAVE_GROUP, leave, 1)
            assert left["members"] == [
                {"member_id": "", "group_instance_id": "i-1", "error_code": 0}
            ]
            described = await conn.request(ApiKey.DESCRIBE_GROUPS, {"groups": ["static"]}, 1)
            assert described["groups"][0]["members"] == []

            # A v0 client's whole round: join (parked, then answered), describe, leave.
            joined = await join(conn, "dynamic", 0)
            assert joined["members"] == [{"member_id": joined["member_id"], "metadata": b""}]
            described = await conn.request(ApiKey.DESCRIBE_GROUPS, {"groups": ["dynamic"]}, 0)
            assert "group_instance_id" not in described["groups"][0]["members"][0]
            leave = {"group_id": "dynamic", "members": [{"member_id": joined["member_id"]}]}
            left = await conn.request(ApiKey.LEAVE_GROUP, leave, 0)
            assert left["members"] == [{"member_id": joined["member_id"], "error_code": 0}]
        finally:
            await conn.aclose()
            nursery.cancel_scope.cancel()
