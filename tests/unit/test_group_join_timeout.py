"""A JoinGroup waits at the coordinator until the whole group has rejoined (up to the
rebalance timeout), so the member gives it max.poll.interval.ms + 5 s, not
request.timeout.ms (Kafka's JOIN_GROUP_TIMEOUT_LAPSE). Found by the chaos group
workload: members with request.timeout.ms=3000 timed out their parked JoinGroups and
sent them again while the group waited for a slow member."""

from __future__ import annotations

import trio

from minibroker.client.config import load_config
from minibroker.client.group import GroupMembership
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode, RequestTimedOut


class Connection:
    versions: dict = {}


class SlowCoordinator:
    """Answers a JoinGroup after ``join_s`` (the rest of the group rejoining); a request
    not answered within the timeout it was given times out, as Cluster.request does."""

    brokers = {0: None}

    def __init__(self, join_s: float) -> None:
        self.join_s = join_s
        self.timeouts: list[tuple[str, float]] = []

    async def any_request(self, api_key: int, body: dict) -> dict:
        return {"error_code": 0, "node_id": 0}

    async def connection(self, node: int) -> Connection:
        return Connection()

    async def request(
        self, node: int, api_key: int, body: dict, version: int = 0, timeout: float = 0
    ) -> dict:
        self.timeouts.append((ApiKey(api_key).name, timeout))
        if api_key == ApiKey.JOIN_GROUP:
            with trio.move_on_after(timeout):
                await trio.sleep(self.join_s)
                return {"error_code": int(ErrorCode.NONE), "generation_id": 2}
            raise RequestTimedOut(f"no answer within {timeout}s")
        return {"error_code": int(ErrorCode.NONE)}


def membership(coordinator: SlowCoordinator) -> GroupMembership:
    config = load_config(
        "consumer",
        {"group.id": "g", "request.timeout.ms": 3000, "max.poll.interval.ms": 8000},
    )
    return GroupMembership(coordinator, config, lambda *a, **k: None)  # type: ignore[arg-type]


async def test_a_join_parked_past_request_timeout_is_waited_for(autojump_clock):
    coordinator = SlowCoordinator(join_s=7.0)  # longer than request.timeout.ms (3 s)
    group = membership(coordinator)
    answer = await group.call(ApiKey.JOIN_GROUP, {"group_id": "g"})
    assert answer["generation_id"] == 2
    assert coordinator.timeouts == [("JOIN_GROUP", 13.0)]  # 8 s rebalance timeout + 5 s


async def test_other_group_requests_keep_request_timeout(autojump_clock):
    coordinator = SlowCoordinator(join_s=0)
    group = membership(coordinator)
    await group.call(ApiKey.HEARTBEAT, {"group_id": "g"})
    await group.call(ApiKey.SYNC_GROUP, {"group_id": "g"})
    assert coordinator.timeouts == [("HEARTBEAT", 3.0), ("SYNC_GROUP", 3.0)]


async def test_request_timeout_longer_than_the_rebalance_timeout_wins(autojump_clock):
    coordinator = SlowCoordinator(join_s=0)
    config = load_config(
        "consumer",
        {"group.id": "g", "request.timeout.ms": 60_000, "max.poll.interval.ms": 1000},
    )
    group = GroupMembership(coordinator, config, lambda *a, **k: None)  # type: ignore[arg-type]
    await group.call(ApiKey.JOIN_GROUP, {"group_id": "g"})
    assert coordinator.timeouts == [("JOIN_GROUP", 60.0)]
