"""Raft's safety properties, checked as each simulated voter's effects land on its disk.

Kept beside the simulation (not a test module). Each check is incremental (the entries an
effect adds, truncates or commits), so checking after every step stays cheap:

- election safety: at most one leader per epoch (every LeaderChanged must agree);
- log matching: (offset, epoch) names one entry, and one predecessor epoch, everywhere;
- leader completeness: an entry committed in epoch T is in the log of every leader of an
  epoch after T (checked when a leader is elected and when a commit becomes known);
- committed entries never change, are never truncated, and high watermarks never go back;
- state machine safety: every voter applies the same entries in the same order (a digest
  chain per offset), and a snapshot carries the digest of the state at its offset;
- atomic changes: every voter's image is always the result of whole units (a unit is the
  records of one controller change, as the metadata image applies them): no unit is ever
  seen with some of its records and not the others, whatever fetch limits, elections,
  crashes and snapshots did to the log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from minibroker.broker.raft import AppendLog, HighWatermarkUpdated, LeaderChanged, RaftLog, Snapshot


class SafetyViolation(AssertionError):
    pass


class Node(Protocol):
    id: int
    hw: int

    @property
    def log(self) -> RaftLog: ...


class SafetyChecker:
    def __init__(self, leaders: Callable[[], Iterable[tuple[int, int, RaftLog]]]) -> None:
        self._current_leaders = leaders  # (node id, epoch, durable log) of voters now leading
        self.leaders: dict[int, int] = {}  # epoch -> leader
        self.entries: dict[tuple[int, int], tuple[bytes, bool, int]] = {}
        self.committed: dict[int, tuple[int, bytes]] = {}  # offset -> (epoch, data)
        self.commit_epoch: dict[int, int] = {}
        self.digests: dict[int, int] = {0: 0}  # applied offset -> state digest

    def fail(self, message: str) -> None:
        raise SafetyViolation(message)

    def leader_changed(self, node: Node, effect: LeaderChanged) -> None:
        if effect.leader_id is not None:
            first = self.leaders.setdefault(effect.epoch, effect.leader_id)
            if first != effect.leader_id:
                self.fail(
                    f"election safety: epoch {effect.epoch} has leaders {first} and "
                    f"{effect.leader_id} (seen by node {node.id})"
                )
        if effect.role == "leader":
            for offset in self.committed:
                self._check_has(node.id, node.log, effect.epoch, offset)

    def _check_has(self, node_id: int, log: RaftLog, epoch: int, offset: int) -> None:
        if self.commit_epoch[offset] >= epoch or offset < log.start_offset:
            return  # not yet required, or covered by the snapshot (digests check that)
        entry = log.entry(offset)
        if entry is None or (entry.epoch, entry.data) != self.committed[offset]:
            self.fail(
                f"leader completeness: leader {node_id} of epoch {epoch} lacks offset {offset} "
                f"committed in epoch {self.commit_epoch[offset]}: has {entry}, "
                f"committed {self.committed[offset]}"
            )

    def append(self, node: Node, effect: AppendLog) -> None:
        log = node.log
        offset, prev_epoch = log.end_offset, log.last_epoch
        for entry in effect.entries:
            if entry.offset != offset:
                self.fail(f"node {node.id} appends offset {entry.offset} at log end {offset}")
            if entry.epoch < prev_epoch:
                self.fail(f"node {node.id}: epoch {entry.epoch} after {prev_epoch} at {offset}")
            value = (entry.data, entry.control, prev_epoch)
            first = self.entries.setdefault((entry.offset, entry.epoch), value)
            if first != value:
                self.fail(
                    f"log matching: node {node.id} has (offset {entry.offset}, epoch "
                    f"{entry.epoch}) = {value}, another log has {first}"
                )
            offset, prev_epoch = offset + 1, entry.epoch

    def truncate(self, node: Node, offset: int) -> None:
        if offset < node.hw:
            self.fail(f"node {node.id} truncates to {offset} below its high watermark {node.hw}")
        self._check_not_dropping(node, range(offset, node.log.end_offset), "truncates")

    def _check_not_dropping(self, node: Node, offsets: range, verb: str) -> None:
        for offset in offsets:
            entry = node.log.entry(offset)
            if entry is not None and self.committed.get(offset) == (entry.epoch, entry.data):
                self.fail(f"node {node.id} {verb} committed offset {offset} ({entry})")

    def store_snapshot(self, node: Node, snapshot: Snapshot) -> None:
        sid = snapshot.snapshot_id
        offset, digest = decode_snapshot(snapshot.data)
        if offset != sid.offset or self.digests.get(offset) != digest:
            self.fail(
                f"node {node.id} stores snapshot {sid} of state ({offset}, {digest}); "
                f"the applied state there is {self.digests.get(sid.offset)}"
            )
        at = node.log.entry(sid.offset - 1)
        if at is None or at.epoch != sid.epoch:  # the whole log goes
            self._check_not_dropping(node, range(sid.offset, node.log.end_offset), "drops")

    def high_watermark(self, node: Node, effect: HighWatermarkUpdated) -> None:
        if effect.offset < node.hw:
            self.fail(f"node {node.id} high watermark goes back: {node.hw} -> {effect.offset}")
        log = node.log
        for offset in range(max(node.hw, log.start_offset), effect.offset):
            entry = log.entry(offset)
            if entry is None:
                self.fail(f"node {node.id} commits {offset} beyond its log end {log.end_offset}")
            value = (entry.epoch, entry.data)
            first = self.committed.setdefault(offset, value)
            if first != value:
                self.fail(
                    f"committed entry changed: offset {offset} is {first} and, on node "
                    f"{node.id}, {value}"
                )
            known = self.commit_epoch.get(offset)
            self.commit_epoch[offset] = effect.epoch if known is None else min(known, effect.epoch)
            for leader_id, epoch, leader_log in self._current_leaders():
                self._check_has(leader_id, leader_log, epoch, offset)
        node.hw = effect.offset

    def image_whole(self, node_id: int, image: dict[int, int], sizes: dict[int, int]) -> None:
        """``image``: records applied per unit on one voter; ``sizes``: each unit's records."""
        for unit, applied in image.items():
            if applied != sizes[unit]:
                self.fail(
                    f"atomic changes: node {node_id} holds {applied} of the {sizes[unit]} "
                    f"records of unit {unit}"
                )

    def applied(self, node_id: int, offset: int, digest: int) -> None:
        """``digest`` is the state after applying every entry below ``offset``."""
        first = self.digests.setdefault(offset, digest)
        if first != digest:
            self.fail(f"state machine of node {node_id} differs after offset {offset - 1}")


def encode_snapshot(offset: int, digest: int, image: dict[int, int] | None = None) -> bytes:
    units = ",".join(f"{unit}={n}" for unit, n in sorted((image or {}).items()))
    return f"{offset}:{digest}:{units}".encode()


def decode_snapshot(data: bytes) -> tuple[int, int]:
    offset, digest, _units = data.decode().split(":")
    return int(offset), int(digest)


def decode_snapshot_image(data: bytes) -> dict[int, int]:
    units = data.decode().split(":")[2]
    return {int(u): int(n) for u, n in (item.split("=") for item in units.split(",") if item)}
