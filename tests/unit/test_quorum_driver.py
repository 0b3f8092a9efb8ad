"""The quorum driver's disk: a voter restarts from quorum-state + metadata log + snapshot.

A one-voter quorum on a manual clock elects itself, appends, commits and snapshots through
the real QuorumStore; a new driver on the same directory must come back with the same
epoch, vote, log and state machine, having applied each committed entry exactly once.
"""

from __future__ import annotations

import structlog

from minibroker.broker.common.clock import ManualClock
from minibroker.broker.raft import Entry, QuorumStateData
from minibroker.broker.raft.driver import METADATA_DIR, QuorumDriver
from minibroker.broker.raft.store import LOG_FILE, QuorumStore, encode_entry
from minibroker.broker.raft.wire import decode_request, decode_response, encode
from minibroker.protocol import (
    ApiKey,
    decode_request_envelope,
    decode_response_envelope,
    encode_request,
    encode_response,
    validate_request,
    validate_response,
)


class Counter:
    """A state machine: the list of applied records."""

    def __init__(self) -> None:
        self.records: list[bytes] = []

    def apply(self, entry: Entry) -> None:
        self.records.append(entry.data)

    def snapshot(self) -> bytes:
        return b"\n".join(self.records)

    def restore(self, data: bytes) -> None:
        self.records = data.split(b"\n") if data else []


def driver(tmp_path, clock, machine, snapshot_every=1000) -> QuorumDriver:
    d = QuorumDriver(
        0,
        {0: ("127.0.0.1", 1)},
        tmp_path,
        clock,
        structlog.get_logger(),
        state_machine=machine,
        snapshot_every=snapshot_every,
    )
    d.load()
    d._apply(d.core.start())
    return d


def elect(d: QuorumDriver, clock: ManualClock) -> None:
    clock.advance(d.core.next_deadline_ms() - clock.now_ms())
    d._apply(d.core.poll())
    assert d.core.role == "leader" and d.is_active


def test_restart_keeps_epoch_vote_log_and_applied_state(tmp_path):
    clock, machine = ManualClock(), Counter()
    d = driver(tmp_path, clock, machine)
    assert not d.is_active
    elect(d, clock)
    d.append([b"a", b"b"])
    d.append([b"c"])
    assert machine.records == [b"a", b"b", b"c"]  # one voter: committed at once
    epoch, end = d.core.epoch, d.core.log.end_offset
    d.store.close()

    again = Counter()
    d2 = driver(tmp_path, ManualClock(), again)
    assert d2.store.quorum_state == QuorumStateData(epoch, 0, 0)
    assert d2.core.log.end_offset == end
    assert d2.core.role == "resigned"  # never resumes as leader: a new election first
    elect(d2, d2.clock)
    assert d2.core.epoch == epoch + 1
    assert again.records == [b"a", b"b", b"c"]  # re-applied from the log, once each


def test_snapshot_replaces_the_log_prefix_and_restores_the_state(tmp_path):
    clock, machine = ManualClock(), Counter()
    d = driver(tmp_path, clock, machine, snapshot_every=4)
    elect(d, clock)
    for i in range(6):
        d.append([f"r{i}".encode()])
    assert d.core.log.start_offset > 0  # a snapshot was taken and the log cut
    start = d.core.log.start_offset
    d.store.close()

    again = Counter()
    d2 = driver(tmp_path, ManualClock(), again, snapshot_every=4)
    assert d2.core.log.start_offset == start
    elect(d2, d2.clock)
    assert again.records == [f"r{i}".encode() for i in range(6)]


def test_a_torn_log_tail_is_cut_and_the_rest_kept(tmp_path):
    store = QuorumStore(tmp_path / METADATA_DIR)
    store.load()
    store.append((Entry(0, 1, b"x"), Entry(1, 1, b"y")))
    store.close()
    path = tmp_path / METADATA_DIR / LOG_FILE
    whole = path.read_bytes()
    path.write_bytes(whole + encode_entry(Entry(2, 1, b"torn"))[:-2])
    _, log = QuorumStore(tmp_path / METADATA_DIR).load()
    assert [e.data for e in log.entries] == [b"x", b"y"]
    assert path.read_bytes() == whole


def test_truncate_then_append_survives_restart(tmp_path):
    store = QuorumStore(tmp_path)
    store.load()
    store.append((Entry(0, 1, b"a"), Entry(1, 1, b"b"), Entry(2, 1, b"c")))
    store.truncate(1)
    store.append((Entry(1, 2, b"B"),))
    store.close()
    _, log = QuorumStore(tmp_path).load()
    assert [(e.epoch, e.data) for e in log.entries] == [(1, b"a"), (2, b"B")]


