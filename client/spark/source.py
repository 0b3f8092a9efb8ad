"""The PySpark classes: the ``minibroker`` data source, its batch and streaming readers and writers.

These are thin: planning asks the cluster (``lookup``) and does offset arithmetic
(``ranges``); ``read()`` runs a ``RangeFetcher`` and yields Arrow batches; ``write()``
produces Arrow batches (``sink``). Spark pickles readers and writers to other
processes, so they hold only parsed options and never a connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from minibroker.client.spark import lookup
from minibroker.client.spark.arrow import source_ddl, to_record_batch
from minibroker.client.spark.exactly_once import WriteIdentity
from minibroker.client.spark.fetch import RangeFetcher, data_loss
from minibroker.client.spark.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    OptionError,
    ReadOptions,
    TimeSpec,
    WriteOptions,
    include_headers,
    parse_read_options,
    parse_write_options,
)
from minibroker.client.spark.ranges import (
    OffsetRange,
    Offsets,
    cap_offsets,
    from_json,
    split_ranges,
    to_json,
)
from minibroker.client.spark.sink import check_sink_schema, produce_batches
from minibroker.protocol.errors import KafkaError

NAME = "minibroker"
log = logging.getLogger("minibroker.spark")


class RangePartition(InputPartition):
    """One Spark partition: an offset range of one topic partition."""

    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(rng)
        self.range = rng


class MinibrokerDataSource(DataSource):
    """``spark.read.format("minibroker")`` / ``df.write.format("minibroker")``; see client.spark."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return source_ddl(include_headers(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(parse_read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(parse_read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        if overwrite:
            raise OptionError(
                "mode 'overwrite' is not supported: a topic is only appended to; use mode('append')"
            )
        options = _sink_options(self.options, schema)
        identity = None
        if options.exactly_once:
            # Made here, on the driver, and pickled into every task: all attempts of a
            # task share it. Only txnAppId/txnVersion make it survive a replay.
            identity = (
                WriteIdentity.application(*options.txn) if options.txn else WriteIdentity.one_off()
            )
        return BatchWriter(options, identity)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        options = _sink_options(self.options, schema)
        if options.txn is not None:
            raise OptionError(
                "options 'txnAppId'/'txnVersion' name a batch write inside foreachBatch; "
                "a streaming write takes its identity from the query's checkpoint"
            )
        return StreamWriter(options)


def _sink_options(options: dict, schema: StructType) -> WriteOptions:
    parsed = parse_write_options(options)
    check_sink_schema({f.name: f.dataType.simpleString() for f in schema.fields}, parsed)
    return parsed


def read_range(options: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """What every ``read()`` does: fetch the range, yield Arrow batches."""
    rng = getattr(partition, "range", None)
    if rng is None:  # Spark's stand-in partition when we planned none
        return
    fetcher = RangeFetcher(options.client_config, rng, fail_on_data_loss=options.fail_on_data_loss)
    for chunk in fetcher:
        batch = to_record_batch(rng.topic, rng.partition, chunk, options.include_headers)
        if batch is not None:
            yield batch


_STARTING_TIME = "startingOffsetsByTimestamp"


def _resolve(spec: OffsetSpec, default_each: int, snap: lookup.Snapshot) -> Offsets:
    """Offsets per partition from earliest/latest/JSON (-2/-1), for the snapshot's partitions."""
    out = {}
    for tp in snap.partitions:
        wanted = default_each if isinstance(spec, str) else spec.get(tp, default_each)
        if spec == "earliest":
            wanted = EARLIEST
        elif spec == "latest":
            wanted = LATEST
        out[tp] = (
            snap.earliest[tp]
            if wanted == EARLIEST
            else snap.latest[tp]
            if wanted == LATEST
            else wanted
        )
    return out


def _check_json_partitions(spec: OffsetSpec, snap: lookup.Snapshot, name: str) -> None:
    """JSON offsets name exactly the partitions read, as spark-sql-kafka requires."""
    if not isinstance(spec, dict):
        return

    def names(tps: set) -> str:
        return ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(tps))

    unknown = set(spec) - set(snap.partitions)
    if unknown:
        raise OptionError(
            f"option '{name}' names partitions the query does not read: {names(unknown)}"
        )
    missing = set(snap.partitions) - set(spec)
    if missing:
        raise OptionError(
            f"option '{name}' contains specific offsets, so it must specify all "
            f"TopicPartitions (use -1 for latest, -2 for earliest); missing: {names(missing)}"
        )


