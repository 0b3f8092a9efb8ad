"""Client quotas on the manual clock: sampled rates, Kafka's throttle time, the entity
precedence, and the throttled connection's unmute firing on time from the shared timer."""

from __future__ import annotations

import pytest

from minibroker.broker.network.session import ConnectionSession
from minibroker.broker.purgatory import ManualClock, ManualTimer
from minibroker.broker.quota import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    ChannelThrottler,
    ClientQuotaManager,
    ClientQuotas,
    QuotaConfigs,
    QuotaEntity,
    QuotaError,
    SampledRate,
    throttle_time_ms,
    throttled_replicas_error,
    validate_quota,
)
from minibroker.broker.quota.entity import CLIENT_ID, USER

# --- rates ------------------------------------------------------------------------------


def test_rate_counts_at_least_samples_minus_one_windows():
    # Kafka's Rate.windowSize: a first burst is spread over (samples - 1) windows, not
    # over the few milliseconds that passed.
    rate = SampledRate(11, 1000, now_ms=0)
    rate.record(10_000, 0)
    assert rate.window_size_ms(0) == 10_000
    assert rate.rate(0) == pytest.approx(1000.0)
    rate.record(10_000, 500)
    assert rate.window_size_ms(500) == 10_500
    assert rate.rate(500) == pytest.approx(20_000 / 10.5)


def test_rate_forgets_samples_older_than_the_whole_window():
    rate = SampledRate(3, 1000, now_ms=0)
    rate.record(3000, 0)
    assert rate.total(2999) == 3000
    # Three windows after its last event a sample is obsolete (purgeObsoleteSamples).
    assert rate.total(3000) == 0
    assert rate.rate(3000) == 0


def test_rate_over_a_steady_stream_is_the_stream_rate():
    rate = SampledRate(11, 1000, now_ms=0)
    for ms in range(0, 30_000, 10):  # 100 bytes every 10 ms: 10,000 B/s
        rate.record(100, ms)
    assert rate.rate(30_000) == pytest.approx(10_000, rel=0.05)


def test_rate_rejects_nonsense_windows():
    with pytest.raises(ValueError):
        SampledRate(1, 1000, 0)


# --- throttle time ----------------------------------------------------------------------


def test_throttle_time_is_kafkas_formula():
    # X = (O - T) / T * W: 2,000 B/s against 1,000 B/s over 10 s is 10 s more.
    assert throttle_time_ms(2000, 1000, 10_000) == 10_000
    assert throttle_time_ms(1500, 1000, 11_000) == 5500
    assert throttle_time_ms(1000, 1000, 10_000) == 0  # at the bound: no throttle
    assert throttle_time_ms(999, 1000, 10_000) == 0


def test_manager_throttles_only_past_the_bound_and_holds_the_rate_to_it():
    configs = QuotaConfigs()
    configs.set(QuotaEntity.of({CLIENT_ID: "p"}), PRODUCER_BYTE_RATE, 1000)
    manager = ClientQuotaManager(PRODUCER_BYTE_RATE, configs, samples=11, window_ms=1000)
    assert manager.record("ANONYMOUS", "p", 10_000, 0) == 0  # 1,000 B/s over 10 s: at it
    throttle = manager.record("ANONYMOUS", "p", 1000, 0)
    assert throttle == 1000  # 1,100 B/s over 10 s: 1 s to bring it back
    # A client that waits out every throttle and sends again is held at its quota.
    now, sent = 0, 11_000
    while now < 60_000:
        now += max(throttle, 1)
        throttle = manager.record("ANONYMOUS", "p", 1000, now)
        sent += 1000
    assert sent / (now / 1000) == pytest.approx(1000, rel=0.2)
    usage = manager.stats(now)[0]
    assert usage["client_id"] == "p" and usage["throttled"] > 0


