"""A partition's log: ordered segments, append/read/truncate, recovery and retention.

Invariants: offsets strictly increase from batch to batch and segment to segment, with
gaps only where the log cleaner removed records (a compacted topic, as in Kafka: a
read at an offset in a gap gets the next batch); the active (last) segment is the
only one written; every byte below ``size`` of every segment is a whole batch
(recovery enforces it for the active segment and, after an unclean shutdown, for every
segment above the recovery point: the ones a crash can tear). Reads are served with
pread straight from the files.
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

from minibroker.broker.common.file_region import FileRegion
from minibroker.broker.storage.flusher import RecoveryPoint, fsync_all
from minibroker.broker.storage.log_txn import TransactionalLog
from minibroker.broker.storage.producer_state import ProducerStateManager
from minibroker.broker.storage.recompress import PRODUCER, recompressed
from minibroker.broker.storage.record_validation import validate_records
from minibroker.broker.storage.results import AppendInfo, ReadResult
from minibroker.broker.storage.segment import (
    BatchInfo,
    Segment,
    first_batch_reaching,
    scan_segment,
    walk_to,
)
from minibroker.broker.storage.start_offset import read_start_offset, write_start_offset
from minibroker.broker.storage.swap import discard_pending, recover_swaps
from minibroker.broker.storage.txn_index import AbortedTxn, TransactionIndex
from minibroker.broker.storage.txn_index import index_path as txn_index_path
from minibroker.protocol.batch import (
    BASE_AND_LENGTH,
    CONTROL_FLAG,
    HEADER_SIZE,
    LAST_DELTA,
    LAST_DELTA_AT,
    LENGTH_AT,
    LOG_OVERHEAD,
    PRODUCER_FLAG,
    TRANSACTIONAL_FLAG,
    CheckedBatches,
    CorruptBatch,
    batch_rows,
    check_batch,
    patch_base_offset,
    patch_leader_epoch,
    producer_fields,
    unpack_header,
)
from minibroker.protocol.errors import (
    CorruptMessage,
    InvalidRecord,
    MessageTooLarge,
    OffsetOutOfRange,
    RecordListTooLarge,
)

# How much of a segment a region read's walk takes at a time: several small batches'
# headers in one pread, and little read past a large batch's header.
_WALK_CHUNK = 1 << 13


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Per-partition settings, named after Kafka's topic configs (``segment.bytes``, ...).

    ``-1`` disables a retention limit, as in Kafka.
    """

    segment_bytes: int = 1073741824
    retention_bytes: int = -1
    retention_ms: int = 604800000
    index_interval_bytes: int = 4096
    flush_interval_messages: int = 2**63 - 1
    max_message_bytes: int = 1048588
    segment_ms: int = 604800000
    cleanup_policy: str = "delete"
    min_cleanable_dirty_ratio: float = 0.5
    delete_retention_ms: int = 86400000
    min_compaction_lag_ms: int = 0
    # What a leader's validation of produced records applies (storage/record_validation.py).
    # Unlimited here (Kafka before 4.0); a broker's topics take its settings.
    message_timestamp_difference_max_ms: int = 2**63 - 1
    message_timestamp_before_max_ms: int = 2**63 - 1
    message_timestamp_after_max_ms: int = 2**63 - 1
    max_decompressed_bytes: int = 64 * 1024 * 1024  # the broker's message.max.decompressed.bytes
    # The codec stored batches get (storage/recompress.py); producer: as they came.
    compression_type: str = "producer"

    @property
    def timestamp_before_max_ms(self) -> int:
        """before.max.ms, or difference.max.ms where it is unset (Kafka 3.6's LogConfig)."""
        before = self.message_timestamp_before_max_ms
        return self.message_timestamp_difference_max_ms if before == 2**63 - 1 else before

    @property
    def timestamp_after_max_ms(self) -> int:
        after = self.message_timestamp_after_max_ms
        return self.message_timestamp_difference_max_ms if after == 2**63 - 1 else after

    @property
    def compact(self) -> bool:
        """cleanup.policy includes compact: the log cleaner keeps the latest record per key."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """cleanup.policy includes delete: retention.ms / retention.bytes apply."""
        return "delete" in self.cleanup_policy


class LogAppendError(ValueError):
    """A follower append that does not continue the log (offsets do not match the LEO)."""


class Log(TransactionalLog):
    """One partition replica's log. Not thread-safe: the broker's trio loop owns it."""

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
        # Every offset below it is on disk (set by _load; see flusher.py).
        self.recovery = RecoveryPoint(0)
        self.producers = ProducerStateManager(directory, self.log)
        self.txn_index = TransactionIndex(directory)
        # The log cleaner's clean/dirty boundary (its checkpoint, read on first use).
        self.first_dirty_offset: int | None = None
        self.closed = False
        # While a cleaner pass runs; ``changes`` counts retention deletions and truncations,
        # which a pass planned before them must not swap over.
        self.cleaning = False
        self.changes = 0

    # --- opening and recovery ---------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        config: LogConfig | None = None,
        *,
        now_ms: Callable[[], int] | None = None,
        logger: Any = None,
        recovery_point: int | None = None,
    ) -> Log:
        """Open (or create) the log in ``directory``.

        ``recovery_point``: None after a clean shutdown; after an unclean one, the
        partition's checkpointed recovery point (0 when none is known): every segment
        reaching above it is validated batch by batch (see ``_load``).
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        log = cls(
            directory,
            config or LogConfig(),
            now_ms or (lambda: int(time.time() * 1000)),
            logger or structlog.get_logger("minibroker.log"),
        )
        log._load(recovery_point)
        return log

    def _load(self, recovery_point: int | None) -> None:
        """Open every segment, check they chain, and recover the unflushed ones.

        The active segment is validated batch by batch, CRC included, and so, after an
        unclean shutdown (``recovery_point`` not None), is every segment reaching above
        the recovery point: a crash may have torn any segment whose flush had not ended
        (Kafka's LogLoader.recoverLog). The rest get a header-only scan. At the first
        inconsistency, as in Kafka's recovery, the log is cut there: the damaged segment
        keeps its good prefix and becomes the active one, later segments are deleted
        (their offsets would no longer continue the log).
        """
        for event, detail in recover_swaps(self.dir):
            self.log.warning(event, **detail)
        bases = sorted(int(p.stem) for p in self.dir.glob("*.log") if p.stem.isdigit())
        now = self.now_ms()
        segments = []
        for base in bases:
            segment = Segment(self.dir, base, self.config.index_interval_bytes, now)
            segment.created_ms = int(os.stat(segment.path).st_mtime * 1000)
            segments.append(segment)
        if not segments:
            segments.append(Segment(self.dir, 0, self.config.index_interval_bytes, now, fresh=True))
        scans: dict[int, list[BatchInfo]] = {}
        keep = len(segments)
        for i, segment in enumerate(segments):
            # A gap is a compacted segment's removed tail (only a compacted log has them).
            expected = segments[i - 1].next_offset if i else segment.base_offset
            if segment.base_offset != expected and not (
                self.config.compact and segment.base_offset > expected
            ):
                keep = i
                self.log.warning(
                    "log_recovery_segment_out_of_sequence",
                    file=str(segment.path),
                    expected_base=segments[i - 1].next_offset,
                )
                break
            if i == len(segments) - 1:
                break  # the active segment is recovered below, with full validation
            # Below the recovery point a segment was on disk before the crash.
            verify = recovery_point is not None and segments[i + 1].base_offset > recovery_point
            scan = scan_segment(segment, verify=verify, gaps=self.config.compact)
            segment.next_offset = scan.next_offset
            segment.max_timestamp = scan.max_timestamp
            self._index_rebuilt(segment.rebuild_index(scan.batches))
            segment.close_handle()
            scans[segment.base_offset] = scan.batches
            if scan.problem is not None:
                keep = i + 1
                self.log.warning(
                    "log_recovery_bad_segment",
                    file=str(segment.path),
                    position=scan.valid_bytes,
                    reason=scan.problem,
                )
                break
        for segment in segments[keep:]:
            moved = segment.quarantine()
            self.log.warning("log_recovery_quarantined_segment", file=str(moved))
        self.segments = segments[:keep]
        active = self.segments[-1]
        scans[active.base_offset] = self._recover(active)
        active.activate()
        self._bases = [s.base_offset for s in self.segments]
        self.log_start_offset = self.segments[0].base_offset
        for problem in self.txn_index.load(self._bases):
            self.log.warning("txn_index_recovered", problem=problem)
        checkpoint = read_start_offset(self.dir)  # DeleteRecords inside the first segment
        if self.log_start_offset < checkpoint <= self.log_end_offset:
            self.log_start_offset = checkpoint
        # Kafka's rule: after a clean shutdown everything is on disk; after an unclean one
        # recovery made nothing durable, so the point moves only when a flush ends.
        leo = self.log_end_offset
        self.recovery = RecoveryPoint(leo if recovery_point is None else min(recovery_point, leo))
        self._rebuild_producer_state(scans)

    def _rebuild_producer_state(self, scans: dict[int, list[BatchInfo]] | None = None) -> None:
        """Producer state at the log end: newest snapshot at or below it, then the batches
        after it (``scans``: what opening the log already read, so nothing is read twice)."""
        producers = self.producers
        start = producers.load_latest(self.log_end_offset)
        replay_from = self.log_start_offset if start is None else max(start, self.log_start_offset)
        # The replay writes the aborted-txn entries of the markers it meets again.
        self.txn_index.truncate_from(replay_from, self._bases)
        replayed = 0
        for segment in self.segments:
            if segment.next_offset <= replay_from:
                continue
            batches = scans.get(segment.base_offset) if scans else None
            if batches is None:
                batches = scan_segment(segment, verify=False, gaps=self.config.compact).batches
            for b in batches:
                if b.producer is not None and b.base_offset >= replay_from:
                    pid, epoch, seq = b.producer
                    if b.attributes & CONTROL_FLAG:
                        data = segment.pread(b.size, b.position)
                        self._marker_in_log(data, 0, unpack_header(data), segment.base_offset)
                    else:
                        count = b.next_offset - b.base_offset
                        producers.update(
                            pid,
                            epoch,
                            seq,
                            count,
                            b.base_offset,
                            b.max_timestamp,
                            bool(b.attributes & TRANSACTIONAL_FLAG),
                        )
                    replayed += 1
        if replayed or start is not None:
            self.log.info(
                "producer_state_loaded",
                snapshot_offset=start,
                batches_replayed=replayed,
                producers=len(producers),
            )

    def _recover(self, segment: Segment) -> list[BatchInfo]:
        """Validate every batch of the active segment; cut a torn or corrupt tail."""
        scan = scan_segment(segment, verify=True, gaps=self.config.compact)
        if scan.problem is not None:
            self.log.warning(
                "log_recovery_truncated",
                file=str(segment.path),
                position=scan.valid_bytes,
                bytes_removed=segment.size - scan.valid_bytes,
                reason=scan.problem,
            )
            segment.truncate_file(scan.valid_bytes)
        segment.next_offset = scan.next_offset
        segment.max_timestamp = scan.max_timestamp
        self._index_rebuilt(segment.rebuild_index(scan.batches))
        return scan.batches

    def _index_rebuilt(self, rewritten: list[tuple[Path, str]]) -> None:
        """Recovery rewrote index files: a corrupt one is worth a warning, naming it."""
        for path, why in rewritten:
            if why in ("missing", "behind the log"):
                self.log.info("log_index_rebuilt", file=str(path), reason=why)
            else:
                self.log.warning("log_index_corrupt_rebuilt", file=str(path), reason=why)

    # --- properties -----------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def recovery_point(self) -> int:
        """Every offset below it is on disk (what the recovery-point checkpoint records)."""
        return self.recovery.get()

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
        crc = type(buf) is not CheckedBatches  # their CRC is a moment old: see the class
        while position < end:
            if end - position < LOG_OVERHEAD:
                raise CorruptMessage(f"truncated batch at byte {position}")
            size = (
                int.from_bytes(
                    buf[position + LENGTH_AT : position + LOG_OVERHEAD], "big", signed=True
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
                header = check_batch(buf, position, size, crc=crc)
            except CorruptBatch as exc:
                raise CorruptMessage(str(exc)) from None
            batches.append((position, header))
            position += size
        return batches

    def append_as_leader(self, records: bytes | bytearray, leader_epoch: int) -> AppendInfo:
        """Validate, check an idempotent producer's sequence, assign offsets from the LEO in
        place, write."""
        batches = self._validate(records)
        config = self.config
        if config.compression_type != PRODUCER:
            rebuilt = recompressed(records, batches, config.compression_type)
            if rebuilt is not None:
                records = rebuilt
                batches = self._validate(records)
        validate_records(
            records,
            batches,
            now_ms=self.now_ms(),
            before_max_ms=config.timestamp_before_max_ms,
            after_max_ms=config.timestamp_after_max_ms,
            require_keys=config.compact,
            max_decompressed=config.max_decompressed_bytes,
        )
        producer = None
        transactional = False
        if batches[0][1].attributes & (PRODUCER_FLAG | TRANSACTIONAL_FLAG) or len(batches) > 1:
            producer = self._producer_batch(records, batches)
            if producer is not None:
                pid, epoch, seq = producer
                header = batches[0][1]
                transactional = bool(header.attributes & TRANSACTIONAL_FLAG)
                original = self.producers.check(pid, epoch, seq, header.record_count, transactional)
                if original is not None:
                    # first_offset -1: older than the window, acknowledged once the HW
                    # passes last_offset (the window's start) without offsets of its own.
                    count = (
                        0
                        if original.first_offset < 0
                        else original.last_offset - original.first_offset + 1
                    )
                    return AppendInfo(
                        original.first_offset, original.last_offset, -1, count, 0, duplicate=True
                    )
        buf = records if isinstance(records, bytearray) else bytearray(records)
        offset = first = self.log_end_offset
        max_ts = -1
        count = 0
        starts = []
        for position, header in batches:
            patch_base_offset(buf, position, offset)
            patch_leader_epoch(buf, position, leader_epoch)
            starts.append((position, offset, header.max_timestamp))
            offset += header.record_count
            count += header.record_count
            if header.max_timestamp > max_ts:
                max_ts = header.max_timestamp
        self._write(buf, first, offset, max_ts, count, starts)
        if producer is not None:
            self.producers.update(*producer, count, first, max_ts, transactional)
        return AppendInfo(first, offset - 1, max_ts, count, len(buf))

    @staticmethod
    def _producer_batch(records: bytes | bytearray, batches: list) -> tuple[int, int, int] | None:
        """The producer fields of an idempotent produce, which must be one batch (Kafka's
        rule: a sequence check spanning batches could half-accept a request). Control
        batches come from the leader's markers only (Kafka refuses them from clients), and
        a transactional batch needs its producer."""
        for _, header in batches:
            if header.attributes & CONTROL_FLAG:
                raise InvalidRecord("clients may not write control batches (transaction markers)")
            if header.attributes & TRANSACTIONAL_FLAG and not header.attributes & PRODUCER_FLAG:
                raise InvalidRecord("a transactional batch must carry its producer id and epoch")
        fields = [producer_fields(records, position, header) for position, header in batches]
        if all(f is None for f in fields):
            return None
        if len(batches) > 1:
            raise InvalidRecord(
                "an idempotent producer's produce must carry exactly one batch per partition"
            )
        return fields[0]

    def append_as_follower(self, records: bytes | bytearray) -> AppendInfo:
        """Copy the leader's batches verbatim; they must continue our log.

        In a compacted log offsets may skip (the leader's cleaner removed records: Kafka's
        followers copy a compacted log with its gaps) but never go back.
        """
        batches = self._validate(records)
        expected = self.log_end_offset
        first = batches[0][1].base_offset
        max_ts = -1
        count = 0
        gaps = self.config.compact
        for _, header in batches:
            if header.base_offset != expected and not (gaps and header.base_offset > expected):
                raise LogAppendError(
                    f"batch at offset {header.base_offset} does not follow log end offset {expected}"
                )
            expected = header.next_offset
            count += header.record_count
            if header.max_timestamp > max_ts:
                max_ts = header.max_timestamp
        starts = [(position, h.base_offset, h.max_timestamp) for position, h in batches]
        self._write(records, first, expected, max_ts, count, starts)
        segment_base = self.active.base_offset
        for position, header in batches:
            attributes = header.attributes
            if attributes & CONTROL_FLAG and attributes & PRODUCER_FLAG:
                self._marker_in_log(records, position, header, segment_base)
            elif attributes & PRODUCER_FLAG:
                pid, epoch, seq = producer_fields(records, position, header)
                self.producers.update(
                    pid,
                    epoch,
                    seq,
                    header.record_count,
                    header.base_offset,
                    header.max_timestamp,
                    bool(attributes & TRANSACTIONAL_FLAG),
                )
        return AppendInfo(first, expected - 1, max_ts, count, len(records))

    def _write(
        self,
        data: bytes | bytearray,
        first: int,
        next_offset: int,
        max_ts: int,
        count: int,
        starts: list[tuple[int, int, int]],
    ) -> None:
        """One os.write of the whole request into the active segment (rolled first if due)."""
        active = self.active
        # Roll before the index's 32-bit fields (relative offset, position) could overflow,
        # and check that the data fits an empty segment: nothing may fail after the write.
        if active.size and (
            active.size + len(data) > self.config.segment_bytes
            or not active.fits(len(data), next_offset)
            or self.now_ms() - active.created_ms > self.config.segment_ms
        ):
            active = self.roll()
        if not active.fits(len(data), next_offset):
            raise RecordListTooLarge(
                f"{len(data)} bytes / {next_offset - first} records do not fit one segment's "
                "index (its positions and relative offsets are 32-bit: at most 2^31-1)"
            )
        active.append(data, first, next_offset, max_ts, starts)
        self._unflushed += count
        if self._unflushed >= self.config.flush_interval_messages:
            self.flush()

    def roll(self) -> Segment:
        """Start a new active segment at the LEO; the old one is fsynced off this thread
        (Kafka's roll schedules flushUptoOffsetExclusive): the recovery point reaches the
        new segment's base when that flush ends.

        Rolling an empty active segment is a no-op: the new one would have the same base
        offset, hence the same file names, as the one it replaced.
        """
        old = self.active
        if old.size == 0:
            return old
        old.write_index()  # its entries onto their files; the flush fsyncs them
        segment = Segment(
            self.dir, old.next_offset, self.config.index_interval_bytes, self.now_ms(), fresh=True
        )
        segment.next_offset = old.next_offset
        old.seal()
        segment.activate()
        self.segments.append(segment)
        self._bases.append(segment.base_offset)
        # Kafka snapshots producer state on roll: a crash then replays one segment at most.
        # Its fsyncs go with the segment's, in the flusher thread.
        files = self._unflushed_files()
        snapshot = self._snapshot_producers(segment.base_offset, sync=False)
        if snapshot is not None:
            files.append(snapshot)
        if files:
            self.recovery.schedule([*files, self.dir], segment.base_offset)
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
        """Whole batches from the one holding ``offset``, ending at or below ``max_offset``.

        At most ``max_bytes`` bytes, except that ``min_one_batch`` returns the first batch
        whole however large it is (as Kafka does, so a consumer never gets stuck). A batch
        that reaches past ``max_offset`` (the HW for consumers) is never returned: its
        records above the HW are not committed. A read stays in one segment.

        Cost: one pread (from the index entry before ``offset`` to ``max_bytes`` past the
        next one) and a walk over batch headers in memory; a second pread only when the
        first batch alone is larger than what was read.
        """
        leo = self.log_end_offset
        if offset < self.log_start_offset or offset > leo:
            raise OffsetOutOfRange(f"offset {offset} is outside [{self.log_start_offset}, {leo}]")
        upper = leo if max_offset is None else min(max_offset, leo)
        if offset >= upper:
            return ReadResult(b"", offset, offset)
        i = bisect_right(self._bases, offset) - 1
        segment = self.segments[i]
        # Past a segment's last batch (or it has none): a compacted segment's removed
        # tail (read on in the next segment, as Kafka does), or an empty active segment.
        while offset >= segment.next_offset or segment.next_offset == segment.base_offset:
            i += 1
            if i == len(self.segments):
                return ReadResult(b"", offset, offset)
            segment = self.segments[i]
        start, bound = segment.lookup_span(offset)
        # The batch holding ``offset`` starts before ``bound``, so this covers the walk to
        # it, its header, and max_bytes from wherever it starts.
        window = bound - start + max(max_bytes, HEADER_SIZE)
        data = segment.pread(min(window, segment.size - start), start)
        begin = walk_to(data, offset)
        if begin is None:  # an index that lies; never expected, so be slow but right
            self.log.error("log_index_inconsistent", file=str(segment.path), offset=offset)
            start, data = 0, segment.pread(segment.size, 0)
            begin = walk_to(data, offset)
            if begin is None:
                return ReadResult(b"", offset, offset)
        limit = begin + max_bytes
        end = begin
        first = -1
        next_offset = offset
        while end + HEADER_SIZE <= len(data):
            base, length = BASE_AND_LENGTH.unpack_from(data, end)
            batch_next = base + LAST_DELTA.unpack_from(data, end + LAST_DELTA_AT)[0] + 1
            if batch_next > upper:
                break
            size = length + LOG_OVERHEAD
            if end + size > limit:
                if end == begin and min_one_batch:
                    # Kafka returns at least one whole batch, even past max_bytes.
                    if end + size > len(data):
                        whole = segment.pread(size, start + end)
                        return ReadResult(whole, base, batch_next)
                    first, next_offset, end = base, batch_next, end + size
                break
            if first < 0:
                first = base
            next_offset = batch_next
            end += size
        if end == begin:
            return ReadResult(b"", offset, offset)
        out = data if begin == 0 and end == len(data) else data[begin:end]
        return ReadResult(out, first, next_offset)

    def read_region(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> ReadResult:
        """``read``, answered with a FileRegion of the segment file instead of its bytes.

        Kafka's FileRecords.slice: only batch headers are read (the walk), the batches
        themselves go from the file to the socket with sendfile. Headers are read a
        chunk at a time, so many small batches cost one pread per chunk and a batch
        larger than a chunk costs one small pread, whatever its size. Anything the walk
        does not expect (an index that lies) is left to ``read``, which handles it.
        """
        leo = self.log_end_offset
        upper = leo if max_offset is None else min(max_offset, leo)
        if offset < self.log_start_offset or offset > leo or offset >= upper:
            return self.read(offset, max_bytes, max_offset=max_offset, min_one_batch=min_one_batch)
        i = bisect_right(self._bases, offset) - 1
        segment = self.segments[i]
        while offset >= segment.next_offset or segment.next_offset == segment.base_offset:
            i += 1
            if i == len(self.segments):
                return ReadResult(b"", offset, offset)
            segment = self.segments[i]
        position = segment.lookup_span(offset)[0]
        fd = segment.fd
        size = segment.size
        chunk = b""
        chunk_at = position  # the file position of chunk[0]
        begin = -1
        limit = 0
        first = -1
        next_offset = offset
        end = position
        while end + HEADER_SIZE <= size:
            at = end - chunk_at
            if at + HEADER_SIZE > len(chunk):
                chunk = os.pread(fd, min(_WALK_CHUNK, size - end), end)
                chunk_at, at = end, 0
                if len(chunk) < HEADER_SIZE:
                    break
            base, length = BASE_AND_LENGTH.unpack_from(chunk, at)
            batch_next = base + LAST_DELTA.unpack_from(chunk, at + LAST_DELTA_AT)[0] + 1
            batch_size = length + LOG_OVERHEAD
            if batch_size < HEADER_SIZE:
                break  # not a batch: let read() judge
            if begin < 0:
                if batch_next <= offset:  # before the batch holding offset: walk on
                    end += batch_size
                    continue
                begin, limit = end, end + max_bytes
                if segment.next_offset <= upper and size <= limit:
                    # The rest of the segment is whole batches below ``upper`` and fits:
                    # no walk over them (a follower at the tail, nearly every fetch).
                    first, next_offset, end = base, segment.next_offset, size
                    break
            if batch_next > upper:
                break
            if end + batch_size > limit and not (end == begin and min_one_batch):
                break
            if first < 0:
                first = base
            next_offset = batch_next
            end += batch_size
            if end > limit:
                break  # the first batch, whole past max_bytes (as read)
        if begin < 0 or end > size:
            return self.read(offset, max_bytes, max_offset=max_offset, min_one_batch=min_one_batch)
        if end == begin:
            return ReadResult(b"", offset, offset)
        try:
            region = FileRegion(fd, begin, end - begin)
        except OSError:
            # No descriptor to spare (each queued region holds one): the bytes, as before.
            return ReadResult(segment.pread(end - begin, begin), first, next_offset)
        return ReadResult(region, first, next_offset)

    # --- truncation -----------------------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Drop every record at or above ``offset``; returns how many bytes went.

        A batch holding ``offset`` goes whole (the follower fetches it again), so the
        LEO ends at or below ``offset``. Below the first segment there is nothing to
        keep: the log restarts empty at ``offset``, as Kafka's ``truncateTo`` does.
        """
        if offset < 0:
            raise ValueError(f"cannot truncate to negative offset {offset}")
        if offset >= self.log_end_offset:
            return 0
        self._segments_changing()
        if offset < self.segments[0].base_offset:
            removed = self.size_bytes
            self.truncate_fully_and_start_at(offset)
            return removed
        removed = 0
        while len(self.segments) > 1 and self.segments[-1].base_offset >= offset:
            segment = self.segments.pop()
            self._bases.pop()
            removed += segment.size
            segment.delete()
        segment = self.active
        segment.activate()
        kept = [
            b
            for b in scan_segment(segment, verify=False, gaps=self.config.compact).batches
            if b.next_offset <= offset
        ]
        cut = kept[-1].position + kept[-1].size if kept else 0
        removed += segment.size - cut
        segment.truncate_file(cut)
        segment.next_offset = kept[-1].next_offset if kept else segment.base_offset
        segment.max_timestamp = max((b.max_timestamp for b in kept), default=-1)
        # The index must not point at bytes that are gone (appends reuse those positions).
        segment.rebuild_index(kept)
        if segment.next_offset < self.log_start_offset:  # the checkpoint must not be ahead
            self.log_start_offset = segment.next_offset
            write_start_offset(self.dir, segment.next_offset)
        self._dirty_from(segment.next_offset)
        self.recovery.truncated(segment.next_offset)
        self.log.info("log_truncated", to_offset=segment.next_offset, bytes_removed=removed)
        self._rebuild_producer_state()
        return removed

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete everything; the log restarts empty with start and end at ``offset``."""
        if offset < 0:  # the segment file name could not be parsed back on open
            raise ValueError(f"cannot start a log at negative offset {offset}")
        self._segments_changing()
        for segment in self.segments:
            segment.delete()
        segment = Segment(
            self.dir, offset, self.config.index_interval_bytes, self.now_ms(), fresh=True
        )
        segment.next_offset = offset
        segment.activate()
        self.segments = [segment]
        self._bases = [offset]
        self.log_start_offset = offset
        write_start_offset(self.dir, offset)
        self._unflushed = 0
        self.recovery.reset(offset)
        self.producers.reset()
        self.txn_index.reset()
        self._dirty_from(offset)
        self.log.info("log_truncated_fully", start_offset=offset)

    # --- timestamps and retention ---------------------------------------------------------

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """The first record at or after ``timestamp``: (its offset, its timestamp), as
        Kafka's fetchOffsetByTimestamp. None when no record is that late.

        The first segment whose max timestamp reaches it; in there its time index gives a
        position every record before which is older; batch headers from there find the
        first batch that reaches it, and only that batch's records are read (the one
        batch's worth of per-record work a lookup costs the broker).
        """
        for segment in self.segments:
            if segment.max_timestamp < timestamp:
                continue  # no batch in here is late enough: skip without any I/O
            found = first_batch_reaching(segment, timestamp, self.log_start_offset)
            if found is None:
                continue
            position, size = found
            batch = segment.pread(size, position)
            for base, first_ts, rows in batch_rows(batch, min_offset=self.log_start_offset):
                for offset, row in enumerate(rows, start=base):
                    if first_ts + row[0] >= timestamp:
                        return offset, first_ts + row[0]
        return None

    def max_timestamp_offset(self, upper: int) -> tuple[int, int] | None:
        """KIP-734's MAX_TIMESTAMP, as Kafka answers it: the first record carrying the
        largest timestamp of the whole log (UnifiedLog.fetchOffsetByTimestamp), as (offset,
        timestamp); None for an empty log, and None when that record is at or above
        ``upper``, the last fetchable offset (HW, LSO or LEO: ReplicaManager then answers
        offset -1), never an older record from below it (its answer would change when
        the HW moved past a newer one: Kafka's does not).
        The segment holding it by its max timestamp, then its headers, then one batch."""
        best: tuple[int, Segment] | None = None
        for segment in self.segments:
            if best is None or segment.max_timestamp > best[0]:
                best = (segment.max_timestamp, segment)
        if best is None or best[0] < 0:
            return None
        top, segment = best
        found = first_batch_reaching(segment, top, self.log_start_offset)
        if found is None:
            return None
        position, size = found
        batch = segment.pread(size, position)
        for base, first_ts, rows in batch_rows(batch, min_offset=self.log_start_offset):
            for offset, row in enumerate(rows, start=base):
                if offset >= upper:
                    return None  # (its record is past the bound: not answered yet)
                if first_ts + row[0] >= top:
                    return offset, first_ts + row[0]
        return None

    def delete_old_segments(self, high_watermark: int | None = None) -> int:
        """Retention by time, then size; the active segment is never deleted.

        As in Kafka, only segments wholly below ``high_watermark`` may go: deleting records
        consumers cannot read yet (and a new leader might still need) would lose them.
        """
        cfg = self.config
        if not cfg.delete:
            return 0  # cleanup.policy=compact: only the cleaner removes records
        now = self.now_ms()
        deleted = 0
        total = self.size_bytes
        while len(self.segments) > 1:
            oldest = self.segments[0]
            if high_watermark is not None and self.segments[1].base_offset > high_watermark:
                break
            newest_ts = oldest.max_timestamp if oldest.max_timestamp >= 0 else oldest.created_ms
            too_old = cfg.retention_ms >= 0 and now - newest_ts > cfg.retention_ms
            too_big = cfg.retention_bytes >= 0 and total - oldest.size >= cfg.retention_bytes
            if not (too_old or too_big):
                break
            if not deleted:
                self._segments_changing()
            self.segments.pop(0)
            self._bases.pop(0)
            total -= oldest.size
            oldest.delete()
            deleted += 1
        if deleted:
            self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
            self.txn_index.forget_below(self.log_start_offset)
            self.log.info(
                "retention_deleted", segments=deleted, log_start_offset=self.log_start_offset
            )
        return deleted

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords (Kafka's maybeIncrementLogStartOffset, then deleteOldSegments):
        the log starts at ``offset`` from now on (checkpointed, so a restart keeps it);
        segments wholly below it go. Never moves the start back; the caller bounds it by
        the high watermark. Returns the segments deleted."""
        if offset > self.log_end_offset:
            raise OffsetOutOfRange(f"offset {offset} is past the log end {self.log_end_offset}")
        if offset <= self.log_start_offset:
            return 0
        self.log_start_offset = offset
        write_start_offset(self.dir, offset)
        deleted = 0
        while len(self.segments) > 1 and self.segments[1].base_offset <= offset:
            if not deleted:
                self._segments_changing()
            self.segments.pop(0).delete()
            self._bases.pop(0)
            deleted += 1
        self.log.info("log_start_offset_moved", log_start_offset=offset, segments_deleted=deleted)
        return deleted

    # --- the log cleaner's swap -------------------------------------------------------------

    def _segments_changing(self) -> None:
        self.changes += 1
        if self.cleaning:
            discard_pending(self.dir)

    def _dirty_from(self, offset: int) -> None:
        """What is appended after a truncation has not been cleaned (Kafka truncates the
        cleaner checkpoint with the log)."""
        if self.first_dirty_offset is not None:
            self.first_dirty_offset = min(self.first_dirty_offset, offset)

    def replace_segments(self, old: list[Segment], new: Segment, aborted: list[AbortedTxn]) -> None:
        """Put ``new`` (the cleaned copy, already swapped in on disk) where ``old`` were.

        Their files are gone or replaced already: the old objects only give back their
        descriptors (never ``delete``: the first one's name is now the new segment's).
        ``aborted``: the new segment's aborted-transactions entries (its ``.txnindex``).
        """
        i = self.segments.index(old[0])
        if self.segments[i : i + len(old)] != old or self.segments[-1] in old:
            raise ValueError("the segments to replace are no longer the log's sealed segments")
        for segment in old:
            segment.drop_pending()
            segment.close_handle()
        self.segments[i : i + len(old)] = [new]
        self._bases = [s.base_offset for s in self.segments]
        self.txn_index.replace(new.base_offset, old[-1].next_offset, aborted)

    # --- durability -----------------------------------------------------------------------

    def _unflushed_files(self) -> list[Path]:
        """The files of sealed segments no flush has covered yet: the one just rolled; after
        an unclean open, also those recovery validated. (Their directory needs one too.)"""
        files: list[Path] = []
        reached = self.recovery.scheduled
        segments = self.segments
        for i in range(len(segments) - 2, -1, -1):  # no copy: flush.messages=1 runs it often
            segment = segments[i]
            if segment.next_offset <= reached:
                break
            files += (segment.path, segment.index_path, segment.time_path)
            files.append(txn_index_path(self.dir, segment.base_offset))
        return files

    def flush(self) -> None:
        """fsync everything up to the log end, here and now (flush.messages, close)."""
        files = self._unflushed_files()
        if files:
            fsync_all([*files, self.dir])
        self.active.flush()
        self.recovery.flushed(self.log_end_offset)
        self._unflushed = 0

    def _snapshot_producers(self, offset: int, *, sync: bool = True) -> Path | None:
        """The snapshot file written, or None (none needed, or it failed)."""
        if not self.producers and not self.producers.snapshot_offsets():
            return None  # a log no idempotent producer ever wrote to keeps no snapshot files
        try:
            return self.producers.take_snapshot(offset, sync=sync)
        except OSError as exc:  # an optimisation only: the next open replays the log
            self.log.warning("producer_snapshot_failed", offset=offset, error=str(exc))
            return None

    def close(self) -> None:
        self.closed = True
        try:
            self.flush()
            self.recovery.wait()  # the rolled segments' flushes: all on disk at close
            self._snapshot_producers(self.log_end_offset)
        finally:
            for segment in self.segments:
                segment.close()
