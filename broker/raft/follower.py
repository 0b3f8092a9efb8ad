"""The follower's side: pull the log from the leader with Fetch, one request outstanding.

A valid answer appends records at our log end and brings the leader's high watermark (capped
at our log end); a DivergingEpoch answer truncates to where our log last agreed with the
leader's; a snapshot id answer means we are behind the leader's log start, so we fetch the
snapshot (FetchSnapshot) and resume fetching after it. Any successful answer resets the fetch
timer and tells the pre-vote check that the leader is live; when the timer runs out the
leader is presumed gone and we ask for pre-votes (KIP-996) before standing for election.
"""

from __future__ import annotations

from minibroker.broker.raft.core import RaftCore
from minibroker.broker.raft.effects import TruncateLog
from minibroker.broker.raft.messages import (
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
)
from minibroker.broker.raft.state import FollowerState, IllegalStateError
from minibroker.protocol.errors import ErrorCode


def poll(client: RaftCore, s: FollowerState, now: int) -> None:
    if now >= s.fetch_deadline:
        client.to_prospective()  # the leader is gone or cut off: Kafka's fetch timeout
        return
    if s.in_flight_until is not None and now >= s.in_flight_until:
        s.in_flight_until = None  # lost request or answer: ask again
    if s.in_flight_until is None and now >= s.next_fetch_at:
        send_fetch(client, s, now)


def send_fetch(client: RaftCore, s: FollowerState, now: int) -> None:
    s.correlation_id = client.next_correlation_id()
    if s.pending_snapshot is not None:
        message: Message = FetchSnapshotRequest(
            s.correlation_id, client.node_id, s.epoch, s.pending_snapshot
        )
    else:
        end = client.log.end_offset_and_epoch()
        message = FetchRequest(
            s.correlation_id,
            client.node_id,
            s.epoch,
            end.offset,
            end.epoch,
            client.config.fetch_max_wait_ms,
        )
    client.send(s.leader_id, message)
    s.in_flight_until = now + client.config.request_timeout_ms


def _accept_answer(
    client: RaftCore, source: int, resp: FetchResponse | FetchSnapshotResponse
) -> FollowerState | None:
    """The follower state if ``resp`` answers our outstanding fetch, else None (stale)."""
    client.maybe_transition(resp.leader_epoch, resp.leader_id)
    s = client.state
    if (
        not isinstance(s, FollowerState)
        or resp.leader_epoch != s.epoch
        or source != s.leader_id
        or resp.correlation_id != s.correlation_id
        or s.in_flight_until is None
    ):
        return None
    s.in_flight_until = None
    if resp.error != ErrorCode.NONE:
        s.next_fetch_at = client.now() + client.config.retry_backoff_ms
        return None
    s.fetch_deadline = client.fetch_deadline()
    s.fetched_at = client.now()  # the leader is live: refuse pre-votes (check-quorum)
    return s


def on_fetch_response(client: RaftCore, source: int, resp: FetchResponse) -> None:
    s = _accept_answer(client, source, resp)
    if s is None:
        return
    if resp.diverging_epoch is not None:
        offset = client.log.truncation_offset(resp.diverging_epoch)
        if offset < client.high_watermark:
            raise IllegalStateError(
                f"truncate to {offset} below the high watermark {client.high_watermark}"
            )
        client.emit(TruncateLog(offset))
        client.log.truncate(offset)
    elif resp.snapshot_id is not None:
        s.pending_snapshot = resp.snapshot_id
    else:
        if resp.records and resp.records[0].offset == client.log.end_offset:
            client.append_entries(resp.records)
        if resp.high_watermark is not None:
            s.high_watermark = resp.high_watermark
            client.advance_high_watermark(min(resp.high_watermark, client.log.end_offset))
    send_fetch(client, s, client.now())


def on_fetch_snapshot_response(client: RaftCore, source: int, resp: FetchSnapshotResponse) -> None:
    s = _accept_answer(client, source, resp)
    if s is None:
        return
    s.pending_snapshot = None
    snap = resp.snapshot
    if snap is not None and snap.snapshot_id.offset > client.log.start_offset:
        client.store_snapshot(snap)
        client.advance_high_watermark(snap.snapshot_id.offset)
    send_fetch(client, s, client.now())
