"""The sender's retry rules: retriable errors retry after a metadata refresh, others fail at once.

The cluster here is a scripted stand-in for the metadata/connection layer (answers
per request), so retry and expiry decisions are checked without a broker.
"""

from __future__ import annotations

import pytest
import trio

from minibroker.client.accumulator import DeliveryHandle, RecordAccumulator
from minibroker.client.config import load_config
from minibroker.client.idempotence import FixedIdentity
from minibroker.client.sender import Sender
from minibroker.protocol.batch import DERIVED_PRODUCER_ID_BASE
from minibroker.protocol.errors import (
    InvalidRecord,
    NetworkException,
    NotLeaderOrFollower,
    OutOfOrderSequenceNumber,
    RequestTimedOut,
)


class ScriptedCluster:
    def __init__(self, answers):
        self.answers = list(answers)
        self.requests = []
        self.refreshes = 0
        self.wanted = set()
        self.topic_errors = {}
        self.stale = False
        self.expires_at = float("inf")

    def leader(self, topic, partition):
        return 0

    def partition_count(self, topic):
        return 1

    async def refresh(self, topics=()):
        self.refreshes += 1

    async def any_request(self, api_key, body, timeout=None):
        self.init_requests = getattr(self, "init_requests", 0) + 1
        return {"error_code": 0, "producer_id": 42, "producer_epoch": 0}

    async def request(self, node, api_key, body, *, timeout=None, expect_response=True):
        self.requests.append(body)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return {"topics": [{"name": "t", "partitions": [answer]}]}


def ok(base):
    return {"partition": 0, "error_code": 0, "base_offset": base}


def err(code):
    return {"partition": 0, "error_code": code, "base_offset": -1, "error_message": "scripted"}


async def run_sender(answers, identity=None, **settings):
    config = load_config("producer", {"linger.ms": 0, "retry.backoff.ms": 1, **settings})
    cluster = ScriptedCluster(answers)
    acc = RecordAccumulator(config["batch.size"], 0, config["delivery.timeout.ms"])
    sender = Sender(config, cluster, acc, identity)
    batch, index, _ = acc.append("t", 0, 1, None, b"v", None, 11)
    handle = DeliveryHandle(batch, index)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        with trio.fail_after(10):
            try:
                result = await handle
            except Exception as exc:
                result = exc
        nursery.cancel_scope.cancel()
    return result, cluster


async def test_retriable_partition_error_is_retried_after_a_metadata_refresh():
    result, cluster = await run_sender([err(6), ok(7)])
    assert result.offset == 7
    assert len(cluster.requests) == 2 and cluster.refreshes >= 1
    # The retry resends the same encoded batch.
    first = cluster.requests[0]["topics"][0]["partitions"][0]["records"]
    assert cluster.requests[1]["topics"][0]["partitions"][0]["records"] is first


async def test_connection_failures_are_retried():
    result, cluster = await run_sender([NetworkException("gone"), RequestTimedOut("slow"), ok(0)])
    assert result.offset == 0 and len(cluster.requests) == 3


async def test_non_retriable_error_fails_without_retry():
    result, cluster = await run_sender([err(87)])
    assert isinstance(result, InvalidRecord) and len(cluster.requests) == 1


async def test_retries_setting_bounds_the_attempts():
    result, cluster = await run_sender([err(6), err(6), ok(1)], retries=1)
    assert isinstance(result, NotLeaderOrFollower)
    assert len(cluster.requests) == 2


@pytest.mark.parametrize("acks", ["0"])
async def test_acks_zero_completes_without_an_answer(acks):
    result, cluster = await run_sender([{}], acks=acks)
    assert result.offset == -1
    assert cluster.requests[0]["acks"] == 0


async def test_delivery_timeout_ends_the_retries_with_the_last_error():
    # Real time (the sender reads the monotonic clock): a request timeout far above a
    # scripted answer's latency, and a delivery timeout long enough that a loaded machine
    # (load 13 on 2 cores failed 0.9 s) still sends the first request and a retry in it,
    # so the last error is the broker's, never the client's own timeout.
    settings = {"request.timeout.ms": 300, "delivery.timeout.ms": 2000, "retry.backoff.ms": 50}
    config = load_config("producer", {"linger.ms": 0, **settings})
    result, cluster = await run_sender([err(19)] * 1000, **settings)
    assert result.code.name == "NOT_ENOUGH_REPLICAS"
    assert 2 <= len(cluster.requests) < 1000
    assert config["retries"] > len(cluster.requests)