def test_stats_with_top_list_the_entities_given_the_most_throttle_time():
    # A default quota gives every client id a rate of its own: the stats answer (built on
    # the broker's loop) lists the few that were throttled most, not all of them.
    configs = QuotaConfigs()
    configs.set(QuotaEntity.of({CLIENT_ID: None}), PRODUCER_BYTE_RATE, 1000)
    manager = ClientQuotaManager(PRODUCER_BYTE_RATE, configs, samples=11, window_ms=1000)
    for n in range(20):
        manager.record("ANONYMOUS", f"c{n}", 10_000 + n * 1000, 0)
    top = manager.stats(0, top=3)
    assert [e["client_id"] for e in top] == ["c19", "c18", "c17"]
    assert top[0]["throttle_time_ms_total"] > top[2]["throttle_time_ms_total"] > 0
    assert len(manager.stats(0)) == 20


def test_manager_ignores_entities_without_a_quota():
    configs = QuotaConfigs()
    configs.set(QuotaEntity.of({CLIENT_ID: "p"}), PRODUCER_BYTE_RATE, 1000)
    manager = ClientQuotaManager(PRODUCER_BYTE_RATE, configs, 11, 1000)
    assert manager.record("ANONYMOUS", "other", 10**9, 0) == 0
    fetch = ClientQuotaManager(CONSUMER_BYTE_RATE, configs, 11, 1000)
    assert not fetch.enabled and manager.enabled


def test_a_changed_quota_applies_to_the_rate_so_far():
    configs = QuotaConfigs()
    entity = QuotaEntity.of({CLIENT_ID: "p"})
    configs.set(entity, PRODUCER_BYTE_RATE, 1_000_000)
    manager = ClientQuotaManager(PRODUCER_BYTE_RATE, configs, 11, 1000)
    assert manager.record("ANONYMOUS", "p", 20_000, 0) == 0
    configs.set(entity, PRODUCER_BYTE_RATE, 1000)
    assert manager.record("ANONYMOUS", "p", 1, 0) == 10_001
    configs.set(entity, PRODUCER_BYTE_RATE, None)
    assert manager.record("ANONYMOUS", "p", 10**9, 0) == 0
    assert not manager.enabled


# --- precedence -------------------------------------------------------------------------

RATE = "follower.replication.throttled.rate"
WINDOWS = {"replication.quota.window.num": 11, "replication.quota.window.size.seconds": 1}

ORDER = [
    ({USER: "alice", CLIENT_ID: "app"}, ("alice", "app")),
    ({USER: "alice", CLIENT_ID: None}, ("alice", "app")),
    ({USER: "alice"}, ("alice", "")),
    ({USER: None, CLIENT_ID: "app"}, ("alice", "app")),
    ({USER: None, CLIENT_ID: None}, ("alice", "app")),
    ({USER: None}, ("alice", "")),
    ({CLIENT_ID: "app"}, ("", "app")),
    ({CLIENT_ID: None}, ("", "app")),
]


@pytest.mark.parametrize("winner", range(len(ORDER)))
def test_the_most_specific_entity_wins_in_kafkas_order(winner):
    configs = QuotaConfigs()
    # Every entity from the winner down is configured, each with its own value.
    for i in range(winner, len(ORDER)):
        configs.set(QuotaEntity.of(ORDER[i][0]), PRODUCER_BYTE_RATE, 100 + i)
    bound, tags = configs.resolve(PRODUCER_BYTE_RATE, "alice", "app")
    assert bound == 100 + winner
    assert tags == ORDER[winner][1]


def test_default_client_quota_gives_each_client_id_a_rate_of_its_own():
    configs = QuotaConfigs()
    configs.set(QuotaEntity.of({CLIENT_ID: None}), PRODUCER_BYTE_RATE, 1000)
    manager = ClientQuotaManager(PRODUCER_BYTE_RATE, configs, 11, 1000)
    assert manager.record("ANONYMOUS", "a", 10_000, 0) == 0
    assert manager.record("ANONYMOUS", "b", 10_000, 0) == 0  # not a's rate
    assert manager.record("ANONYMOUS", "a", 10_000, 0) > 0


