"""Stateful property test: any mix of appends, truncations, rolls, retention and reopens
keeps the log's contents equal to a model of whole batches ``(base_offset, values)``.

Small segments and a small index interval make every operation cross segment and
index-entry boundaries often.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import structlog
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minibroker.broker.storage import Log, LogConfig
from minibroker.protocol import encode_batch, iter_batches, read_records

SEGMENT_BYTES = 300
INDEX_INTERVAL = 40

values_st = st.lists(st.binary(min_size=0, max_size=60), min_size=1, max_size=6)


# Recovery and truncation log at info/warning; hundreds of examples would flood the output.
QUIET = structlog.wrap_logger(structlog.ReturnLogger())


def _open(directory: Path, config: LogConfig) -> Log:
    return Log.open(directory, config, now_ms=lambda: 1_000, logger=QUIET)


def _config(retention_bytes: int = -1) -> LogConfig:
    return LogConfig(
        segment_bytes=SEGMENT_BYTES,
        index_interval_bytes=INDEX_INTERVAL,
        retention_bytes=retention_bytes,
        retention_ms=-1,
    )


def _batch(values: list[bytes], base_offset: int = 0) -> bytes:
    return encode_batch([(7, None, v, []) for v in values], base_offset=base_offset)


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="storage-prop-"))
        self.log = _open(self.dir, _config())
        # The model: whole batches in order, and the log start offset.
        self.batches: list[tuple[int, list[bytes]]] = []
        self.start = 0

    @property
    def leo(self) -> int:
        if not self.batches:
            return self.start
        base, values = self.batches[-1]
        return base + len(values)

    def model_records(self) -> list[tuple[int, bytes]]:
        return [(base + i, v) for base, values in self.batches for i, v in enumerate(values)]

    # --- rules -------------------------------------------------------------------------------

    @rule(requests=st.lists(values_st, min_size=1, max_size=3), epoch=st.integers(0, 5))
    def append_as_leader(self, requests: list[list[bytes]], epoch: int) -> None:
        """One produce request of one or more batches; the leader assigns offsets."""
        info = self.log.append_as_leader(b"".join(_batch(v, 12345) for v in requests), epoch)
        assert info.first_offset == self.leo
        for values in requests:
            self.batches.append((self.leo, values))
        assert info.last_offset == self.leo - 1

    @rule(values=values_st)
    def append_as_follower(self, values: list[bytes]) -> None:
        self.log.append_as_follower(_batch(values, self.leo))
        self.batches.append((self.leo, values))

    @rule(back=st.integers(0, 25))
    def truncate_to(self, back: int) -> None:
        """Truncate to some offset near the end, possibly inside a batch or below the start."""
        target = max(0, self.leo - back)
        self.log.truncate_to(target)
        if target >= self.leo:
            return
        if target < self.start:
            self.batches, self.start = [], target
        else:
            self.batches = [(b, v) for b, v in self.batches if b + len(v) <= target]

    @rule(ahead=st.integers(0, 5))
    def truncate_fully_and_start_at(self, ahead: int) -> None:
        target = self.leo + ahead
        self.log.truncate_fully_and_start_at(target)
        self.batches, self.start = [], target

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def reopen(self) -> None:
        self.log.close()
        self.log = _open(self.dir, _config())

    @rule(keep=st.integers(0, 2 * SEGMENT_BYTES))
    def retention(self, keep: int) -> None:
        """Retention by bytes (reopened with that config): whole old segments go."""
        self.log.close()
        self.log = _open(self.dir, _config(retention_bytes=keep))
        self.log.delete_old_segments()
        new_start = self.log.log_start_offset
        assert new_start >= self.start
        if new_start > self.start:
            assert new_start in {b for b, _ in self.batches} | {self.leo}
            self.batches = [(b, v) for b, v in self.batches if b >= new_start]
            self.start = new_start

    @precondition(lambda self: self.leo > self.start)
    @rule(
        data=st.data(),
        max_bytes=st.integers(0, 400),
        min_one_batch=st.booleans(),
    )
    def read_somewhere(self, data: st.DataObject, max_bytes: int, min_one_batch: bool) -> None:
        """A bounded read: a run of whole batches from the one holding the offset."""
        offset = data.draw(st.integers(self.start, self.leo - 1))
        upper = data.draw(st.integers(offset, self.leo + 2))
        result = self.log.read(offset, max_bytes, max_offset=upper, min_one_batch=min_one_batch)
        headers = [h for _, h in iter_batches(result.data, verify=True)]  # whole batches only
        bases = {b: len(v) for b, v in self.batches}
        if headers:
            assert headers[0].base_offset <= offset < headers[0].next_offset
            assert result.first_offset == headers[0].base_offset
            assert result.next_offset == headers[-1].next_offset
            assert all(bases.get(h.base_offset) == h.record_count for h in headers)
            assert result.next_offset <= upper
            assert len(result.data) <= max_bytes or (min_one_batch and len(headers) == 1)
            got = [(r.offset, r.value) for r in read_records(result.data)]
            want = self.model_records()
            i = want.index(got[0])
            assert got == want[i : i + len(got)]
        else:
            assert result.next_offset == offset
            containing = next(b + n for b, n in bases.items() if b <= offset < b + n)
            # Nothing back only when the first batch is not committed, or is too big.
            assert containing > upper or not min_one_batch

    # --- invariants --------------------------------------------------------------------------

    @invariant()
    def matches_the_model(self) -> None:
        log = self.log
        assert (log.log_start_offset, log.log_end_offset) == (self.start, self.leo)
        got: list[tuple[int, bytes]] = []
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            result = log.read(offset, 200)
            assert result.next_offset > offset
            got.extend((r.offset, r.value) for r in read_records(result.data, min_offset=offset))
            offset = result.next_offset
        assert got == self.model_records()
        assert log.size_bytes == sum(s.size for s in log.segments)

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


LogMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLogMachine = LogMachine.TestCase
