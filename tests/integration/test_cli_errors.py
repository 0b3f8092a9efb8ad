"""The CLI's mistakes named as such, against a real broker: a Kafka port given as
--bootstrap, a missing topic or group, and the exit status each ends with."""

from __future__ import annotations

import pytest

from minibroker.deploy.cluster import KAFKA_PORT_OFFSET, ClusterState
from minibroker.deploy.launcher import free_port, free_port_range

from .test_cli_client import cli, one_error_line

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    """One broker laid out as `cluster up` lays it out: its Kafka listener on the native
    port + KAFKA_PORT_OFFSET."""
    base = free_port_range(KAFKA_PORT_OFFSET + 1)
    state = ClusterState(
        tmp_path_factory.mktemp("cli-errors"), base, 1, {}, kafka_base_port=base + KAFKA_PORT_OFFSET
    )
    state.start_all()
    yield state
    state.stop_all()


def test_a_kafka_listener_given_as_bootstrap_is_named_with_the_native_address(state):
    kafka = f"{state.host}:{state.kafka_base_port}"
    native = f"{state.host}:{state.base_port}"
    for command in (("topics", "list"), ("groups", "list"), ("consume", "t", "--group", "g")):
        result = cli(*command, "--bootstrap", kafka)
        line = one_error_line(result)
        assert line == (
            f"error: {kafka} speaks Kafka's protocol: that is the Kafka listener; "
            f"use --bootstrap {native}"
        ), command
        assert "is the cluster running" not in line
        assert result.returncode == 2, command
    # The suggestion works as printed.
    assert cli("topics", "list", "--bootstrap", native).returncode == 0


def test_a_kafka_listener_among_others_is_replaced_in_the_suggested_bootstrap(state):
    kafka = f"{state.host}:{state.kafka_base_port}"
    refused = f"127.0.0.1:{free_port() + KAFKA_PORT_OFFSET}"
    result = cli("topics", "list", "--bootstrap", f"{refused},{kafka}")
    line = one_error_line(result)
    assert line.endswith(f"use --bootstrap {refused},{state.host}:{state.base_port}"), line
    assert line.startswith(f"error: {kafka} speaks Kafka's protocol"), line


def test_a_refused_port_is_not_probed_as_kafka(state):
    port = free_port()
    line = one_error_line(cli("topics", "list", "--bootstrap", f"127.0.0.1:{port}"))
    assert "Kafka" not in line and "is the cluster running?" in line


def test_describing_a_missing_topic_says_so_once(state):
    result = cli("topics", "describe", "nosuch", "--bootstrap", state.bootstrap)
    line = one_error_line(result)
    assert line.count("does not exist") == 1, line
    assert line == (
        "error: UNKNOWN_TOPIC_OR_PARTITION: topic 'nosuch' does not exist: "
        "create it with 'minibroker topics create nosuch'"
    )
    assert result.returncode == 1


def test_describing_a_group_that_does_not_exist_is_group_id_not_found(state):
    result = cli("groups", "describe", "nosuchgroup", "--bootstrap", state.bootstrap)
    line = one_error_line(result)
    assert line.startswith("error: GROUP_ID_NOT_FOUND: group 'nosuchgroup' does not exist"), line
    assert result.stdout == "" and result.returncode == 1
    # A group that has committed offsets (Empty, no members) is still described.
    bootstrap = ("--bootstrap", state.bootstrap)
    assert cli("topics", "create", "described", "--partitions", "1", *bootstrap).returncode == 0
    assert cli("produce", "described", *bootstrap, stdin="a\n").returncode == 0
    consumed = cli(
        "consume", "described", "--group", "seen", "--from-beginning", "--max-messages", "1",
        *bootstrap,
    )  # fmt: skip
    assert consumed.returncode == 0 and consumed.stdout == "a\n", consumed.stderr
    described = cli("groups", "describe", "seen", *bootstrap)
    assert described.returncode == 0, described.stderr
    assert "STATE Empty" in described.stdout and "described" in described.stdout


NOTICE = "rebalance waits group.initial.rebalance.delay.ms"


def consume_one(bootstrap: str, topic: str, group: str):
    return cli(
        "consume", topic, "--group", group, "--from-beginning", "--max-messages", "1",
        "--bootstrap", bootstrap,
    )  # fmt: skip


def test_a_new_groups_first_rebalance_delay_is_explained_once(state):
    """The broker's default delay (3 s) holds up a new group's first assignment."""
    bootstrap = ("--bootstrap", state.bootstrap)
    assert cli("topics", "create", "waited", "--partitions", "1", *bootstrap).returncode == 0
    assert cli("produce", "waited", *bootstrap, stdin="a\n").returncode == 0
    result = consume_one(state.bootstrap, "waited", "newgroup")
    assert result.returncode == 0 and result.stdout == "a\n", result.stderr
    notices = [line for line in result.stderr.splitlines() if NOTICE in line]
    assert len(notices) == 1, result.stderr
    assert "group 'newgroup'" in notices[0]


def test_no_notice_when_the_assignment_comes_at_once(broker_factory):
    broker = broker_factory({"group.initial.rebalance.delay.ms": 0}).address
    assert cli("topics", "create", "prompt", "--bootstrap", broker).returncode == 0
    assert cli("produce", "prompt", "--bootstrap", broker, stdin="a\n").returncode == 0
    result = consume_one(broker, "prompt", "quick")
    assert result.returncode == 0 and result.stdout == "a\n", result.stderr
    assert NOTICE not in result.stderr
    assert result.stderr.strip() == "Processed a total of 1 messages"
