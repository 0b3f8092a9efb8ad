"""The bundled consumer and transactions: control records are never handed out, a
read_committed consumer drops aborted transactions as Kafka's does, and its fetch offset
and position move past both (client/fetcher.py); its "latest" offset is the LSO."""

from __future__ import annotations

import pytest

from minibroker.broker.storage import Log, LogConfig
from minibroker.client.config import load_config
from minibroker.client.fetcher import PartitionState, apply_partition_result, decode_fetched
from minibroker.client.offsets import LATEST_TIMESTAMP, list_offsets, lookup_retries
from minibroker.client.records import TopicPartition
from minibroker.protocol import encode_batch
from minibroker.protocol.batch import TRANSACTIONAL_FLAG

P1, P2 = 31, 32


def txn(pid: int, seq: int, value: str) -> bytes:
    return encode_batch(
        [(1000, None, value.encode(), [])],
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        attributes=TRANSACTIONAL_FLAG,
    )


def fetched(tmp_path) -> tuple[bytes, list[dict]]:
    """A partition's records as a fetch returns them, and its aborted transactions."""
    log = Log.open(tmp_path, LogConfig(), now_ms=lambda: 5000)
    log.append_as_leader(encode_batch([(1000, None, b"plain", [])]), 0)  # 0
    log.append_as_leader(txn(P1, 0, "p1-aborted"), 0)  # 1
    log.append_as_leader(txn(P2, 0, "p2-committed"), 0)  # 2
    log.append_marker(P1, 0, 0, False, 0)  # 3
    log.append_as_leader(txn(P1, 1, "p1-next"), 0)  # 4: a new transaction of P1
    log.append_marker(P2, 0, 0, True, 0)  # 5
    log.append_marker(P1, 0, 0, True, 0)  # 6
    end = log.log_end_offset
    aborted = [{"producer_id": p, "first_offset": f} for p, f in log.collect_aborted(0, end)]
    return log.read(0, 1 << 20).data, aborted


def test_read_committed_drops_aborted_records_and_markers(tmp_path) -> None:
    data, aborted = fetched(tmp_path)
    assert aborted == [{"producer_id": P1, "first_offset": 1}]
    records, next_offset = decode_fetched("t", 0, data, 0, aborted)
    assert [r.value for r in records] == [b"plain", b"p2-committed", b"p1-next"]
    assert next_offset == 7


def test_read_uncommitted_sees_every_record_but_no_marker(tmp_path) -> None:
    data, _ = fetched(tmp_path)
    records, next_offset = decode_fetched("t", 0, data, 0, None)
    assert [r.offset for r in records] == [0, 1, 2, 4]
    assert next_offset == 7


def test_the_fetch_offset_and_position_move_past_trailing_markers(tmp_path) -> None:
    data, _ = fetched(tmp_path)
    st = PartitionState(TopicPartition("t", 0), 1 << 20)
    st.seek(5)  # only markers from here
    result = {"error_code": 0, "high_watermark": 7, "records": data, "aborted_transactions": []}
    outcome = apply_partition_result(st, result, 5, 1 << 20)
    assert outcome.error is None
    assert (st.fetch_offset, st.position, list(st.chunks)) == (7, 7, [])


def test_isolation_level_is_a_consumer_setting() -> None:
    assert load_config("consumer", {})["isolation.level"] == "read_uncommitted"
    config = load_config("consumer", {"isolation.level": "read_committed"})
    assert config["isolation.level"] == "read_committed"
    with pytest.raises(ValueError, match=r"isolation\.level"):
        load_config("consumer", {"isolation.level": "serializable"})


class _OneLeader:
    """A cluster whose broker 0 leads everything and answers ListOffsets with offset 7."""

    def __init__(self) -> None:
        self.asked: list[dict] = []

    def leader(self, topic: str, partition: int) -> int:
        return 0

    async def refresh(self, topics=()) -> dict:
        return {}

    async def request(self, node: int, api_key: int, body: dict, **_: object) -> dict:
        self.asked.append(body)
        partition = {"partition": 0, "error_code": 0, "offset": 7, "timestamp": -1}
        return {"topics": [{"name": "t", "partitions": [partition]}]}


@pytest.mark.parametrize(("isolation", "sent"), [("read_committed", 1), ("read_uncommitted", None)])
async def test_a_read_committed_consumers_latest_offset_is_asked_as_the_lso(isolation, sent):
    """Kafka's endOffsets and auto.offset.reset=latest under read_committed: the LSO."""
    cluster = _OneLeader()
    config = load_config("consumer", {"isolation.level": isolation})
    wanted = {TopicPartition("t", 0): LATEST_TIMESTAMP}
    await list_offsets(cluster, wanted, **lookup_retries(config))  # type: ignore[arg-type]
    assert cluster.asked[0].get("isolation_level") == sent