def test_a_user_quota_is_shared_by_its_client_ids():
    configs = QuotaConfigs()
    configs.set(QuotaEntity.of({USER: "alice"}), PRODUCER_BYTE_RATE, 1000)
    manager = ClientQuotaManager(PRODUCER_BYTE_RATE, configs, 11, 1000)
    assert manager.record("alice", "a", 10_000, 0) == 0
    assert manager.record("alice", "b", 10_000, 0) == 10_000


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("producer_byte_rate", 0, "must be greater than 0"),
        ("producer_byte_rate", 1.5, "cannot be a fractional value"),
        ("consumer_byte_rate", -1, "must be greater than 0"),
        ("bogus_rate", 5, "Invalid configuration key bogus_rate"),
    ],
)
def test_bad_quota_values_are_refused_with_kafkas_words(key, value, message):
    with pytest.raises(QuotaError, match=message):
        validate_quota(key, value)


def test_fractional_percentages_are_fine():
    assert validate_quota("request_percentage", 12.5) == 12.5
    assert validate_quota("producer_byte_rate", 1e6) == 1_000_000


def test_bad_entities_are_refused():
    with pytest.raises(QuotaError, match="empty"):
        QuotaEntity.of({})
    with pytest.raises(QuotaError, match="ip"):
        QuotaEntity.of({"ip": "1.2.3.4"})


def test_describe_filters_as_kafka():
    configs = QuotaConfigs()
    configs.set(QuotaEntity.of({CLIENT_ID: "a"}), PRODUCER_BYTE_RATE, 1)
    configs.set(QuotaEntity.of({CLIENT_ID: None}), PRODUCER_BYTE_RATE, 2)
    configs.set(QuotaEntity.of({USER: "u", CLIENT_ID: "a"}), PRODUCER_BYTE_RATE, 3)
    exact = configs.describe([(CLIENT_ID, 0, "a")], strict=True)
    assert [v for _, v in exact] == [{PRODUCER_BYTE_RATE: 1}]
    default = configs.describe([(CLIENT_ID, 1, None)], strict=False)
    assert [v for _, v in default] == [{PRODUCER_BYTE_RATE: 2}]
    loose = configs.describe([(CLIENT_ID, 0, "a")], strict=False)
    assert sorted(v[PRODUCER_BYTE_RATE] for _, v in loose) == [1, 3]
    assert len(configs.describe([], strict=False)) == 3


# --- the unmute on the shared timer -----------------------------------------------------


class Hooked:
    """The network layer's side of a throttle, as the socket server records it."""

    def __init__(self) -> None:
        self.session = ConnectionSession("127.0.0.1:1")
        self.session.throttle_hook = self.hook
        self.events: list[bool] = []

    def hook(self, start: bool) -> None:
        self.events.append(start)


def test_the_unmute_fires_when_the_throttle_ends():
    clock = ManualClock()
    throttler = ChannelThrottler(ManualTimer(clock))
    conn = Hooked()
    throttler.throttle(conn.session, 250)
    assert conn.events == [True]
    assert throttler.active == 1
    clock.advance(249)
    assert conn.events == [True]
    clock.advance(1)
    assert conn.events == [True, False]
    assert throttler.active == 0
    assert throttler.unmute_lateness.count == 1


def test_many_throttles_share_the_one_timer_and_each_ends_on_time():
    clock = ManualClock()
    timer = ManualTimer(clock)
    throttler = ChannelThrottler(timer)
    conns = [Hooked() for _ in range(1000)]
    for i, conn in enumerate(conns):
        throttler.throttle(conn.session, 1 + i)
    assert timer.size == 1000
    clock.advance(500)
    assert sum(len(c.events) == 2 for c in conns) == 500
    clock.advance(500)
    assert all(c.events == [True, False] for c in conns)


def test_no_throttle_for_zero_or_a_closed_connection():
    clock = ManualClock()
    throttler = ChannelThrottler(ManualTimer(clock))
    conn = Hooked()
    throttler.throttle(conn.session, 0)
    conn.session.close()
    throttler.throttle(conn.session, 100)
    assert conn.events == [] and throttler.active == 0


def test_a_throttle_ending_after_its_connection_closed_is_harmless():
    clock = ManualClock()
    throttler = ChannelThrottler(ManualTimer(clock))
    conn = Hooked()
    throttler.throttle(conn.session, 10)
    conn.session.throttle_hook = None  # what the socket server does on close
    clock.advance(10)
    assert conn.events == [True] and throttler.active == 0


