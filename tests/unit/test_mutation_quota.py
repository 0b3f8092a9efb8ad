"""controller_mutation_rate (KIP-599) on the manual clock: Kafka's token bucket, the strict
quota (refuse once in debt, never for the request that goes into debt) and the permissive
one (accept, throttle), and the throttle time shrinking while the answer waits."""

from __future__ import annotations

import pytest

from minibroker.broker.purgatory import ManualClock, ManualTimer
from minibroker.broker.quota import (
    CONTROLLER_MUTATION_RATE,
    ClientQuotas,
    QuotaConfigs,
    QuotaEntity,
)
from minibroker.broker.quota.entity import CLIENT_ID
from minibroker.broker.quota.mutation import ControllerMutationQuotaManager, TokenBucket
from tests.unit.test_quota import Hooked

# 10 partitions/s over 11 windows of 1 s: a full bucket holds 110 partitions.
RATE, SAMPLES, WINDOW_MS = 10.0, 11, 1000


def manager(rate: float = RATE, client_id: str | None = "admin") -> ControllerMutationQuotaManager:
    configs = QuotaConfigs()
    configs.set(QuotaEntity.of({CLIENT_ID: client_id}), CONTROLLER_MUTATION_RATE, rate)
    return ControllerMutationQuotaManager(configs, SAMPLES, WINDOW_MS)


def test_the_token_bucket_starts_full_refills_at_the_rate_and_caps_at_the_burst():
    bucket = TokenBucket(SAMPLES, WINDOW_MS, now_ms=0)
    assert bucket.measure(RATE, 0) == 110  # samples * window * rate
    assert bucket.record(150, RATE, 0) == -40
    assert bucket.measure(RATE, 2000) == pytest.approx(-20)  # 10 per second back
    assert bucket.measure(RATE, 60_000) == 110  # never above the burst


def test_strict_accepts_the_request_that_goes_into_debt_and_refuses_the_next():
    quotas = manager()
    first = quotas.quota_for("ANONYMOUS", "admin", True, 0)
    assert first.record(100, 0) and first.record(50, 0)  # 110 -> 10 -> -40: both in
    assert first.throttle_time_ms(0) == 0  # Kafka: no throttle until one is refused
    assert not first.record(1, 0)  # in debt: refused
    assert first.throttle_time_ms(0) == 4000  # 40 partitions at 10/s
    # The answer went out 1.5 s later (waiting for the controller): less to wait.
    assert first.throttle_time_ms(1500) == 2500
    second = quotas.quota_for("ANONYMOUS", "admin", True, 3000)
    assert not second.record(1, 3000) and second.throttle_time_ms(3000) == 1000
    third = quotas.quota_for("ANONYMOUS", "admin", True, 4000)
    assert third.record(1, 4000) and third.throttle_time_ms(4000) == 0  # back at zero


def test_permissive_accepts_everything_and_throttles_once_in_debt():
    quotas = manager()
    old = quotas.quota_for("ANONYMOUS", "admin", False, 0)
    assert old.record(100, 0) and old.throttle_time_ms(0) == 0
    assert old.record(30, 0)  # 10 - 30 = -20: accepted all the same
    assert old.throttle_time_ms(0) == 2000
    [entity] = quotas.stats(0)
    assert (entity["tokens"], entity["throttled"], entity["throttle_time_ms_total"]) == (
        -20,
        1,
        2000,
    )


def test_the_quota_binds_the_entity_that_matches_and_nobody_else():
    quotas = manager(client_id=None)  # clients/<default>: every client id its own bucket
    assert quotas.quota_for("ANONYMOUS", "a", True, 0).record(200, 0)
    assert not quotas.quota_for("ANONYMOUS", "a", True, 0).record(1, 0)
    assert quotas.quota_for("ANONYMOUS", "b", True, 0).record(1, 0)  # b's bucket is full
    assert manager(client_id="other").quota_for("ANONYMOUS", "a", True, 0) is None


def test_the_answer_mutes_the_connection_for_its_throttle():
    clock = ManualClock()
    quotas = ClientQuotas(ManualTimer(clock), clock, samples=SAMPLES, window_ms=WINDOW_MS)
    conn = Hooked()
    assert quotas.mutation_quota(conn.session, "admin", True) is None  # no quota: unbounded
    quotas.apply(QuotaEntity.of({CLIENT_ID: "admin"}), CONTROLLER_MUTATION_RATE, RATE)
    quota = quotas.mutation_quota(conn.session, "admin", True)
    assert quota.record(120, clock.now_ms()) and not quota.record(5, clock.now_ms())
    assert quotas.mutation_throttle(conn.session, quota) == 1000
    assert conn.events == [True]
    clock.advance(1000 + 5)  # the unmute grid
    assert conn.events == [True, False]
    # A cluster member (replication, forwarding) is never client-throttled.
    conn.session.principal = 1
    assert quotas.mutation_quota(conn.session, "admin", True) is None
