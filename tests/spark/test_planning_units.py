"""The pure parts of the source (options, offset arithmetic): no SparkSession, no broker."""

from __future__ import annotations

import itertools
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minibroker.client import TopicPartition
from minibroker.client.spark.options import OptionError, parse_read_options, parse_write_options
from minibroker.client.spark.ranges import (
    OffsetRange,
    cap_offsets,
    from_json,
    split_ranges,
    to_json,
)

TP = TopicPartition


def test_importing_client_does_not_import_pyspark():
    import subprocess

    code = (
        "import client, sys; assert 'pyspark' not in sys.modules and 'pyarrow' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_read_options_defaults_and_aliases():
    batch = parse_read_options({"bootstrap.servers": "h:1", "subscribe": "a, b"}, streaming=False)
    assert batch.subscription.topics == ("a", "b")
    assert (batch.starting, batch.ending, batch.fail_on_data_loss) == ("earliest", "latest", True)
    stream = parse_read_options(
        {
            "kafka.bootstrap.servers": "h:1",
            "assign": '{"t": [1, 0]}',
            "maxoffsetspertrigger": "7",
            "startingOffsets": '{"t": {"0": -1, "1": 5}}',
        },
        streaming=True,
    )
    assert stream.subscription.assigned == (TP("t", 1), TP("t", 0))
    assert stream.starting == {TP("t", 0): -1, TP("t", 1): 5}
    assert stream.max_offsets_per_trigger == 7
    assert stream.client_config["bootstrap.servers"] == [("h", 1)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t", "endingOffsets": "latest"}, "endingOffsets"),
        ({"subscribe": "t", "startingOffsets": '{"t": {"0": -3}}'}, "startingOffsets"),
        ({"subscribePattern": "(", "kafka.bootstrap.servers": "h:1"}, "subscribePattern"),
        ({"subscribe": "t", "kafka.bootstrap.servers": "nope"}, "bootstrap.servers"),
    ],
)
def test_streaming_read_option_errors(options, message):
    options = {"kafka.bootstrap.servers": "h:1", **options}
    with pytest.raises(OptionError, match=message):
        parse_read_options(options, streaming=True)


def test_write_options_default_to_acks_all_and_big_batches():
    opts = parse_write_options({"kafka.bootstrap.servers": "h:1", "topic": "t"})
    assert opts.client_config["acks"] == -1 and opts.client_config["batch.size"] == 262144
    assert (
        parse_write_options({"kafka.bootstrap.servers": "h:1", "kafka.acks": "1"}).client_config[
            "acks"
        ]
        == 1
    )


def test_split_ranges_honours_min_partitions_and_covers_everything():
    ranges = [OffsetRange("t", 0, 0, 90), OffsetRange("t", 1, 5, 15), OffsetRange("t", 2, 3, 3)]
    assert split_ranges(ranges, None) == ranges[:2]
    split = split_ranges(ranges, 10)
    assert len(split) >= 10
    for p in (0, 1):
        parts = [r for r in split if r.partition == p]
        assert parts[0].start == ranges[p].start and parts[-1].end == ranges[p].end
        assert all(a.end == b.start for a, b in itertools.pairwise(parts))


@given(
    st.dictionaries(
        st.integers(0, 5), st.tuples(st.integers(0, 100), st.integers(0, 100)), min_size=1
    ),
    st.integers(1, 150),
)
def test_cap_offsets_admits_exactly_the_limit(spans, limit):
    start = {TP("t", p): a for p, (a, _) in spans.items()}
    latest = {TP("t", p): a + n for p, (a, n) in spans.items()}
    capped = cap_offsets(start, latest, limit)
    backlog = sum(n for _, n in spans.values())
    assert sum(capped[tp] - start[tp] for tp in start) == min(limit, backlog)
    assert all(start[tp] <= capped[tp] <= latest[tp] for tp in start)


def test_offsets_json_round_trip():
    offsets = {TP("a", 0): 3, TP("a", 10): 4, TP("b", 1): 0}
    assert to_json(offsets) == {"a": {"0": 3, "10": 4}, "b": {"1": 0}}
    assert from_json(to_json(offsets)) == offsets


# --- kafka.* settings a ported spark-sql-kafka job carries (client/spark/kafka_keys.py) -----