def test_peek_reads_the_rate_without_changing_the_windows():
    rate = SampledRate(11, 1000, now_ms=0)
    for ms in range(0, 5000, 100):
        rate.record(500, ms)
    windows = (list(rate._starts), list(rate._values))
    assert rate.peek(5000) == pytest.approx(rate.rate(5000))
    assert rate.peek(30_000) == 0.0  # every sample obsolete by then
    assert (list(rate._starts), list(rate._values)) == windows


# --- replication quotas -----------------------------------------------------------------


def test_throttled_replicas_name_partitions_of_this_broker_only():
    from minibroker.broker.quota.replication import throttled_partitions

    assert throttled_partitions("0:1,1:2,3:1", 1) == {0, 3}
    assert throttled_partitions("0:1", 2) == frozenset()
    assert throttled_partitions("*", 7) is None
    assert throttled_replicas_error("0:1, 2:3") is None
    assert "partition:broker" in throttled_replicas_error("0-1")


def test_replication_quota_is_exceeded_past_its_rate_and_recovers():
    from minibroker.broker.quota import FOLLOWER_REPLICAS, ReplicationQuota

    clock = ManualClock()
    quota = ReplicationQuota(
        FOLLOWER_REPLICAS, RATE, 2, {**WINDOWS, RATE: 100_000}, now_ms=clock.now_ms
    )
    configs = {FOLLOWER_REPLICAS: "0:2"}
    assert quota.throttles(configs, 0) and not quota.throttles(configs, 1)
    assert not quota.throttles({}, 0) and not quota.throttles(None, 0)
    quota.record(1_000_000)  # 100 KB/s over the 10 s the rate is measured on
    assert not quota.exceeded()
    quota.record(100_000)
    assert quota.exceeded()
    assert quota.wait_ms() == 1000  # (110 - 100) / 100 * 10 s
    clock.advance(11_000)  # the burst has left the windows
    assert not quota.exceeded()


def test_replication_rates_follow_the_dynamic_broker_config_live():
    """``configs alter --entity-type brokers`` on a rate: the quota the fetch paths hold
    takes the new bound at its next check, and a deleted one stops throttling at once."""
    from minibroker.broker.common.config import BrokerConfig
    from minibroker.broker.common.dynamic_config import DynamicBrokerConfig, broker_config_error
    from minibroker.broker.quota import FOLLOWER_REPLICAS, LEADER_REPLICAS
    from minibroker.broker.quota.replication import replication_quotas

    clock = ManualClock()
    config = DynamicBrokerConfig(BrokerConfig({}))
    leader, follower = replication_quotas(2, config, clock.now_ms)
    configs = {FOLLOWER_REPLICAS: "*", LEADER_REPLICAS: "*"}
    assert not follower.throttles(configs, 0) and not leader.throttles(configs, 0)
    for key in (RATE, "leader.replication.throttled.rate"):
        assert broker_config_error(key, "100000") is None
    assert "below the minimum 1" in broker_config_error(RATE, "0")  # 0 would stop it dead

    assert config.reconfigure({}, {RATE: "100000"}) == {RATE}  # this broker's own value
    assert follower.throttles(configs, 0) and not leader.throttles(configs, 0)
    follower.record(1_100_000)
    assert follower.exceeded() and follower.wait_ms() == 1000
    config.reconfigure({RATE: "50000"}, {RATE: "200000"})  # the per-broker value wins
    assert follower.bound == 200_000 and not follower.exceeded()  # the rate kept
    config.reconfigure({RATE: "50000"}, {})  # --delete-config: the cluster default now
    assert follower.exceeded()
    config.reconfigure({}, {})  # and that deleted too: no limit, nothing throttled
    assert not follower.throttles(configs, 0) and not follower.enabled


def test_throttles_end_on_the_grid_and_lateness_counts_from_the_real_end():
    from minibroker.broker.quota.throttle import UNMUTE_GRID_MS

    clock = ManualClock()
    throttler = ChannelThrottler(ManualTimer(clock))
    conn = Hooked()
    throttler.throttle(conn.session, 251)
    clock.advance(251)
    assert conn.events == [True]  # still muted: ends with the others due by 255
    clock.advance(UNMUTE_GRID_MS - 1)
    assert conn.events == [True, False]
    assert throttler.unmute_lateness.sum == pytest.approx((UNMUTE_GRID_MS - 1) / 1000)


