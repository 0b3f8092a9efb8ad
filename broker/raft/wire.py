"""The quorum's messages as wire bodies (protocol/api.py's VOTE ... FETCH_SNAPSHOT schemas).

Pure conversion both ways, so it stays on the sans-IO side: the driver sends a request's body
under its API key and turns the validated answer back into the core's response type. Bodies
arrive already validated by the schema, so decoding only rebuilds the dataclasses.
"""

from __future__ import annotations

from minibroker.broker.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    Entry,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    OffsetAndEpoch,
    Snapshot,
    VoteRequest,
    VoteResponse,
)
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import ErrorCode

REQUEST_KEYS: dict[type, ApiKey] = {
    VoteRequest: ApiKey.VOTE,
    BeginQuorumEpochRequest: ApiKey.BEGIN_QUORUM_EPOCH,
    EndQuorumEpochRequest: ApiKey.END_QUORUM_EPOCH,
    FetchRequest: ApiKey.QUORUM_FETCH,
    FetchSnapshotRequest: ApiKey.FETCH_SNAPSHOT,
}
# The response type that answers each API: the driver matches a core's Send to a waiting call.
RESPONSE_TYPES: dict[ApiKey, type] = {
    ApiKey.VOTE: VoteResponse,
    ApiKey.BEGIN_QUORUM_EPOCH: BeginQuorumEpochResponse,
    ApiKey.END_QUORUM_EPOCH: EndQuorumEpochResponse,
    ApiKey.QUORUM_FETCH: FetchResponse,
    ApiKey.FETCH_SNAPSHOT: FetchSnapshotResponse,
}
QUORUM_APIS = frozenset(RESPONSE_TYPES)
# The request field naming its sender: it must be the authenticated peer (no speaking for others).
SENDER_FIELDS: dict[int, str] = {
    ApiKey.VOTE: "candidate_id",
    ApiKey.BEGIN_QUORUM_EPOCH: "leader_id",
    ApiKey.END_QUORUM_EPOCH: "leader_id",
    ApiKey.QUORUM_FETCH: "replica_id",
    ApiKey.FETCH_SNAPSHOT: "replica_id",
}


def _oe(value: OffsetAndEpoch | None) -> dict | None:
    return None if value is None else {"offset": value.offset, "epoch": value.epoch}


def _oe_from(body: dict | None) -> OffsetAndEpoch | None:
    return None if body is None else OffsetAndEpoch(body["offset"], body["epoch"])


def _entry(e: Entry) -> dict:
    return {"offset": e.offset, "epoch": e.epoch, "data": e.data, "control": e.control}


def encode(message: Message) -> dict:
    """The wire body of any quorum message (request or response)."""
    m = message
    if isinstance(m, VoteRequest):
        return {
            "candidate_epoch": m.candidate_epoch,
            "candidate_id": m.candidate_id,
            "last_offset_epoch": m.last_offset_epoch,
            "last_offset": m.last_offset,
        }
    if isinstance(m, BeginQuorumEpochRequest):
        return {"leader_epoch": m.leader_epoch, "leader_id": m.leader_id}
    if isinstance(m, EndQuorumEpochRequest):
        return {
            "leader_epoch": m.leader_epoch,
            "leader_id": m.leader_id,
            "preferred_successors": list(m.preferred_successors),
        }
    if isinstance(m, FetchRequest):
        return {
            "correlation_id": m.correlation_id,
            "replica_id": m.replica_id,
            "current_leader_epoch": m.current_leader_epoch,
            "fetch_offset": m.fetch_offset,
            "last_fetched_epoch": m.last_fetched_epoch,
            "max_wait_ms": m.max_wait_ms,
        }
    if isinstance(m, FetchSnapshotRequest):
        return {
            "correlation_id": m.correlation_id,
            "replica_id": m.replica_id,
            "current_leader_epoch": m.current_leader_epoch,
            "snapshot_id": _oe(m.snapshot_id),
        }
    base = {"error_code": int(m.error), "leader_epoch": m.leader_epoch, "leader_id": m.leader_id}
    if isinstance(m, VoteResponse):
        return {**base, "vote_granted": m.vote_granted}
    if isinstance(m, BeginQuorumEpochResponse | EndQuorumEpochResponse):
        return base
    if isinstance(m, FetchResponse):
        return {
            **base,
            "correlation_id": m.correlation_id,
            "high_watermark": m.high_watermark,
            "records": [_entry(e) for e in m.records],
            "diverging_epoch": _oe(m.diverging_epoch),
            "snapshot_id": _oe(m.snapshot_id),
        }
    if isinstance(m, FetchSnapshotResponse):
        snap = m.snapshot
        return {
            **base,
            "correlation_id": m.correlation_id,
            "snapshot": None
            if snap is None
            else {"snapshot_id": _oe(snap.snapshot_id), "data": snap.data},
        }
    raise TypeError(f"not a quorum message: {type(m).__name__}")


def decode_request(api_key: int, b: dict) -> Message:
    if api_key == ApiKey.VOTE:
        return VoteRequest(
            b["candidate_epoch"], b["candidate_id"], b["last_offset_epoch"], b["last_offset"]
        )
    if api_key == ApiKey.BEGIN_QUORUM_EPOCH:
        return BeginQuorumEpochRequest(b["leader_epoch"], b["leader_id"])
    if api_key == ApiKey.END_QUORUM_EPOCH:
        return EndQuorumEpochRequest(
            b["leader_epoch"], b["leader_id"], tuple(b["preferred_successors"])
        )
    if api_key == ApiKey.QUORUM_FETCH:
        return FetchRequest(
            b["correlation_id"],
            b["replica_id"],
            b["current_leader_epoch"],
            b["fetch_offset"],
            b["last_fetched_epoch"],
            b["max_wait_ms"],
        )
    if api_key == ApiKey.FETCH_SNAPSHOT:
        return FetchSnapshotRequest(
            b["correlation_id"],
            b["replica_id"],
            b["current_leader_epoch"],
            _oe_from(b["snapshot_id"]),
        )
    raise ValueError(f"API {api_key} is not a quorum request")


def _error(b: dict) -> ErrorCode:
    try:
        return ErrorCode(b["error_code"])
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


def decode_response(api_key: int, b: dict) -> Message:
    err, epoch, leader = _error(b), b["leader_epoch"], b["leader_id"]
    if api_key == ApiKey.VOTE:
        return VoteResponse(err, epoch, leader, b["vote_granted"])
    if api_key == ApiKey.BEGIN_QUORUM_EPOCH:
        return BeginQuorumEpochResponse(err, epoch, leader)
    if api_key == ApiKey.END_QUORUM_EPOCH:
        return EndQuorumEpochResponse(err, epoch, leader)
    if api_key == ApiKey.QUORUM_FETCH:
        return FetchResponse(
            b["correlation_id"],
            err,
            epoch,
            leader,
            b["high_watermark"],
            tuple(Entry(e["offset"], e["epoch"], e["data"], e["control"]) for e in b["records"]),
            _oe_from(b["diverging_epoch"]),
            _oe_from(b["snapshot_id"]),
        )
    if api_key == ApiKey.FETCH_SNAPSHOT:
        s = b["snapshot"]
        snap = None if s is None else Snapshot(_oe_from(s["snapshot_id"]), s["data"])
        return FetchSnapshotResponse(b["correlation_id"], err, epoch, leader, snap)
    raise ValueError(f"API {api_key} is not a quorum API")