def test_every_kafka_key_is_accepted_honoured_or_ignored_with_a_warning(caplog):
    options = {
        "kafka.bootstrap.servers": "h:1",
        "subscribe": "t",
        "kafka.security.protocol": "PLAINTEXT",
        "kafka.isolation.level": "read_committed",
        "kafka.group.id": "ported-job",
        "kafka.fetch.max.wait.ms": "250",  # ours: honoured
        "kafka.linger.ms": "5",  # a producer setting in a read: ignored, said so
        "kafka.ssl.truststore.location": "/etc/x.jks",
    }
    with caplog.at_level("WARNING", logger="minibroker.spark"):
        read = parse_read_options(options, streaming=False)
    assert read.client_config["fetch.max.wait.ms"] == 250
    assert read.client_config["isolation.level"] == "read_committed"  # ours: honoured
    warned = caplog.text
    for key in ("security.protocol", "group.id", "linger.ms", "ssl."):
        assert f"kafka.{key}" in warned
    assert "only a streaming query commits its progress" in warned  # group.id in a batch read
    caplog.clear()
    with caplog.at_level("WARNING", logger="minibroker.spark"):
        stream = parse_read_options({**options, "kafka.session.timeout.ms": "6000"}, streaming=True)
    # A streaming query reports its progress to kafka.group.id; the group settings of a
    # member the client has mean nothing to the source, which never joins: said so.
    assert stream.client_config["group.id"] == "ported-job"
    assert "kafka.group.id" not in caplog.text
    assert "'kafka.session.timeout.ms' is accepted and ignored" in caplog.text
    write = parse_write_options(
        {
            "kafka.bootstrap.servers": "h:1",
            "topic": "t",
            "kafka.enable.idempotence": "false",
            "kafka.compression.type": "none",
            "kafka.acks": "1",
        }
    )
    assert write.client_config["enable.idempotence"] is False
    assert write.client_config["acks"] == 1


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("kafka.security.protocol", "SASL_SSL", "no TLS and no SASL"),
        ("kafka.compression.type", "zstd", "not compressed"),
        ("kafka.value.deserializer", "x.Y", "DataFrame operations"),
        ("kafka.lingr.ms", "5", "did you mean 'linger.ms'"),
    ],
)
def test_a_kafka_value_that_cannot_be_honoured_fails_saying_so(key, value, message):
    with pytest.raises(OptionError, match=message):
        parse_write_options({"kafka.bootstrap.servers": "h:1", "topic": "t", key: value})


def test_the_source_reads_committed_records_only_when_asked():
    """kafka.isolation.level reaches the source's consumer (transactions are served)."""
    base = {"kafka.bootstrap.servers": "h:1", "subscribe": "t"}
    opts = parse_read_options({**base, "kafka.isolation.level": "read_committed"}, streaming=False)
    assert opts.client_config["isolation.level"] == "read_committed"
    with pytest.raises(OptionError, match="read_uncommitted or read_committed"):
        parse_read_options({**base, "kafka.isolation.level": "dirty"}, streaming=False)


def test_offsets_by_timestamp_options_parse_and_take_precedence():
    opts = parse_read_options(
        {
            "kafka.bootstrap.servers": "h:1",
            "subscribe": "t",
            "startingOffsetsByTimestamp": '{"t": {"0": 5, "1": 7}}',
            "endingTimestamp": "99",
            "startingOffsetsByTimestampStrategy": "LATEST",
        },
        streaming=False,
    )
    assert opts.starting_time == {TP("t", 0): 5, TP("t", 1): 7}
    assert (opts.ending_time, opts.starting_time_strategy) == (99, "latest")
    single = parse_read_options(
        {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "startingTimestamp": "3"},
        streaming=True,
    )
    assert single.starting_time == 3 and single.ending_time is None
    with pytest.raises(OptionError, match="batch reads only"):
        parse_read_options(
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "endingTimestamp": "3"},
            streaming=True,
        )
    with pytest.raises(OptionError, match="error or latest"):
        parse_read_options(
            {
                "kafka.bootstrap.servers": "h:1",
                "subscribe": "t",
                "startingOffsetsByTimestampStrategy": "closest",
            },
            streaming=False,
        )