def _by_time(
    spec: TimeSpec, snap: lookup.Snapshot, opts: ReadOptions, name: str, if_none: str
) -> Offsets:
    """Offsets from timestamps (Kafka's offsetsForTimes), within [earliest, HW].

    A partition with no record at or after its time: ``if_none`` "latest" takes its HW,
    "error" fails naming it (spark-sql-kafka's startingOffsetsByTimestampStrategy).
    """
    if isinstance(spec, dict):
        _check_json_partitions(spec, snap, name)
        wanted = dict(spec)
    else:
        wanted = dict.fromkeys(snap.partitions, spec)
    found = lookup.offsets_for_times(opts.client_config, wanted)
    out = {}
    for tp in snap.partitions:
        offset = found.get(tp, -1)
        if offset < 0 or offset > snap.latest[tp]:
            if if_none == "error":
                raise OptionError(
                    f"option '{name}': {tp.topic}-{tp.partition} has no record at or after "
                    f"timestamp {wanted[tp]} (set startingOffsetsByTimestampStrategy=latest "
                    "to start at the end instead)"
                )
            offset = snap.latest[tp]
        out[tp] = max(offset, snap.earliest[tp])
    return out


class BatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        """One range per partition from startingOffsets to endingOffsets, never past the HW."""
        opts = self.options
        snap = lookup.snapshot(opts.client_config, opts.subscription, strict=True)
        if opts.starting_time is not None:
            start = _by_time(
                opts.starting_time, snap, opts, _STARTING_TIME, opts.starting_time_strategy
            )
        else:
            _check_json_partitions(opts.starting, snap, "startingOffsets")
            start = _resolve(opts.starting, EARLIEST, snap)
        if opts.ending_time is not None:
            # No record at or after the ending time: read to the end, as Kafka's source does.
            end = _by_time(opts.ending_time, snap, opts, "endingOffsetsByTimestamp", "latest")
        else:
            _check_json_partitions(opts.ending, snap, "endingOffsets")
            end = _resolve(opts.ending, LATEST, snap)
        ranges = []
        for tp in snap.partitions:
            lo, hi = start[tp], end[tp]
            if hi > snap.latest[tp]:
                if opts.fail_on_data_loss:
                    raise OptionError(
                        f"option 'endingOffsets': {tp.topic}-{tp.partition} ends at {hi}, past its "
                        f"high watermark {snap.latest[tp]}"
                    )
                hi = snap.latest[tp]
            if lo < snap.earliest[tp] and opts.fail_on_data_loss:
                raise data_loss(tp, lo, snap.earliest[tp] - 1, "were deleted (retention)")
            if lo > hi:
                raise OptionError(
                    f"{tp.topic}-{tp.partition}: startingOffsets {lo} is after endingOffsets {hi}"
                )
            ranges.append(OffsetRange(tp.topic, tp.partition, max(lo, snap.earliest[tp]), hi))
        return [RangePartition(r) for r in split_ranges(ranges, opts.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_range(self.options, partition)


def delay_trigger(
    new_offsets: int, now_ms: int, last_trigger_ms: int, min_offsets: int, max_delay_ms: int
) -> bool:
    """spark-sql-kafka's minOffsetsPerTrigger: hold the trigger while fewer new offsets
    than ``min_offsets`` are there, unless ``max_delay_ms`` passed since the last one."""
    if now_ms - last_trigger_ms >= max_delay_ms:
        return False
    return new_offsets < min_offsets


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"topic": {"partition": next offset}}``; new partitions start at earliest."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._target: Offsets | None = None  # set by availableNow: never read past these
        # The driver-side runner keeps this instance for the query's life (see
        # ../shared/reference/pyspark-datasource.md), so the last trigger's time carries over;
        # 0: the first trigger is never held, as in Kafka's source.
        self._last_trigger_ms = 0
        self._reported: dict | None = None  # the offsets last committed to kafka.group.id

    def _snapshot(self) -> lookup.Snapshot:
        return lookup.snapshot(self.options.client_config, self.options.subscription, strict=False)

    def initialOffset(self) -> dict:
        opts = self.options
        snap = self._snapshot()
        if opts.starting_time is not None:
            return to_json(
                _by_time(
                    opts.starting_time, snap, opts, _STARTING_TIME, opts.starting_time_strategy
                )
            )
        _check_json_partitions(opts.starting, snap, "startingOffsets")
        return to_json(_resolve(opts.starting, LATEST, snap))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = dict(self._snapshot().latest)

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        snap = self._snapshot()
        latest = dict(snap.latest)
        if start is None:  # Spark < 4.2 asks without a start: only the true latest is safe
            return to_json(latest)
        self._report(start)  # every batch up to start has run (see _report)
        begin = from_json(start)
        self._check_loss(begin, snap)
        if self._target is not None:
            latest = {
                tp: min(n, self._target[tp]) for tp, n in latest.items() if tp in self._target
            }
        # Where each partition's next batch begins: new partitions at their log start, and
        # (failOnDataLoss=false) a partition whose log went backwards starts over there too.
        base = {}
        for tp in latest:
            at = begin.get(tp, snap.earliest[tp])
            base[tp] = snap.earliest[tp] if at > snap.latest[tp] or at < snap.earliest[tp] else at
        latest = {tp: max(n, base[tp]) for tp, n in latest.items()}
        minimum = self.options.min_offsets_per_trigger
        if minimum is not None and self._target is None:  # availableNow reads all it has
            now = int(time.time() * 1000)
            new = sum(n - base[tp] for tp, n in latest.items())
            if delay_trigger(
                new, now, self._last_trigger_ms, minimum, self.options.max_trigger_delay_ms
            ):
                return start  # no new offsets: Spark skips this trigger
            self._last_trigger_ms = now
        if isinstance(limit, ReadMaxRows):
            latest = cap_offsets(base, latest, limit.max_rows)
        end = {**begin, **latest}
        return to_json(end)

    def _check_loss(self, begin: Offsets, snap: lookup.Snapshot) -> None:
        """Partitions gone or offsets gone backwards fail the query (unless failOnDataLoss=false)."""
        if not self.options.fail_on_data_loss:
            return
        for tp, offset in begin.items():
            if tp not in snap.latest:
                raise data_loss(tp, offset, offset, "belong to a partition that no longer exists")
            if offset > snap.latest[tp]:
                raise data_loss(tp, snap.latest[tp], offset - 1, "are past the partition's end now")

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, until = from_json(start), from_json(end)
        # New partitions start at their log start; so does one whose offsets went backwards
        # (a recreated topic) when data loss is tolerated.
        backwards = [tp for tp, hi in until.items() if tp in begin and hi < begin[tp]]
        if backwards and self.options.fail_on_data_loss:
            tp = backwards[0]
            raise data_loss(tp, until[tp], begin[tp] - 1, "went backwards")
        restart = [tp for tp in until if tp not in begin] + backwards
        if restart:
            begin.update(lookup.earliest_offsets(self.options.client_config, restart))
        ranges = []
        for tp, hi in sorted(until.items()):
            if hi > begin[tp]:
                ranges.append(OffsetRange(tp.topic, tp.partition, begin[tp], hi))
        return [RangePartition(r) for r in split_ranges(ranges, self.options.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_range(self.options, partition)

    def commit(self, end: dict) -> None:
        """Progress lives in Spark's checkpoint, as with Kafka's source; see _report."""
        self._report(end)

    def _report(self, done: dict) -> None:
        """With ``kafka.group.id``, commit ``done`` (offsets this query has processed) to
        that group, for ``groups describe`` to show the query's lag: reporting only, the
        query never reads it back (a restart resumes from the checkpoint, a new query from
        startingOffsets). A group with live members refuses such a commit; that is logged
        and the query goes on.

        Spark calls ``commit(end)`` for a batch only once the next batch with new data is
        planned, so the last batch of a run would never be reported; but the ``start``
        that ``latestOffset`` gets is the end of a batch Spark has already run and written
        to its commit log (MicroBatchExecution plans a batch only after the one before is
        committed), so it is reported from there as well, once per new value."""
        config = self.options.client_config
        if not config.get("group.id") or done == self._reported:
            return
        try:
            lookup.commit_progress(config, from_json(done))
        except KafkaError as exc:
            log.warning(
                "progress of this query not recorded into group %r: %s", config["group.id"], exc
            )
            return
        self._reported = done


class ProduceCommit(WriterCommitMessage):
    def __init__(self, records: int) -> None:
        self.records = records


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions, identity: WriteIdentity | None) -> None:
        self.options = options
        self.identity = identity

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        task = None
        if self.identity is not None:
            task = self.identity.for_task(TaskContext.get().partitionId())
        return ProduceCommit(produce_batches(self.options, iterator, task))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every record was acknowledged when its task ended: nothing left to do."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """What the brokers acknowledged stays (a rerun of a task finds it there)."""


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        task = None
        if self.options.exactly_once:
            # Spark sets both on every task of a micro-batch; the query id is kept in
            # the checkpoint, so a replay after a driver crash derives the same names.
            context = TaskContext.get()
            task = WriteIdentity.streaming(
                context.getLocalProperty("sql.streaming.queryId"),
                int(context.getLocalProperty("streaming.sql.batchId")),
            ).for_task(context.partitionId())
        return ProduceCommit(produce_batches(self.options, iterator, task))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Records are acknowledged by the end of each task; nothing left to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Acknowledged records stay; the batch's replay finds them there."""


__all__ = ["NAME", "MinibrokerDataSource", "RangePartition"]
