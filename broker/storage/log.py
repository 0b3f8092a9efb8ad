"""A partition's log: ordered segments, append/read/truncate, recovery and retention.

Invariants: segments are contiguous in offsets; the active (last) segment is the
only one written; every byte below ``size`` of every segment is a whole batch
(recovery enforces it for the active segment, which is the only one a crash can
tear). Reads are served with pread straight from the files.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from protocol.batch import (
    LOG_OVERHEAD,
    CorruptBatch,
    check_batch,
    patch_base_offset,
    patch_leader_epoch,
    unpack_header,
)
from protocol.errors import CorruptMessage, MessageTooLarge, OffsetOutOfRange

from .segment import Segment, scan_headers

_LEN_AT = 8


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 1073741824
    retention_bytes: int = -1
    retention_ms: int = 604800000
    index_interval_bytes: int = 4096
    flush_interval_messages: int = 2**63 - 1
    max_message_bytes: int = 1048588
    segment_ms: int = 604800000


class AppendInfo:
    __slots__ = ("first_offset", "last_offset", "max_timestamp", "num_bytes", "record_count")

    def __init__(
        self,
        first_offset: int,
        last_offset: int,
        max_timestamp: int,
        record_count: int,
        num_bytes: int,
    ):
        self.first_offset = first_offset
        self.last_offset = last_offset
        self.max_timestamp = max_timestamp
        self.record_count = record_count
        self.num_bytes = num_bytes


class ReadResult:
    __slots__ = ("data", "first_offset", "next_offset")

    def __init__(self, data: bytes, first_offset: int, next_offset: int) -> None:
        self.data = data
        self.first_offset = first_offset
        self.next_offset = next_offset


class LogAppendError(ValueError):
    """A follower append that does not continue the log (offsets do not match the LEO)."""


class Log:
    def __init__(
        self, directory: Path, config: LogConfig, now_ms: Callable[[], int], logger: Any
    ) -> None:
        self.dir = directory
        self.config = config
        self.now_ms = now_ms
        self.log = logger
        self.segments: list[Segment] = []
        self._bases: list[int] = []
        self.log_start_offset = 0
        self._unflushed = 0

    # --- opening and recovery ---------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        config: LogConfig | None = None,
        *,
        now_ms: Callable[[], int] | None = None,
        logger: Any = None,
    ) -> Log:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        log = cls(
            directory,
            config or LogConfig(),
            now_ms or (lambda: int(time.time() * 1000)),
            logger or structlog.get_logger("minibroker.log"),
        )
        log._load()
        return log

    def _load(self) -> None:
        bases = sorted(int(p.stem) for p in self.dir.glob("*.log") if p.stem.isdigit())
        now = self.now_ms()
        for base in bases:
            segment = Segment(self.dir, base, self.config.index_interval_bytes, now)
            segment.created_ms = int(os.stat(segment.path).st_mtime * 1000)
            self.segments.append(segment)
        if not self.segments:
            self.segments.append(Segment(self.dir, 0, self.config.index_interval_bytes, now))
        for segment in self.segments[:-1]:
            headers, max_ts = scan_headers(segment)
            segment.max_timestamp = max_ts
            if headers:
                last_pos, _, _ = headers[-1]
                segment.next_offset = unpack_header(segment.pread(64, last_pos)).next_offset
            segment.rebuild_index(headers)
        self._recover(self.segments[-1])
        self._bases = [s.base_offset for s in self.segments]
        self.log_start_offset = self.segments[0].base_offset

    def _recover(self, segment: Segment) -> None:
        """Validate every batch of the active segment; cut a torn or corrupt tail."""
        data = segment.pread(segment.size, 0) if segment.size else b""
        position = 0
        expected = segment.base_offset
        headers = []
        max_ts = -1
        reason = None
        while position < len(data):
            if len(data) - position < LOG_OVERHEAD:
                reason = "torn batch header"
                break
            size = (
                int.from_bytes(
                    data[position + _LEN_AT : position + LOG_OVERHEAD], "big", signed=True
                )
                + LOG_OVERHEAD
            )
            if size <= LOG_OVERHEAD or position + size > len(data):
                reason = "torn batch" if size > LOG_OVERHEAD else "bad batch length"
                break
            try:
                header = check_batch(data, position, size)
            except CorruptBatch as exc:
                reason = str(exc)
                break
            if header.base_offset != expected:
                reason = f"batch offset {header.base_offset} where {expected} was expected"
                break
            headers.append((position, header.base_offset, size))
            max_ts = max(max_ts, header.max_timestamp)
            expected = header.next_offset
            position += size
        if reason is not None:
            self.log.warning(
                "log_recovery_truncated",
                file=str(segment.path),
                position=position,
                bytes_removed=len(data) - position,
                reason=reason,
            )
            segment.truncate_file(position)
        segment.next_offset = expected
        segment.max_timestamp = max_ts
        segment.rebuild_index(headers)

    # --- properties -----------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    # --- append ---------------------------------------------------------------------------

    def _validate(self, buf: bytes | bytearray | memoryview) -> list[tuple[int, Any]]:
        """Every batch checked before anything is written: all or nothing."""
        batches = []
        position = 0
        end = len(buf)
        max_bytes = self.config.max_message_bytes
        if end == 0:
            raise CorruptMessage("the record set is empty")
        while position < end:
            if end - position < LOG_OVERHEAD:
                raise CorruptMessage(f"truncated batch at byte {position}")
            size = (
                int.from_bytes(
                    buf[position + _LEN_AT : position + LOG_OVERHEAD], "big", signed=True
                )
                + LOG_OVERHEAD
            )
            if size > max_bytes:
                raise MessageTooLarge(
                    f"batch of {size} bytes exceeds message.max.bytes={max_bytes}"
                )
            if size <= LOG_OVERHEAD or position + size > end:
                raise CorruptMessage(f"truncated batch at byte {position}")
            try:
                header = check_batch(buf, position, size)
            except CorruptBatch as exc:
                raise CorruptMessage(str(exc)) from None
            batches.append((position, header))
            position += size
        return batches

    def append_as_leader(self, records: bytes | bytearray, leader_epoch: int) -> AppendInfo:
        """Validate, assign offsets from the LEO in place, write."""
        batches = self._validate(records)
        buf = records if isinstance(records, bytearray) else bytearray(records)
        offset = first = self.log_end_offset
        max_ts = -1
        count = 0
        for position, header in batches:
            patch_base_offset(buf, position, offset)
            patch_leader_epoch(buf, position, leader_epoch)
            offset += header.record_count
            count += header.record_count
            if header.max_timestamp > max_ts:
                max_ts = header.max_timestamp
        self._write(buf, first, offset, max_ts, count)
        return AppendInfo(first, offset - 1, max_ts, count, len(buf))

    def append_as_follower(self, records: bytes | bytearray) -> AppendInfo:
        """Copy the leader's batches verbatim; they must continue our log exactly."""
        batches = self._validate(records)
        expected = first = self.log_end_offset
        max_ts = -1
        count = 0
        for _, header in batches:
            if header.base_offset != expected:
                raise LogAppendError(
                    f"batch at offset {header.base_offset} does not follow log end offset {expected}"
                )
            expected = header.next_offset
            count += header.record_count
            if header.max_timestamp > max_ts:
                max_ts = header.max_timestamp
        self._write(records, first, expected, max_ts, count)
        return AppendInfo(first, expected - 1, max_ts, count, len(records))

    def _write(
        self, data: bytes | bytearray, first: int, next_offset: int, max_ts: int, count: int
    ) -> None:
        active = self.active
        if active.size and (
            active.size + len(data) > self.config.segment_bytes
            or self.now_ms() - active.created_ms > self.config.segment_ms
        ):
            active = self.roll()
        active.append(data, first, next_offset, max_ts)
        self._unflushed += count
        if self._unflushed >= self.config.flush_interval_messages:
            self.flush()

    def roll(self) -> Segment:
        old = self.active
        old.flush()
        segment = Segment(
            self.dir, old.next_offset, self.config.index_interval_bytes, self.now_ms()
        )
        segment.next_offset = old.next_offset
        self.segments.append(segment)
        self._bases.append(segment.base_offset)
        self.log.debug("segment_rolled", base_offset=segment.base_offset)
        return segment

    # --- read -----------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> ReadResult:
        """Whole batches from the one holding ``offset``, below ``max_offset``, within ``max_bytes``."""
        leo = self.log_end_offset
        if offset < self.log_start_offset or offset > leo:
            raise OffsetOutOfRange(f"offset {offset} is outside [{self.log_start_offset}, {leo}]")
        upper = leo if max_offset is None else min(max_offset, leo)
        if offset >= upper:
            return ReadResult(b"", offset, offset)
        i = bisect_right(self._bases, offset) - 1
        segment = self.segments[i]
        if offset >= segment.next_offset:  # only possible in an empty active segment
            return ReadResult(b"", offset, offset)
        position = segment.find_position(offset)
        if position is None:
            return ReadResult(b"", offset, offset)
        data = segment.pread(max(max_bytes, LOG_OVERHEAD), position)
        end = 0
        first = -1
        next_offset = offset
        while end + LOG_OVERHEAD <= len(data):
            base = int.from_bytes(data[end : end + 8], "big", signed=True)
            if base >= upper:
                break
            size = int.from_bytes(data[end + 8 : end + 12], "big", signed=True) + LOG_OVERHEAD
            if end + size > len(data):
                if end == 0 and min_one_batch:
                    # Kafka returns at least one whole batch, even past max_bytes.
                    data = segment.pread(size, position)
                    end = size
                    first = base
                    next_offset = unpack_header(data).next_offset
                break
            if first < 0:
                first = base
            next_offset = unpack_header(data, end).next_offset
            end += size
        return ReadResult(
            bytes(data[:end]) if end != len(data) else data,
            first if first >= 0 else offset,
            next_offset,
        )

    # --- truncation -----------------------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Drop every record at or above ``offset``; returns how many bytes went."""
        if offset >= self.log_end_offset:
            return 0
        if offset < self.log_start_offset:
            offset = self.log_start_offset
        removed = 0
        while len(self.segments) > 1 and self.segments[-1].base_offset >= offset:
            segment = self.segments.pop()
            self._bases.pop()
            removed += segment.size
            segment.delete()
        segment = self.active
        headers, _ = scan_headers(segment)
        keep = [h for h in headers if h[1] < offset]
        cut = 0
        next_offset = segment.base_offset
        max_ts = -1
        for position, _, size in keep:
            header = unpack_header(segment.pread(64, position))
            if header.next_offset > offset:
                # Offsets inside a batch: the whole batch goes (followers re-fetch it).
                break
            cut = position + size
            next_offset = header.next_offset
            max_ts = max(max_ts, header.max_timestamp)
        removed += segment.size - cut
        segment.truncate_file(cut)
        segment.next_offset = next_offset
        segment.max_timestamp = max_ts
        segment.rebuild_index([h for h in keep if h[0] < cut])
        self.log.info("log_truncated", to_offset=next_offset, bytes_removed=removed)
        return removed

    def truncate_fully_and_start_at(self, offset: int) -> None:
        for segment in self.segments:
            segment.delete()
        segment = Segment(self.dir, offset, self.config.index_interval_bytes, self.now_ms())
        segment.next_offset = offset
        self.segments = [segment]
        self._bases = [offset]
        self.log_start_offset = offset

    # --- timestamps and retention ---------------------------------------------------------

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """First batch whose max timestamp >= ``timestamp``: (its base offset, its max timestamp).

        Batch granularity, read from headers only: a consumer seeking by time starts at
        that batch and skips the earlier records in it by timestamp if it needs to.
        """
        for segment in self.segments:
            if segment.max_timestamp < timestamp:
                continue
            headers, _ = scan_headers(segment)
            for position, _, _ in headers:
                header = unpack_header(segment.pread(64, position))
                if header.max_timestamp >= timestamp:
                    return header.base_offset, header.max_timestamp
        return None

    def delete_old_segments(self) -> int:
        """Retention by time, then size; the active segment is never deleted."""
        cfg = self.config
        now = self.now_ms()
        deleted = 0
        total = self.size_bytes
        while len(self.segments) > 1:
            oldest = self.segments[0]
            newest_ts = oldest.max_timestamp if oldest.max_timestamp >= 0 else oldest.created_ms
            too_old = cfg.retention_ms >= 0 and now - newest_ts > cfg.retention_ms
            too_big = cfg.retention_bytes >= 0 and total - oldest.size >= cfg.retention_bytes
            if not (too_old or too_big):
                break
            self.segments.pop(0)
            self._bases.pop(0)
            total -= oldest.size
            oldest.delete()
            deleted += 1
        if deleted:
            self.log_start_offset = self.segments[0].base_offset
            self.log.info(
                "retention_deleted", segments=deleted, log_start_offset=self.log_start_offset
            )
        return deleted

    # --- durability -----------------------------------------------------------------------

    def flush(self) -> None:
        self.active.flush()
        self._unflushed = 0

    def close(self) -> None:
        try:
            self.flush()
        finally:
            for segment in self.segments:
                segment.close()
