"""The controller quorum's disk: ``quorum-state``, the metadata log and its latest snapshot.

Why not broker/storage's segmented log: that log is built for big partitions (segments, a
sparse index, batches whose offsets the leader patches), while the metadata log is small, is
kept whole in memory by the core (RaftLog) anyway, and needs what partition logs never do:
entries carry their own Raft epoch and a control flag, and a snapshot replaces the log's
prefix. So this is one append-only file of self-checking records:

    length:u32  crc32:u32  offset:i64  epoch:i32  control:u8  data

(big-endian; the CRC covers everything after it). Loading reads records in order and stops at
the first torn or corrupt one, truncating the file there: a crash mid-append loses only an
entry that was never acknowledged (the core's contract makes every append durable before any
Send that could acknowledge it). A snapshot is written atomically (temp, fsync, rename) with
a CRC, then the log is rewritten atomically keeping the entries after it.

The driver applies each durable effect here, in order, before it sends anything later.
Writes are synchronous (with fsync): metadata changes are rare and small, and a Send must
not overtake them.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

from minibroker.broker.common.atomic_file import write_atomic
from minibroker.broker.metadata.image import MetadataStoreError
from minibroker.broker.raft import Entry, OffsetAndEpoch, QuorumStateData, RaftLog, Snapshot

_HEAD = struct.Struct(">II")  # length of the rest, crc32 of the body
_BODY = struct.Struct(">qiB")  # offset, epoch, control
_SNAP = struct.Struct(">qiI")  # end offset, epoch, crc32 of the data

QUORUM_STATE = "quorum-state"
LOG_FILE = "metadata.log"
SNAPSHOT_FILE = "metadata.snapshot"


class QuorumStoreError(MetadataStoreError):
    """The quorum's files are unreadable in a way a torn tail does not explain."""


def encode_entry(entry: Entry) -> bytes:
    body = _BODY.pack(entry.offset, entry.epoch, int(entry.control)) + entry.data
    return _HEAD.pack(len(body), zlib.crc32(body)) + body


def decode_entries(raw: bytes) -> tuple[list[Entry], int]:
    """The valid entries in ``raw`` and the byte length they fill (the rest is a torn tail)."""
    entries: list[Entry] = []
    pos = 0
    while pos + _HEAD.size <= len(raw):
        length, crc = _HEAD.unpack_from(raw, pos)
        body = raw[pos + _HEAD.size : pos + _HEAD.size + length]
        if length < _BODY.size or len(body) < length or zlib.crc32(body) != crc:
            break
        offset, epoch, control = _BODY.unpack_from(body)
        if entries and offset != entries[-1].offset + 1:
            break
        entries.append(Entry(offset, epoch, bytes(body[_BODY.size :]), bool(control)))
        pos += _HEAD.size + length
    return entries, pos


class QuorumStore:
    """Mirrors the core's durable effects under ``directory`` (``<data dir>/__cluster_metadata``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.log = RaftLog()
        self.quorum_state: QuorumStateData | None = None
        self._sizes: list[int] = []  # byte size of each entry in the file, for truncation
        self._file = None

    # --- loading ----------------------------------------------------------------------

    def load(self) -> tuple[QuorumStateData | None, RaftLog]:
        """Read quorum-state, snapshot and log; cut a torn log tail. Raises QuorumStoreError."""
        self.quorum_state = self._load_quorum_state()
        snapshot = self._load_snapshot()
        path = self.directory / LOG_FILE
        raw = path.read_bytes() if path.exists() else b""
        entries, valid = decode_entries(raw)
        start = snapshot.snapshot_id.offset if snapshot else 0
        if entries and entries[0].offset != start:
            if entries[-1].offset < start:  # crashed between snapshot and log rewrite
                entries, valid = [], 0
            else:
                entries = [e for e in entries if e.offset >= start]
                valid = None  # rewrite below
        self.log = RaftLog(snapshot, entries)
        if valid is None or valid != len(raw):
            self._rewrite()
        self._sizes = [len(encode_entry(e)) for e in entries]
        if self._file is None:
            self._file = open(path, "ab")  # noqa: SIM115 (kept open for appends)
        return self.quorum_state, self.log.copy()

    def _load_quorum_state(self) -> QuorumStateData | None:
        path = self.directory / QUORUM_STATE
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_bytes())
            return QuorumStateData(data["leader_epoch"], data["leader_id"], data["voted_id"])
        except (ValueError, KeyError, TypeError) as exc:
            raise QuorumStoreError(f"{path}: unreadable quorum state ({exc})") from None

    def _load_snapshot(self) -> Snapshot | None:
        path = self.directory / SNAPSHOT_FILE
        if not path.exists():
            return None
        raw = path.read_bytes()
        if len(raw) < _SNAP.size:
            raise QuorumStoreError(f"{path}: truncated snapshot ({len(raw)} bytes)")
        offset, epoch, crc = _SNAP.unpack_from(raw)
        data = raw[_SNAP.size :]
        if zlib.crc32(data) != crc:
            raise QuorumStoreError(f"{path}: snapshot checksum mismatch")
        return Snapshot(OffsetAndEpoch(offset, epoch), data)

    # --- the durable effects --------------------------------------------------------------

    def persist_quorum_state(self, state: QuorumStateData) -> None:
        body = {
            "leader_epoch": state.leader_epoch,
            "leader_id": state.leader_id,
            "voted_id": state.voted_id,
        }
        write_atomic(self.directory / QUORUM_STATE, json.dumps(body).encode())
        self.quorum_state = state

    def append(self, entries: tuple[Entry, ...]) -> None:
        self.log.append(entries)
        chunks = [encode_entry(e) for e in entries]
        self._file.write(b"".join(chunks))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._sizes.extend(len(c) for c in chunks)

    def truncate(self, offset: int) -> None:
        keep = offset - self.log.start_offset
        self.log.truncate(offset)
        del self._sizes[keep:]
        self._file.truncate(sum(self._sizes))
        os.fsync(self._file.fileno())

    def store_snapshot(self, snapshot: Snapshot) -> None:
        sid = snapshot.snapshot_id
        head = _SNAP.pack(sid.offset, sid.epoch, zlib.crc32(snapshot.data))
        write_atomic(self.directory / SNAPSHOT_FILE, head + snapshot.data)
        self.log.store_snapshot(snapshot)
        self._rewrite()
        self._sizes = [len(encode_entry(e)) for e in self.log.entries]

    def _rewrite(self) -> None:
        """Replace the log file by exactly the in-memory entries (atomic)."""
        if self._file is not None:
            self._file.close()
        path = self.directory / LOG_FILE
        write_atomic(path, b"".join(encode_entry(e) for e in self.log.entries))
        self._file = open(path, "ab")  # noqa: SIM115

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
