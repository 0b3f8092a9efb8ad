"""Offset ranges: what one Spark partition reads, and how reads are planned and rate-limited.

Pure arithmetic on ``{TopicPartition: offset}`` maps, shared by the batch and the
streaming reader, with no I/O and no pyspark, so the rules (Kafka's) are easy to test:
one range per topic partition, big ranges split to honour ``minPartitions``, and
``maxOffsetsPerTrigger`` shared among partitions in proportion to their backlog.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise

from minibroker.client.records import TopicPartition

Offsets = dict[TopicPartition, int]


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one topic partition; ``end`` never passes the planned HW."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Split ranges so there are about ``min_partitions`` of them, big ones into more pieces.

    Like Kafka's offset range calculator: nothing changes when there are already enough
    ranges; otherwise each range gets pieces in proportion to its share of all offsets.
    """
    ranges = [r for r in ranges if r.size > 0]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    out = []
    for r in ranges:
        pieces = max(1, min(r.size, round(r.size * min_partitions / total)))
        bounds = [r.start + r.size * i // pieces for i in range(pieces + 1)]
        out += [OffsetRange(r.topic, r.partition, a, b) for a, b in pairwise(bounds)]
    return out


def cap_offsets(start: Mapping[TopicPartition, int], latest: Offsets, max_rows: int) -> Offsets:
    """End offsets that admit at most ``max_rows`` rows after ``start``, shared pro rata.

    Largest remainders get the leftover rows, so exactly ``min(max_rows, backlog)`` rows
    are admitted and a partition with any backlog is never starved for ever.
    """
    backlog = {tp: max(0, end - start[tp]) for tp, end in latest.items()}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    shares = {tp: n * max_rows / total for tp, n in backlog.items()}
    grant = {tp: int(s) for tp, s in shares.items()}
    leftover = max_rows - sum(grant.values())
    for tp in sorted(shares, key=lambda tp: (grant[tp] - shares[tp], tp))[:leftover]:
        grant[tp] += 1
    return {tp: start[tp] + min(grant[tp], backlog[tp]) for tp in latest}


def to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """``{tp: n}`` -> ``{"topic": {"0": n}}``: Spark's offset JSON round trip makes keys strings."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
    return out


def from_json(offsets: Mapping[str, Mapping[str, int]] | str | None) -> Offsets:
    if offsets is None:
        return {}
    if isinstance(offsets, str):
        offsets = json.loads(offsets)
    return {
        TopicPartition(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()
    }


def plan_ranges(start: Mapping[TopicPartition, int], end: Offsets) -> Iterable[OffsetRange]:
    for tp, until in sorted(end.items()):
        yield OffsetRange(tp.topic, tp.partition, start[tp], until)
