"""The leader's side (Kafka's LeaderState and the leader half of KafkaRaftClient).

Followers pull: a Fetch names the follower's log end (offset, last epoch); the leader checks
it against its own log (valid, diverging or behind the snapshot), takes a valid fetch offset
as that voter's end offset, and moves the high watermark to the offset a majority holds, but
only past ``epoch_start_offset``: an entry of an older epoch is committed only once one of
the leader's own is (Raft's rule; the LeaderChange record at epoch start makes that prompt).

A Fetch with nothing new parks until data arrives, the high watermark moves, the leader
steps down, or ``max_wait_ms`` passes; ``next_deadline`` includes parked deadlines, so the
driver's timer (its purgatory) calls ``poll`` when one is due.
"""

from __future__ import annotations

from collections.abc import Sequence

from minibroker.broker.raft.core import RaftCore
from minibroker.broker.raft.messages import (
    BeginQuorumEpochRequest,
    Entry,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
)
from minibroker.broker.raft.state import LeaderState
from minibroker.protocol.errors import ErrorCode


def begin_epoch(client: RaftCore, s: LeaderState) -> None:
    """Write the LeaderChange control record and announce the epoch to every voter."""
    voters = ",".join(map(str, sorted(client.voters)))
    append(client, s, [f"LeaderChange leader={client.node_id} voters={voters}".encode()], True)
    for voter in s.voters:
        _send_begin_epoch(client, s, voter)


def _send_begin_epoch(client: RaftCore, s: LeaderState, voter: int) -> None:
    client.send(voter, BeginQuorumEpochRequest(s.epoch, client.node_id))
    s.voters[voter].begin_resend_at = client.now() + client.config.request_timeout_ms


def append(client: RaftCore, s: LeaderState, records: Sequence[bytes], control: bool) -> int:
    base = client.log.end_offset
    entries = tuple(Entry(base + i, s.epoch, data, control) for i, data in enumerate(records))
    if entries:
        client.append_entries(entries)
        _maybe_advance_high_watermark(client, s)
        answer_parked(client, s, ErrorCode.NONE)  # the parked followers have news
    return client.log.end_offset - 1


def _maybe_advance_high_watermark(client: RaftCore, s: LeaderState) -> None:
    offsets = [client.log.end_offset]
    offsets += [r.end_offset if r.end_offset is not None else -1 for r in s.voters.values()]
    offsets.sort(reverse=True)
    majority_offset = offsets[client.majority - 1]
    if majority_offset > s.epoch_start_offset and (
        s.high_watermark is None or majority_offset > s.high_watermark
    ):
        s.high_watermark = majority_offset
        client.advance_high_watermark(majority_offset)
        answer_parked(client, s, ErrorCode.NONE)  # followers learn the new high watermark


def _validate_leader_request(client: RaftCore, epoch: int) -> ErrorCode:
    """Kafka's validateLeaderOnlyRequest."""
    if epoch < client.epoch:
        return ErrorCode.FENCED_LEADER_EPOCH
    if epoch > client.epoch:
        return ErrorCode.UNKNOWN_LEADER_EPOCH
    if not isinstance(client.state, LeaderState):
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return ErrorCode.NONE


def _error_response(client: RaftCore, correlation_id: int, error: ErrorCode) -> FetchResponse:
    return FetchResponse(correlation_id, error, client.epoch, client.leader_id)


def on_fetch(client: RaftCore, source: int, req: FetchRequest) -> None:
    error = _validate_leader_request(client, req.current_leader_epoch)
    s = client.state
    if error != ErrorCode.NONE or not isinstance(s, LeaderState):
        client.send(source, _error_response(client, req.correlation_id, error))
        return
    replica = s.voters[source]
    replica.last_fetch_ms = client.now()  # a fetch of this epoch: the voter is with us
    replica.acknowledged = True
    if source in s.parked:  # a follower has one fetch outstanding: it gave up on the old one
        _answer(client, s, s.parked.pop(source)[1], ErrorCode.NONE)
    valid = client.log.validate_offset_and_epoch(req.fetch_offset, req.last_fetched_epoch)
    if valid.kind in ("diverging", "snapshot"):
        # The follower must truncate (DivergingEpoch) or fetch our snapshot first.
        where = "diverging_epoch" if valid.kind == "diverging" else "snapshot_id"
        answer = FetchResponse(
            req.correlation_id,
            ErrorCode.NONE,
            s.epoch,
            client.node_id,
            s.high_watermark,
            **{where: valid.offset_and_epoch},
        )
        client.send(source, answer)
        return
    replica.end_offset = req.fetch_offset
    high_watermark = s.high_watermark
    _maybe_advance_high_watermark(client, s)
    # Answer now when there is news: entries past the fetch offset, or a high watermark this
    # very fetch moved (the fetcher cannot know it yet; parked, it would learn it only at
    # max_wait, and every voter would apply each change that much later).
    # Also when the high watermark moved since this voter's last answer (another voter's
    # fetch moved it): the second follower to fetch after an append would otherwise park and
    # learn the commit only at max_wait, so a new topic's replicas started 500 ms late.
    moved = s.high_watermark != high_watermark
    behind = replica.sent_high_watermark != s.high_watermark
    if req.fetch_offset < client.log.end_offset or moved or behind or req.max_wait_ms <= 0:
        _answer(client, s, req, ErrorCode.NONE)
    else:
        s.parked[source] = (client.now() + req.max_wait_ms, req)