def test_every_quorum_message_round_trips_through_its_wire_schema(tmp_path):
    """Each request and response the core emits passes the protocol schema and decodes back."""
    clock = ManualClock()
    d = driver(tmp_path, clock, Counter())
    elect(d, clock)
    d.append([b"x"])
    from minibroker.broker.raft import messages as m

    samples = [
        (ApiKey.VOTE, m.VoteRequest(3, 1, 2, 10), m.VoteResponse(0, 3, None, True)),
        (ApiKey.BEGIN_QUORUM_EPOCH, m.BeginQuorumEpochRequest(3, 1), None),
        (ApiKey.END_QUORUM_EPOCH, m.EndQuorumEpochRequest(3, 1, (2, 0)), None),
        (
            ApiKey.QUORUM_FETCH,
            m.FetchRequest(1 << 40, 2, 3, 5, 2, 500),
            m.FetchResponse(1 << 40, 0, 3, 1, 4, tuple(d.core.log.entries), None, None),
        ),
        (
            ApiKey.FETCH_SNAPSHOT,
            m.FetchSnapshotRequest(7, 2, 3, m.OffsetAndEpoch(4, 2)),
            m.FetchSnapshotResponse(7, 0, 3, 1, m.Snapshot(m.OffsetAndEpoch(4, 2), b"s")),
        ),
    ]
    for key, request, response in samples:  # through msgpack and the schema, as on the wire
        header, raw = decode_request_envelope(encode_request(key, 0, 1, "t", encode(request))[4:])
        assert decode_request(key, validate_request(header, raw)) == request
        if response is not None:
            _, raw = decode_response_envelope(encode_response(1, encode(response))[4:])
            assert decode_response(key, validate_response(key, 0, raw)) == response


def three_voter_leader(tmp_path, clock):
    """Voter 0 of {0, 1, 2}, made leader by hand (no network: peers are never started)."""
    from minibroker.broker.raft.messages import VoteResponse
    from minibroker.protocol.errors import ErrorCode

    d = QuorumDriver(
        0, {0: ("h", 1), 1: ("h", 2), 2: ("h", 3)}, tmp_path, clock, structlog.get_logger()
    )
    d.load()
    d._apply(d.core.start())
    clock.advance(d.core.next_deadline_ms() - clock.now_ms())
    d._apply(d.core.poll())
    d._apply(d.core.handle(1, VoteResponse(ErrorCode.NONE, d.core.epoch, None, True, True)))
    d._apply(d.core.handle(1, VoteResponse(ErrorCode.NONE, d.core.epoch, None, True)))
    assert d.core.role == "leader"
    return d


def fetch_from(d, replica, offset):
    from minibroker.broker.raft.messages import FetchRequest

    epoch = d.core.log.epoch_at(offset)
    return d.core.handle(replica, FetchRequest(1, replica, d.core.epoch, offset, epoch, 0))


def test_an_answer_waits_for_commit_and_active_follows_the_epoch_start(tmp_path):
    clock = ManualClock()
    changes = []
    d = three_voter_leader(tmp_path, clock)
    d.on_active_change = changes.append
    assert not d.is_active  # leader, but its epoch start is not committed yet
    d._apply(fetch_from(d, 1, d.core.log.end_offset))
    assert d.is_active and changes == [True]
    pending = d.append_and_answer([b"r"], {"error_code": 0})
    assert pending.body is None  # appended, not committed: no answer yet
    d._apply(fetch_from(d, 2, d.core.log.end_offset))  # a majority has it now
    assert pending.body == {"error_code": 0}


def test_an_answer_pending_when_leadership_is_lost_says_not_controller(tmp_path):
    from minibroker.broker.raft.messages import BeginQuorumEpochRequest

    clock = ManualClock()
    changes = []
    d = three_voter_leader(tmp_path, clock)
    d.on_active_change = changes.append
    d._apply(fetch_from(d, 1, d.core.log.end_offset))
    pending = d.append_and_answer([b"r"], {"error_code": 0})
    d._apply(d.core.handle(2, BeginQuorumEpochRequest(d.core.epoch + 1, 2)))
    assert pending.body["error_code"] == 41  # NOT_CONTROLLER
    assert "the controller is now 2" in pending.body["error_message"]
    assert changes == [True, False] and not d.is_active
