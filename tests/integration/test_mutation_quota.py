"""controller_mutation_rate (KIP-599) with stock admin clients on a real broker: kafka-python
asks CreatePartitions v3 / DeleteTopics v6 (strict: THROTTLING_QUOTA_EXCEEDED once the
bucket is in debt), librdkafka CreatePartitions v1 (permissive: done, then throttled)."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions
from kafka.admin import KafkaAdminClient

from minibroker.broker.storage.partition_metadata import read_topic_id
from minibroker.client import NewTopic, SyncAdmin
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol.errors import ErrorCode, ThrottlingQuotaExceeded
from tests.integration.cluster_helpers import cli
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

RATE = 2  # partitions/s; Kafka's 11 windows of 1 s: a full bucket holds 22


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("mutation-quota"), 1, DEFAULT_CONFIG)
    yield cluster
    cluster.close()


def limit(cluster, client_id: str) -> None:
    done = cli(
        "configs", "alter", "--entity-type", "clients", "--entity-name", client_id,
        "--add-config", f"controller_mutation_rate={RATE}", "--bootstrap", cluster.bootstrap,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def partitions(cluster, topic: str) -> int:
    with SyncAdmin(cluster.bootstrap) as admin:
        return len(admin.describe_topics([topic])[topic].partitions)


def test_kafka_python_is_refused_with_throttling_quota_exceeded_once_in_debt(cluster):
    limit(cluster, "strict")
    with SyncAdmin(cluster.bootstrap) as admin:  # another client id: not counted
        admin.create_topics([NewTopic("grow", 1, 1), NewTopic("gone", 5, 1)])
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap, client_id="strict")
    try:
        # 29 partitions from a full bucket of 22: accepted (the bucket was not in debt),
        # and the bucket is now 7 below zero, 3.5 s of refill at 2/s.
        grown = admin.create_partitions({"grow": 30}, raise_errors=False)
        assert [r.error_code for r in grown.results] == [0]
        refused = admin.create_partitions({"grow": 31}, raise_errors=False)
        assert [r.error_code for r in refused.results] == [ErrorCode.THROTTLING_QUOTA_EXCEEDED]
        assert refused.results[0].error_message == "The throttling quota has been exceeded."
        assert 1000 < refused.throttle_time_ms <= 3500
    finally:
        admin.close()  # it waits out the throttle on that connection (KIP-219)
    # The bucket is the client id's: another connection of it is refused as well.
    again = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap, client_id="strict")
    try:
        deleted = again.delete_topics(["gone"], raise_errors=False)  # a dict, no throttle
        assert [(t["name"], t["error_code"]) for t in deleted["topics"]] == [
            ("gone", ErrorCode.THROTTLING_QUOTA_EXCEEDED)
        ]
    finally:
        again.close()
    # A stock admin's answer comes when the controller commits; the broker's metadata
    # follows (Kafka's too): wait for the growth, then it stays (31 never reached it).
    wait_until(lambda: partitions(cluster, "grow") == 30, 30, "the growth to 30 partitions")
    assert partitions(cluster, "gone") == 5


def test_librdkafka_old_version_is_served_then_throttled(cluster):
    limit(cluster, "permissive")
    with SyncAdmin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("wide", 1, 1)])
    throttles: list[float] = []
    admin = AdminClient(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "client.id": "permissive",
            "throttle_cb": lambda event: throttles.append(event.throttle_time),
        }
    )
    # CreatePartitions v1 (librdkafka's newest): beyond the bucket and accepted all the same,
    # twice; the answers carry the throttle instead.
    for total in (30, 40):
        admin.create_partitions([NewPartitions("wide", total)])["wide"].result(30)
        admin.poll(0)
    wait_until(lambda: partitions(cluster, "wide") == 40, 30, "the growth to 40 partitions")
    admin.poll(1)
    assert throttles and max(throttles) > 1.0  # seconds: 17 partitions in debt at 2/s


def test_kafka_python_create_topics_v7_answers_counts_configs_id_then_is_throttled(cluster):
    limit(cluster, "creator")
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap, client_id="creator")
    try:
        # 25 partitions from a full bucket of 22: created (the bucket was not in debt).
        made = admin.create_topics(
            {"made": {"num_partitions": 25, "replication_factor": 1,
                      "configs": {"retention.ms": "60000"}}},
            raise_errors=False,
        )  # fmt: skip
        [result] = made["topics"]
        assert (result["name"], result["error_code"]) == ("made", 0)
        assert (result["num_partitions"], result["replication_factor"]) == (25, 1)
        configs = result["configs"]  # kafka-python: by name, sources by name
        assert configs["retention.ms"]["value"] == "60000"
        assert configs["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        assert configs["cleanup.policy"]["config_source"] == "DEFAULT_CONFIG"
        # The id the broker wrote into the new partition's directory (partition.metadata).
        wait_until(lambda: list(cluster.data_dir.glob("**/made-0/partition.metadata")), 30,
                   "the partition's directory")  # fmt: skip
        [directory] = [p.parent for p in cluster.data_dir.glob("**/made-0/partition.metadata")]
        assert uuid.UUID(result["topic_id"]).hex == read_topic_id(directory)
        # 3 below zero now: the next topic is refused and never created.
        refused = admin.create_topics(
            {"refused": {"num_partitions": 1, "replication_factor": 1}}, raise_errors=False
        )
        [result] = refused["topics"]
        assert result["error_code"] == ErrorCode.THROTTLING_QUOTA_EXCEEDED
        assert (result["num_partitions"], result.get("configs")) == (-1, None)  # null: absent
        assert result["topic_id"] is None  # the zero uuid: nothing was created
    finally:
        admin.close()
    with SyncAdmin(cluster.bootstrap) as native:
        assert "refused" not in native.list_topics()


def test_the_bundled_admin_is_refused_over_its_quota_on_the_native_listener(cluster):
    limit(cluster, "native")
    with SyncAdmin(cluster.bootstrap) as other:  # another client id: its own quota
        other.create_topics([NewTopic("native-kept", 1, 1)])
    with SyncAdmin(cluster.bootstrap, {"client.id": "native"}) as admin:
        # 25 partitions from a full bucket of 22: created; the bucket is 3 below zero and
        # the next topic of the same request is refused.
        outcome = admin.create_topics(
            [NewTopic("native-big", 25, 1), NewTopic("native-small", 1, 1)],
            raise_errors=False,
            retry_on_quota_violation=False,
        )
        assert outcome["native-big"] is None
        assert type(outcome["native-small"]) is ThrottlingQuotaExceeded
        # The client waits out the answer's throttle (1.5 s): the bucket is back at zero,
        # the 25 partitions' deletion goes through and the next topic is refused.
        deleted = admin.delete_topics(
            ["native-big", "native-kept"], raise_errors=False, retry_on_quota_violation=False
        )
        assert deleted["native-big"] is None
        assert type(deleted["native-kept"]) is ThrottlingQuotaExceeded

    def native_topics() -> set[str]:
        with SyncAdmin(cluster.bootstrap) as other:
            return {t for t in other.list_topics() if t.startswith("native")}

    wait_until(lambda: native_topics() == {"native-kept"}, 30, "native-big deleted")


def test_the_bundled_admin_sends_a_refused_topic_again_once_its_throttle_has_passed(cluster):
    limit(cluster, "paced")
    with SyncAdmin(cluster.bootstrap, {"client.id": "paced"}) as admin:
        # 25 partitions from a full bucket of 22: the second topic is refused with a 1.5 s
        # throttle; by default it goes again after it, when the bucket is out of debt.
        started = time.monotonic()
        outcome = admin.create_topics([NewTopic("paced-big", 25, 1), NewTopic("paced-small", 1, 1)])
        assert outcome == {"paced-big": None, "paced-small": None}
        assert time.monotonic() - started >= 1.0  # after the throttle, not at once
        assert partitions(cluster, "paced-small") == 1


def test_a_refusal_whose_throttle_outlasts_the_timeout_is_returned(cluster):
    limit(cluster, "hurried")
    with SyncAdmin(cluster.bootstrap, {"client.id": "hurried"}) as admin:
        # The refusal's 1.5 s throttle ends after the call's 1 s: Kafka's Admin gives up
        # with the refusal itself, not a timeout.
        outcome = admin.create_topics(
            [NewTopic("hurried-big", 25, 1), NewTopic("hurried-small", 1, 1)],
            timeout_ms=1000,
            raise_errors=False,
        )
        assert outcome["hurried-big"] is None
        assert type(outcome["hurried-small"]) is ThrottlingQuotaExceeded
        assert "hurried-small" not in admin.list_topics()


def test_the_cli_says_in_one_line_what_to_do_when_refused(cluster):
    limit(cluster, "cli-creator")
    as_client = ["--property", "client.id=cli-creator", "--bootstrap", cluster.bootstrap]
    made = cli("topics", "create", "cli-big", "--partitions", "25", *as_client)
    assert made.returncode == 0, made.stderr
    # A new process, a new connection: nothing waited out the debt of 3 partitions.
    refused = cli("topics", "create", "cli-small", "--partitions", "1", *as_client)
    assert refused.returncode != 0
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("error: THROTTLING_QUOTA_EXCEEDED: this client id's")
    assert "controller_mutation_rate" in line and "try again" in line