def on_fetch_snapshot(client: RaftCore, source: int, req: FetchSnapshotRequest) -> None:
    error = _validate_leader_request(client, req.current_leader_epoch)
    s = client.state
    if error == ErrorCode.NONE and isinstance(s, LeaderState):
        s.voters[source].last_fetch_ms = client.now()  # snapshot fetches count for check quorum
        s.voters[source].acknowledged = True
    # Always the newest snapshot: any committed snapshot past the follower's log will do.
    snapshot = client.log.snapshot if error == ErrorCode.NONE else None
    client.send(
        source,
        FetchSnapshotResponse(req.correlation_id, error, client.epoch, client.leader_id, snapshot),
    )


def _answer(client: RaftCore, s: LeaderState, req: FetchRequest, error: ErrorCode) -> None:
    if error != ErrorCode.NONE:
        client.send(req.replica_id, _error_response(client, req.correlation_id, error))
        return
    config = client.config
    records = client.log.read(req.fetch_offset, config.fetch_max_entries, config.fetch_max_bytes)
    replica = s.voters.get(req.replica_id)
    if replica is not None:
        replica.sent_high_watermark = s.high_watermark
    client.send(
        req.replica_id,
        FetchResponse(
            req.correlation_id, ErrorCode.NONE, s.epoch, client.node_id, s.high_watermark, records
        ),
    )


def answer_parked(client: RaftCore, s: LeaderState, error: ErrorCode) -> None:
    parked, s.parked = s.parked, {}
    for _deadline, req in parked.values():
        _answer(client, s, req, error)


def poll(client: RaftCore, s: LeaderState, now: int) -> None:
    if now >= _check_quorum_deadline(client, s):
        client.to_resigned()  # no majority has fetched lately: stop acting as leader
        return
    for voter, replica in s.voters.items():
        if not replica.acknowledged and now >= replica.begin_resend_at:
            _send_begin_epoch(client, s, voter)
    for voter, (deadline, req) in list(s.parked.items()):
        if now >= deadline:
            del s.parked[voter]
            _answer(client, s, req, ErrorCode.NONE)


def next_deadline(client: RaftCore, s: LeaderState) -> int:
    deadline = _check_quorum_deadline(client, s)
    for replica in s.voters.values():
        if not replica.acknowledged:
            deadline = min(deadline, replica.begin_resend_at)
    for parked_deadline, _req in s.parked.values():
        deadline = min(deadline, parked_deadline)
    return deadline


def _check_quorum_deadline(client: RaftCore, s: LeaderState) -> int:
    """When the leader resigns unless more voters fetch: the majority's oldest recent fetch."""
    needed = client.majority - 1  # the leader counts itself
    if needed == 0:
        return 1 << 62
    recent = sorted((r.last_fetch_ms for r in s.voters.values()), reverse=True)
    return recent[needed - 1] + client.config.check_quorum_timeout_ms


def preferred_successors(s: LeaderState) -> tuple[int, ...]:
    """Voters by end offset, most caught up first: the order they should stand for election."""
    ranked = sorted(s.voters.items(), key=lambda item: -(item[1].end_offset or -1))
    return tuple(voter for voter, _replica in ranked)


def replica_end_offsets(s: LeaderState) -> dict[int, int | None]:
    """Each voter's fetched end offset, for ``cluster status`` (lag = leader end - this)."""
    return {voter: replica.end_offset for voter, replica in s.voters.items()}
