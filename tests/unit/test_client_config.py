"""Client settings: Kafka names, defaults, and a ValueError naming the key for anything wrong."""

import pytest

from minibroker.client.config import describe, load_config, parse_bootstrap, parse_properties


def test_defaults_follow_kafka():
    cfg = load_config("producer")
    assert cfg["acks"] == -1
    assert cfg["linger.ms"] == 5
    assert cfg["batch.size"] == 16384
    assert cfg["request.timeout.ms"] == 30000
    assert cfg["delivery.timeout.ms"] == 120000
    assert cfg["retries"] == 2147483647
    assert cfg["max.in.flight.requests.per.connection"] == 5
    assert cfg["bootstrap.servers"] == [("127.0.0.1", 9092)]
    consumer = load_config("consumer")
    assert consumer["auto.offset.reset"] == "latest"
    assert consumer["fetch.max.wait.ms"] == 500
    assert consumer["fetch.min.bytes"] == 1


@pytest.mark.parametrize(
    ("given", "wire"), [("all", -1), ("-1", -1), (-1, -1), ("0", 0), (1, 1), ("ALL", -1)]
)
def test_acks_spellings(given, wire):
    assert load_config("producer", {"acks": given})["acks"] == wire


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"acks": "2"}, "acks"),
        ({"linger.ms": -1}, "linger.ms"),
        ({"linger.ms": "soon"}, "linger.ms"),
        ({"batch.size": 0}, "batch.size"),
        ({"auto.offset.reset": "smallest"}, "auto.offset.reset"),
        ({"bootstrap.servers": "localhost"}, "bootstrap.servers"),
        ({"bootstrap.servers": "h:99999"}, "bootstrap.servers"),
        ({"request.timeout.ms": True}, "request.timeout.ms"),
    ],
)
def test_bad_values_name_the_key(settings, named):
    role = "consumer" if "auto.offset.reset" in settings else "producer"
    with pytest.raises(ValueError, match=f"'{named}'"):
        load_config(role, settings)


def test_unknown_key_is_named_with_a_suggestion():
    with pytest.raises(
        ValueError, match=r"unknown config key 'linger\.m'.*did you mean 'linger\.ms'"
    ):
        load_config("producer", {"linger.m": 5})


def test_key_of_another_role_is_refused():
    with pytest.raises(ValueError, match="not a consumer setting"):
        load_config("consumer", {"linger.ms": 5})


def test_strings_from_the_command_line_are_parsed():
    cfg = load_config(
        "producer", parse_properties(["linger.ms=20", "batch.size = 1048576", "acks=1"])
    )
    assert (cfg["linger.ms"], cfg["batch.size"], cfg["acks"]) == (20, 1048576, 1)


def test_later_sources_win():
    cfg = load_config("producer", {"linger.ms": 1}, {"linger.ms": 2})
    assert cfg["linger.ms"] == 2


def test_delivery_timeout_must_cover_linger_and_request_timeout():
    with pytest.raises(ValueError, match=r"delivery\.timeout\.ms"):
        load_config("producer", {"delivery.timeout.ms": 1000, "request.timeout.ms": 30000})


def test_bootstrap_list_forms():
    assert parse_bootstrap("b", "a:1, b:2") == [("a", 1), ("b", 2)]
    assert parse_bootstrap("b", ["a:1", ("b", 2)]) == [("a", 1), ("b", 2)]


def test_property_needs_equals():
    with pytest.raises(ValueError, match="key=value"):
        parse_properties(["linger.ms"])


def test_every_setting_is_documented():
    for role in ("producer", "consumer", "admin"):
        for key, _default, doc in describe(role):
            assert doc, key


def test_idempotence_is_on_by_default_and_off_when_a_setting_conflicts():
    assert load_config("producer")["enable.idempotence"] is True
    # Kafka 3.2+: not asked for explicitly, so acks=1 quietly turns it off.
    assert load_config("producer", {"acks": "1"})["enable.idempotence"] is False
    assert load_config("producer", {"enable.idempotence": "false"})["enable.idempotence"] is False


@pytest.mark.parametrize(
    ("setting", "needed"),
    [
        ({"acks": "1"}, "acks to all"),
        ({"retries": 0}, "retries above 0"),
        ({"max.in.flight.requests.per.connection": 6}, "at most 5"),
    ],
)
def test_explicit_idempotence_with_a_conflicting_setting_is_refused(setting, needed):
    with pytest.raises(ValueError, match=needed):
        load_config("producer", {"enable.idempotence": True, **setting})
