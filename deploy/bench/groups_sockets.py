"""`minibroker bench groups`, part 3: the heartbeat target over real sockets.

The in-process part (groups.py) measures the coordinator and the purgatory alone. A real
broker also reads, decodes, dispatches, encodes and writes every Heartbeat: here the
members are in the bench process, on ``--socket-connections`` connections to a broker
process (a real consumer has a connection of its own; ten members a connection, sent at
different instants, keep the broker's reads at about one request each, as that would),
and the broker *process's* CPU is measured with psutil while they heartbeat every
``--heartbeat-interval-ms``, against the same broker idle for as long before: the
difference is what the heartbeats cost that broker, network included.

Heartbeat frames are encoded once (their correlation id is the member's index), so the
bench's own sending costs it little; it runs in another process anyway.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import psutil
import trio

from minibroker.deploy.bench.load import cpu_seconds
from minibroker.protocol import ApiKey
from minibroker.protocol.codec import decode_response_envelope, encode_request
from minibroker.protocol.errors import ErrorCode
from minibroker.protocol.framing import FrameDecoder

CLIENT_ID = "bench"
SLOTS = 100  # heartbeats go out at 100 instants an interval, as groups.py's
JOIN_WAVE = 50  # groups joining at once
JOIN_ATTEMPTS = 5
# Correlation ids of the joins and syncs start here; a heartbeat's is its member's index.
_CALLS_FROM = 1 << 24


class _Link:
    """One connection: pipelined calls matched by correlation id, and pre-encoded
    heartbeat frames whose answers are only counted."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self.waiting: dict[int, list] = {}
        self.answered = 0
        self.errors: Counter[int] = Counter()
        self._send_lock = trio.Lock()

    async def call(self, api_key: int, body: dict, corr: int) -> dict:
        cell: list = [trio.Event()]
        self.waiting[corr] = cell
        await self.send(encode_request(api_key, 0, corr, CLIENT_ID, body))
        await cell[0].wait()
        return cell[1]

    async def send(self, data: bytes) -> None:
        async with self._send_lock:
            await self.stream.send_all(data)

    async def read_loop(self) -> None:
        waiting = self.waiting
        while True:
            data = await self.stream.receive_some(1 << 16)
            if not data:
                return
            for payload in self.decoder.feed(data):
                corr, body = decode_response_envelope(payload)
                cell = waiting.pop(corr, None)
                if cell is not None:
                    cell.append(body)
                    cell[0].set()
                else:
                    self.answered += 1
                    code = body["error_code"]
                    if code:
                        self.errors[code] += 1


async def run(bootstrap: str, broker: psutil.Process, args: argparse.Namespace) -> dict[str, Any]:
    host, port = bootstrap.rsplit(":", 1)
    interval = args.heartbeat_interval_ms / 1000
    session_s = args.session_timeout_ms / 1000
    links: list[_Link] = []
    async with trio.open_nursery() as nursery:
        # The same broker idle, first (its own housekeeping: raft, the controller, sweeps).
        idle = await _broker_share(broker, args.duration)
        for _ in range(max(1, min(args.socket_connections, args.heartbeat_members))):
            link = _Link(await trio.open_tcp_stream(host, int(port)))
            nursery.start_soon(link.read_loop)
            links.append(link)
        await _find_coordinator(links[0])
        members = await _join(links, args, nursery)
        slots = _slot_frames(links, members, SLOTS)
        me = psutil.Process()
        await _pace(slots, interval, session_s)  # warm-up: every op comes due once
        answered = sum(link.answered for link in links)
        errors = sum((link.errors for link in links), Counter())
        t0 = time.monotonic()
        broker0, me0 = cpu_seconds(broker), cpu_seconds(me)
        await _pace(slots, interval, args.duration)
        wall = time.monotonic() - t0
        busy = (cpu_seconds(broker) - broker0) / wall
        mine = (cpu_seconds(me) - me0) / wall
        answered = sum(link.answered for link in links) - answered
        errors = sum((link.errors for link in links), Counter()) - errors
        nursery.cancel_scope.cancel()  # the readers stop; then the connections close
    for link in links:
        await link.stream.aclose()
    return {
        "connections": len(links),
        "members": len(members),
        "heartbeats_answered_per_s": round(answered / wall),
        "steady_errors": {ErrorCode.parse(c).name: n for c, n in errors.items()},
        # Shares of one core: the broker process busy and idle, and the difference (what
        # serving the heartbeats cost it, sockets and decoding included).
        "broker_process_cpu_share": round(busy, 4),
        "broker_idle_cpu_share": round(idle, 4),
        "heartbeats_cpu_share": round(busy - idle, 4),
        "us_per_heartbeat": round((busy - idle) * wall / max(answered, 1) * 1e6, 1),
        "bench_process_cpu_share": round(mine, 4),
    }


async def _broker_share(broker: psutil.Process, seconds: float) -> float:
    t0, cpu0 = time.monotonic(), cpu_seconds(broker)
    await trio.sleep(seconds)
    return (cpu_seconds(broker) - cpu0) / (time.monotonic() - t0)


async def _find_coordinator(link: _Link) -> None:
    """The first FindCoordinator creates __consumer_offsets: ask until it is there."""
    corr = _CALLS_FROM - 1
    with trio.fail_after(60):
        while True:
            answer = await link.call(ApiKey.FIND_COORDINATOR, {"key": "g0"}, corr)
            if answer["error_code"] == 0:
                return
            await trio.sleep(0.2)