def test_a_client_inventing_client_ids_does_not_grow_the_broker_without_bound():
    from minibroker.broker.quota.manager import MAX_ENTITIES

    configs = QuotaConfigs()
    configs.set(QuotaEntity.of({CLIENT_ID: None}), PRODUCER_BYTE_RATE, 1000)
    manager = ClientQuotaManager(PRODUCER_BYTE_RATE, configs, 11, 1000)
    for i in range(3 * MAX_ENTITIES):
        manager.record("ANONYMOUS", f"id-{i}", 10, now_ms=i * 100)  # each idle 11 s later
    assert len(manager.usage) <= MAX_ENTITIES + 1
    assert len(manager._resolved) <= MAX_ENTITIES
    # A busy entity is kept and still held to its quota.
    assert manager.record("ANONYMOUS", "busy", 20_000, 10**6) > 0
    assert manager.record("ANONYMOUS", "busy", 1, 10**6) > 0


def test_many_active_client_ids_are_looked_over_rarely_and_resolved_once():
    # 10,000 throttled connections, each its own client id (bench quotas --sockets): past
    # MAX_ENTITIES a fixed bound looked over every entity for each new one and cleared the
    # resolution cache every MAX_ENTITIES requests.
    from minibroker.broker.quota.manager import MAX_ENTITIES

    class Counted(ClientQuotaManager):
        looks = 0

        def _drop_idle(self, now_ms: int) -> None:
            self.looks += 1
            super()._drop_idle(now_ms)

    configs = QuotaConfigs()
    configs.set(QuotaEntity.of({CLIENT_ID: None}), PRODUCER_BYTE_RATE, 1000)
    manager = Counted(PRODUCER_BYTE_RATE, configs, 11, 1000)
    active = 2 * MAX_ENTITIES + 1
    for now_ms in (0, 1000):  # every id active twice within the window: none is idle
        for i in range(active):
            manager.record("ANONYMOUS", f"id-{i}", 10, now_ms)
    assert len(manager.usage) == active  # each active id keeps its own rate
    assert manager.looks == 2  # at MAX_ENTITIES and at twice that, not once per new id
    assert len(manager._resolved) == active  # the second round resolved nothing anew
    # Once they go idle, the next look drops them all.
    for i in range(active):
        manager.record("ANONYMOUS", f"new-{i}", 10, now_ms=60_000)
    assert manager.looks == 3
    assert not any(client_id.startswith("id-") for _, client_id in manager.usage)


def test_request_time_throttle_is_the_answers_when_larger_than_the_apis_own():
    """Kafka's KafkaApis: throttle_time_ms is the larger of the API's quota throttle (bytes,
    mutations) and request_percentage's; answers without the field are left alone."""
    from minibroker.broker.apis import carries_throttle
    from minibroker.protocol import ApiKey
    from minibroker.protocol.api import NEWEST_VERSIONS

    clock = ManualClock()
    quotas = ClientQuotas(ManualTimer(clock), clock, samples=11, window_ms=1000)
    quotas.apply(QuotaEntity.of({CLIENT_ID: "busy"}), REQUEST_PERCENTAGE, 1e-6)
    conn = Hooked()

    def timed(answer: dict | None, carries: bool = True) -> dict | None:
        return quotas.timed(lambda: answer, conn.session, "busy", carries)

    small = timed({"topics": [], "throttle_time_ms": 1})
    assert small["throttle_time_ms"] > 1  # any time at all is over a 1e-6 % share
    huge = timed({"topics": [], "throttle_time_ms": 10**9})
    assert huge["throttle_time_ms"] == 10**9  # the bytes' throttle was the larger
    assert timed({"topics": []}, carries=False) == {"topics": []}  # the schema lacks it
    bare = {"error_code": 7, "error_message": "timed out"}
    assert timed(bare) == bare and timed(None) is None
    assert conn.events == [True] * 5  # muted every time all the same
    assert carries_throttle(ApiKey.PRODUCE, NEWEST_VERSIONS[ApiKey.PRODUCE])
    assert not carries_throttle(ApiKey.CREATE_TOPICS, 0)