async def test_awaiting_a_handle_and_flush_skip_the_linger():
    """What Producer.send, an awaited send_nowait handle and flush ask of the sender: a
    caller is waiting, so a batch that would linger for 100 s goes now."""
    config = load_config("producer", {"linger.ms": 100_000, "delivery.timeout.ms": 200_000})
    cluster = ScriptedCluster([ok(5), ok(6)])
    acc = RecordAccumulator(
        config["batch.size"], config["linger.ms"], config["delivery.timeout.ms"]
    )
    sender = Sender(config, cluster, acc)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        with trio.fail_after(10):
            batch, index, _ = acc.append("t", 0, 1, None, b"v", None, 11)
            assert (await DeliveryHandle(batch, index)).offset == 5
            assert acc._flushers == 0  # the wait is over: batches linger again
            later, _, _ = acc.append("t", 0, 1, None, b"w", None, 11)
            await sender.flush()
        assert later.done.is_set() and acc.ready(0.0)[0] == []
        nursery.cancel_scope.cancel()


# --- the idempotent producer (client/idempotence.py) ------------------------------------------


def producer_fields_of(request):
    from minibroker.protocol import iter_batches
    from minibroker.protocol.batch import producer_fields

    data = request["topics"][0]["partitions"][0]["records"]
    ((pos, header),) = iter_batches(data)
    return producer_fields(data, pos, header)


async def test_an_idempotent_batch_keeps_its_sequence_across_retries():
    result, cluster = await run_sender([NetworkException("cut"), ok(3)])
    assert result.offset == 3
    assert cluster.init_requests == 1
    assert [producer_fields_of(r) for r in cluster.requests] == [(42, 0, 0), (42, 0, 0)]


async def test_out_of_order_for_the_oldest_batch_bumps_the_epoch_and_resends_from_zero():
    result, cluster = await run_sender([err(45), ok(9)])
    assert result.offset == 9
    assert [producer_fields_of(r) for r in cluster.requests] == [(42, 0, 0), (42, 1, 0)]


async def test_a_fixed_identity_is_used_as_given_and_never_bumped():
    """The Spark sink's identity: no InitProducerId, and out of order fails the writer
    (its rerun resends from sequence 0) instead of moving to a new epoch."""
    identity = FixedIdentity(DERIVED_PRODUCER_ID_BASE + 5, 7)
    result, cluster = await run_sender([ok(4)], identity)
    assert result.offset == 4 and not hasattr(cluster, "init_requests")
    assert producer_fields_of(cluster.requests[0]) == (DERIVED_PRODUCER_ID_BASE + 5, 7, 0)
    result, cluster = await run_sender([err(45), ok(9)], identity)
    assert isinstance(result, OutOfOrderSequenceNumber)
    assert "must start over" in str(result)
    assert [producer_fields_of(r) for r in cluster.requests] == [(identity[0], 7, 0)]


async def test_without_idempotence_batches_carry_no_producer_fields():
    result, cluster = await run_sender([ok(1)], **{"enable.idempotence": False})
    assert result.offset == 1 and producer_fields_of(cluster.requests[0]) is None
    assert not hasattr(cluster, "init_requests")


def test_a_batch_of_unknown_fate_is_resolved_under_its_own_epoch_before_a_bump():
    from minibroker.client.accumulator import RecordAccumulator as Acc

    config = load_config("producer", {"linger.ms": 0})
    acc = Acc(config["batch.size"], 0, config["delivery.timeout.ms"])
    sender = Sender(config, ScriptedCluster([]), acc)
    sender.idempotence.set_producer_id(42, 0)
    batch, _, _ = acc.append("t", 0, 1, None, b"v", None, 11, now_ms=0)
    sender._seal(batch, ("t", 0))  # as the sender seals a batch it is about to send
    acc.pop(("t", 0))
    batch.attempts = 1
    batch.unresolved = True  # its request got no answer
    acc.reenqueue(batch, 0)
    sender.idempotence.request_bump()  # another batch was given up on
    assert not sender._producer_id_ready() and sender._resolving
    assert sender.idempotence.epoch == 0 and producer_fields_of_batch(batch) == (42, 0, 0)
    batch.unresolved = False  # answered: written (duplicate) or refused (out of order)
    assert sender._producer_id_ready()
    assert sender.idempotence.epoch == 1 and producer_fields_of_batch(batch) == (42, 1, 0)


def producer_fields_of_batch(batch):
    from minibroker.protocol import iter_batches
    from minibroker.protocol.batch import producer_fields

    ((pos, header),) = iter_batches(batch.payload)
    return producer_fields(batch.payload, pos, header)