async def _join(
    links: Sequence[_Link], args: argparse.Namespace, nursery: trio.Nursery
) -> list[tuple[str, str, int]]:
    """Every group's members join and sync, ``JOIN_WAVE`` groups at a time (20,000 joins
    at once would keep the broker busy past a pending member id's session timeout). A
    group is done when a heartbeat of each of its members is answered NONE; until then
    its members join and sync again, as real members do when a heartbeat says so (one
    that joined late made a second generation). Settled members heartbeat meanwhile."""
    per_group = max(1, args.heartbeat_members // args.heartbeat_groups)
    members: list[tuple[str, str, int]] = [("", "", 0)] * (per_group * args.heartbeat_groups)
    calls = itertools.count(_CALLS_FROM)
    wave = trio.CapacityLimiter(JOIN_WAVE)

    async def group(g: int) -> None:
        group_id = f"g{g}"
        first = g * per_group
        ids = [""] * per_group
        generations = [-1] * per_group

        def link(k: int) -> _Link:
            return links[_link_of(first + k, len(links), SLOTS)]

        async def join(k: int, sync: bool) -> None:
            body = {
                "group_id": group_id,
                "session_timeout_ms": args.session_timeout_ms,
                "rebalance_timeout_ms": 60000,
                "member_id": ids[k],
                "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}],
            }
            while True:
                answer = await link(k).call(ApiKey.JOIN_GROUP, body, next(calls))
                code = answer["error_code"]
                if code == ErrorCode.MEMBER_ID_REQUIRED:
                    body["member_id"] = ids[k] = answer["member_id"]
                    if sync:
                        continue
                elif code == ErrorCode.UNKNOWN_MEMBER_ID:  # its pending id expired
                    body["member_id"] = ids[k] = ""
                    continue
                break
            if code == 0 and sync:
                generations[k] = answer["generation_id"]
                sync_body = {
                    "group_id": group_id,
                    "generation_id": answer["generation_id"],
                    "member_id": ids[k],
                    "assignments": [],
                    "protocol_type": "consumer",
                    "protocol_name": answer["protocol_name"],
                }
                await link(k).call(ApiKey.SYNC_GROUP, sync_body, next(calls))

        async def heartbeat(k: int, codes: list[int]) -> None:
            body = {"group_id": group_id, "generation_id": generations[k], "member_id": ids[k]}
            codes[k] = (await link(k).call(ApiKey.HEARTBEAT, body, next(calls)))["error_code"]

        async def each(fn: Any, *args: Any) -> None:
            async with trio.open_nursery() as nursery:
                for k in range(per_group):
                    nursery.start_soon(fn, k, *args)

        async with wave:
            await each(join, False)  # member ids first: then all join one generation
            for _ in range(JOIN_ATTEMPTS):
                await each(join, True)
                codes = [-1] * per_group
                await each(heartbeat, codes)
                if not any(codes):
                    for k in range(per_group):
                        members[first + k] = (group_id, ids[k], generations[k])
                        settled.append(first + k)
                    return
        raise RuntimeError(f"group {group_id} did not settle: heartbeat errors {codes}")

    settled: list[int] = []

    async def keep_alive(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            while True:
                await trio.sleep(args.heartbeat_interval_ms / 1000)
                await _send_all(links, [(i, members[i]) for i in settled])

    alive = await nursery.start(keep_alive)
    with trio.fail_after(300):
        async with trio.open_nursery() as joining:
            for g in range(args.heartbeat_groups):
                joining.start_soon(group, g)
    alive.cancel()
    return members


async def _send_all(links: Sequence[_Link], members: Sequence[tuple[int, tuple]]) -> None:
    frames: dict[int, list[bytes]] = {}
    for i, (group, member_id, generation) in members:
        frames.setdefault(_link_of(i, len(links), SLOTS), []).append(
            _heartbeat_frame(i, group, member_id, generation)
        )
    for k, batch in frames.items():
        await links[k].send(b"".join(batch))


def _heartbeat_frame(i: int, group: str, member_id: str, generation: int) -> bytes:
    """Member ``i``'s Heartbeat; its correlation id is ``i``."""
    body = {"group_id": group, "generation_id": generation, "member_id": member_id}
    return encode_request(ApiKey.HEARTBEAT, 0, i, CLIENT_ID, body)


def _link_of(member: int, links: int, slots: int) -> int:
    """The connection of a member: a slot's members on as many different connections as
    there are (no read carries two of one slot's heartbeats), each connection's members
    in different slots."""
    return (member // slots + (member % slots) * max(1, links // slots)) % links


def _slot_frames(
    links: Sequence[_Link], members: Sequence[tuple[str, str, int]], slots: int
) -> list[list[tuple[_Link, bytes]]]:
    """Per slot of the interval, each link's heartbeat frames for that slot, joined: the
    members of a slot are spread over the links, as separate consumers' would be."""
    out = []
    for s in range(slots):
        by_link: dict[int, list[bytes]] = {}
        for i in range(s, len(members), slots):
            frame = _heartbeat_frame(i, *members[i])
            by_link.setdefault(_link_of(i, len(links), slots), []).append(frame)
        out.append([(links[k], b"".join(frames)) for k, frames in by_link.items()])
    return out


async def _pace(slots: list[list[tuple[_Link, bytes]]], interval_s: float, seconds: float) -> None:
    """Each slot's frames at its instant, for ``seconds``."""
    start = time.monotonic()
    end = start + seconds
    tick = 0
    while time.monotonic() < end:
        for link, data in slots[tick % len(slots)]:
            await link.send(data)
        tick += 1
        await trio.sleep(max(0.0, start + tick * interval_s / len(slots) - time.monotonic()))