def test_min_offsets_per_trigger_decision_and_durations():
    from minibroker.client.spark.options import parse_duration_ms
    from minibroker.client.spark.source import delay_trigger

    # 3 new offsets of a minimum 5: held until 10 s have passed since the last trigger.
    assert delay_trigger(3, now_ms=5_000, last_trigger_ms=0, min_offsets=5, max_delay_ms=10_000)
    assert not delay_trigger(3, 10_000, 0, 5, 10_000)
    assert not delay_trigger(5, 5_000, 0, 5, 10_000)
    assert [parse_duration_ms("d", v) for v in ("15m", "30s", "250ms", "2h", "40")] == [
        900_000,
        30_000,
        250,
        7_200_000,
        40,
    ]
    with pytest.raises(OptionError, match="maxTriggerDelay"):
        parse_read_options(
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "maxTriggerDelay": "soon"},
            streaming=True,
        )


def test_exactly_once_options_and_when_they_are_refused(caplog):
    base = {"kafka.bootstrap.servers": "h:1", "topic": "t"}
    assert parse_write_options(base).exactly_once and parse_write_options(base).txn is None
    named = parse_write_options({**base, "txnAppId": "app", "txnVersion": "7"})
    assert named.txn == ("app", 7)
    assert not parse_write_options({**base, "exactlyOnce": "false"}).exactly_once
    # Idempotence turned off by a conflicting kafka.* setting: at-least-once, with a warning
    # (as Kafka's enable.idempotence default gives way) - unless exactlyOnce was asked for.
    with caplog.at_level("WARNING", logger="minibroker.spark"):
        assert not parse_write_options({**base, "kafka.acks": "1"}).exactly_once
    assert "at-least-once" in caplog.text
    refused = [
        ({"kafka.acks": "1", "exactlyOnce": "true"}, "needs the idempotent producer"),
        ({"txnAppId": "app"}, "give both 'txnAppId' and 'txnVersion'"),
        ({"txnAppId": "app", "txnVersion": "-1"}, "non-negative integer"),
        ({"txnAppId": " ", "txnVersion": "1"}, "'txnAppId' must not be empty"),
        ({"txnAppId": "a", "txnVersion": "1", "exactlyOnce": "false"}, "need exactlyOnce=true"),
        ({"exactlyOnce": "maybe"}, "must be true or false"),
    ]
    for extra, message in refused:
        with pytest.raises(OptionError, match=message):
            parse_write_options({**base, **extra})


def test_write_identities_are_stable_distinct_and_epoch_per_version():
    from minibroker.client.spark.exactly_once import EPOCHS_PER_ID, WriteIdentity
    from minibroker.protocol.batch import DERIVED_PRODUCER_ID_BASE

    batch_3 = WriteIdentity.streaming("q-1", 3)
    assert batch_3.for_task(0) == WriteIdentity.streaming("q-1", 3).for_task(0)  # a rerun
    assert batch_3.for_task(0).epoch == 3
    # The next batch: the same producer id, a newer epoch (which fences the older batch).
    assert WriteIdentity.streaming("q-1", 4).for_task(0) == (batch_3.for_task(0)[0], 4)
    ids = {
        batch_3.for_task(1)[0],
        batch_3.for_task(0)[0],
        WriteIdentity.streaming("q-2", 3).for_task(0)[0],
        WriteIdentity.application("q-1", 3).for_task(0)[0],
        WriteIdentity.streaming("q-1", EPOCHS_PER_ID + 3).for_task(0)[0],
    }
    assert len(ids) == 5 and all(DERIVED_PRODUCER_ID_BASE <= i < 2**63 for i in ids)
    assert WriteIdentity.one_off() != WriteIdentity.one_off()


def test_a_range_that_ends_in_a_compacted_gap_is_complete(tmp_path):
    """A planned range whose tail a compacted topic's cleaner removed: the broker answers
    with the next batch after the gap, and the range ends there instead of waiting."""
    from minibroker.broker.storage import Log, LogConfig, cleaner
    from minibroker.client.spark.fetch import RangeFetcher
    from minibroker.protocol import encode_batch

    log = Log.open(tmp_path, LogConfig(cleanup_policy="compact"))
    for value in (b"1", b"2"):  # offsets 0, 1 then 2, 3: the second pair is the latest
        log.append_as_leader(encode_batch([(1000, b"a", value, ()), (1000, b"b", value, ())]), 1)
    log.roll()
    cleaner.clean_now(cleaner.plan(log, log.log_end_offset, log.now_ms()))
    data = log.read(0, 1 << 20).data
    assert RangeFetcher._complete_batches(data, 0, 2) == ([], 2)
    batches, next_offset = RangeFetcher._complete_batches(data, 0, 4)
    assert [h.base_offset for _, h in batches] == [2] and next_offset == 4
    log.close()
