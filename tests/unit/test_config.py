"""Broker configuration: Kafka key names, TOML in both shapes, errors that name the key."""

from __future__ import annotations

import pytest

from minibroker.broker.common.config import (
    DEFS,
    BrokerConfig,
    ConfigError,
    load_config,
    parse_set_options,
)


def test_defaults_are_documented_and_kafka_named():
    config = BrokerConfig()
    assert config["min.insync.replicas"] == 1
    assert config["replica.lag.time.max.ms"] == 30000
    assert config["timer.tick.ms"] == 1 and config["timer.wheel.size"] == 20
    assert all(d.doc for d in DEFS.values())


def test_toml_flat_and_nested_keys_then_set_wins(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text('"log.segment.bytes" = 2097152\n[min.insync]\nreplicas = 2\n')
    config = load_config(path, parse_set_options(["min.insync.replicas=3", "faults.enable=true"]))
    assert config["log.segment.bytes"] == 2097152
    assert config["min.insync.replicas"] == 3
    assert config["faults.enable"] is True
    assert config.overrides()["log.segment.bytes"] == 2097152


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            {"min.insync.replica": "2"},
            "unknown config key 'min.insync.replica' (did you mean 'min.insync.replicas'?)",
        ),
        ({"min.insync.replicas": "two"}, "config 'min.insync.replicas': expected an integer"),
        ({"min.insync.replicas": "0"}, "below the minimum 1"),
        ({"faults.enable": "yes"}, "expected true or false"),
        (
            {"log.segment.bytes": "4096"},
            "'log.segment.bytes': 4096 is below the minimum 1048576 (allowed: [1048576, 2147483647])",
        ),
        (
            {"log.segment.bytes": "4000000000"},
            "'log.segment.bytes': 4000000000 is above the maximum 2147483647",
        ),
        ({"log.format": "xml"}, "not one of console, json"),
        (
            {"broker.session.timeout.ms": "1000"},
            "must be less than 'broker.session.timeout.ms' (1000)",
        ),
    ],
)
def test_bad_keys_and_values_are_named(sets, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, sets)
    assert message in str(info.value)


def test_bad_files_and_set_syntax(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="expects key=value"):
        parse_set_options(["novalue"])


def test_shared_purge_interval_applies_to_both_purgatories():
    config = BrokerConfig(
        {"purgatory.purge.interval.requests": 10, "fetch.purgatory.purge.interval.requests": 3}
    )
    assert config["producer.purgatory.purge.interval.requests"] == 10
    assert config["fetch.purgatory.purge.interval.requests"] == 3


def test_max_connections_help_says_what_the_budget_does():
    """The help once said "minus a reserve for log files" where the code took a quarter:
    the figures in the text are the constants the budget uses."""
    from minibroker.broker.common import descriptors as d
    from minibroker.broker.common.config import DEFS

    text = DEFS["max.connections"].doc
    reserve = d.BASE_FDS + d.SEALED_OPEN
    assert f"({reserve}, plus {d.OUTGOING_PER_PEER} per other broker)" in text
    assert f"1/{d.HEADROOM_SHARE} of the rest (at least {d.MIN_HEADROOM})" in text
    assert "refused at start" in text
    budget = d.descriptor_budget(brokers=3, max_connections=-1, limit=4096)
    rest = 4096 - reserve - 2 * d.OUTGOING_PER_PEER
    assert budget.connections == rest - rest // d.HEADROOM_SHARE
    assert budget.connection_room(100) == budget.connections - 100
