"""Topic and broker configs (issue 38 part 2) on a real 3-broker cluster: confluent-kafka's
and kafka-python's admin clients, the bundled Admin and `minibroker configs`, with each
value's source, INVALID_CONFIG naming the key, and the new values applied live."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from confluent_kafka.admin import ConfigSource as RdSource
from confluent_kafka.admin import NewTopic as RdNewTopic

from minibroker.client import AlterConfigOp, NewTopic
from minibroker.client import ConfigResource as MbResource
from minibroker.client.sync import SyncAdmin, SyncProducer
from minibroker.deploy.testing import DEFAULT_CONFIG, start_cluster
from minibroker.protocol.errors import ErrorCode, InvalidConfig, MessageTooLarge
from minibroker.protocol.kafka import KafkaApi, KafkaRequestHeader
from tests.integration.cluster_helpers import cli, rd_admin
from tests.integration.test_kafka_admin import ask
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    config = {**DEFAULT_CONFIG, "log.retention.check.interval.ms": 100}
    cluster = start_cluster(tmp_path_factory.mktemp("configs"), 3, config)
    yield cluster
    cluster.close()


def rd_topic(cluster, name: str) -> None:
    admin = rd_admin(cluster)  # kept: a destroyed handle fails its futures
    admin.create_topics([RdNewTopic(name, 1, 3)])[name].result(30)
    cluster.wait_for_leader(name)


def rd_set(admin, kind, name: str, **configs: str) -> dict:
    entries = [
        ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
        for k, v in configs.items()
    ]
    resource = ConfigResource(kind, name, incremental_configs=entries)
    return admin.incremental_alter_configs([resource])


def rd_describe(admin, kind, name: str) -> dict:
    [future] = admin.describe_configs([ConfigResource(kind, name)]).values()
    return future.result(30)


def mb_describe(cluster, kind: str, name: str, broker: str | None = None) -> dict:
    with SyncAdmin(cluster.bootstrap) as admin:
        resource = MbResource(kind, name)
        return admin.describe_configs([resource])[resource]


# --- topics -------------------------------------------------------------------------------


def test_confluent_kafka_alters_topic_configs_and_describe_shows_the_source(cluster):
    rd_topic(cluster, "rd-cfg")
    admin = rd_admin(cluster)
    for future in rd_set(admin, ResourceType.TOPIC, "rd-cfg", retention_ms="60000").values():
        assert future.result(30) is None
    cleanup = rd_set(admin, ResourceType.TOPIC, "rd-cfg", cleanup_policy="compact")
    [future] = cleanup.values()
    assert future.result(30) is None
    wait_until(  # any broker answers: it applies a change a moment after the commit
        lambda: (
            rd_describe(admin, ResourceType.TOPIC, "rd-cfg")["cleanup.policy"].value == "compact"
        ),
        30,
        "the change on the broker asked",
    )
    described = rd_describe(admin, ResourceType.TOPIC, "rd-cfg")
    assert described["retention.ms"].value == "60000"
    assert described["retention.ms"].source == RdSource.DYNAMIC_TOPIC_CONFIG.value
    assert described["cleanup.policy"].value == "compact"
    assert described["segment.bytes"].source == RdSource.DEFAULT_CONFIG.value
    # Bad input: INVALID_CONFIG naming the key; the topic keeps its configs.
    for bad in ({"retention_ms": "soon"}, {"no_such_key": "1"}, {"cleanup_policy": "shred"}):
        [future] = rd_set(admin, ResourceType.TOPIC, "rd-cfg", **bad).values()
        with pytest.raises(KafkaException) as refused:
            future.result(30)
        error = refused.value.args[0]
        assert error.code() == ErrorCode.INVALID_CONFIG
        assert next(iter(bad)).replace("_", ".") in error.str()
    assert rd_describe(admin, ResourceType.TOPIC, "rd-cfg")["retention.ms"].value == "60000"
    [future] = rd_set(admin, ResourceType.TOPIC, "rd-cfg-missing", retention_ms="1").values()
    with pytest.raises(KafkaException) as missing:
        future.result(30)
    assert missing.value.args[0].code() == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_kafka_python_alter_configs_replaces_and_describes(cluster):
    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    rd_topic(cluster, "kp-cfg")
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap.split(","))

    def resource(configs):
        return KpResource(ConfigResourceType.TOPIC, "kp-cfg", configs)

    def modified() -> dict:
        described = admin.describe_configs([resource(None)])  # filter: modified ones only
        return {k: v["value"] for k, v in described["topic"]["kp-cfg"].items()}

    try:
        two = {"retention.ms": "5000", "segment.ms": "9000"}
        assert admin.alter_configs([resource(two)], incremental=False) == {
            "topic": {"kp-cfg": "OK"}
        }
        # The answer comes once the controller committed; the broker asked next applies
        # the change a moment later (as a Kafka broker does): wait on it.
        wait_until(lambda: modified() == two, 30, "the alteration on the broker asked")
        # AlterConfigs replaces the whole set (kafka-python sends the other modified keys
        # along, so segment.ms stays; a bare AlterConfigs drops it: the next test).
        admin.alter_configs([resource({"retention.ms": "7000"})], incremental=False)
        wanted = {"retention.ms": "7000", "segment.ms": "9000"}
        wait_until(lambda: modified() == wanted, 30, "the second alteration")
        # IncrementalAlterConfigs sets one and keeps the rest.
        admin.alter_configs([resource({"segment.ms": "8000"})], incremental=True)
        wanted = {"retention.ms": "7000", "segment.ms": "8000"}
        wait_until(lambda: modified() == wanted, 30, "the incremental alteration")
        everything = admin.describe_configs([resource(None)], config_filter="all")
        entry = everything["topic"]["kp-cfg"]["segment.bytes"]
        assert entry["config_source"] == "DEFAULT_CONFIG" and entry["config_type"] == "LONG"
    finally:
        admin.close()


def test_alter_configs_replaces_the_whole_set_on_both_listeners(cluster):
    rd_topic(cluster, "raw-cfg")
    header = KafkaRequestHeader(KafkaApi.ALTER_CONFIGS, 1, 7, "raw")

    def alter(configs: dict) -> dict:
        resource = {
            "resource_type": 2,
            "resource_name": "raw-cfg",
            "configs": [{"name": k, "value": v} for k, v in configs.items()],
        }
        return ask(cluster, 0, header, {"resources": [resource], "validate_only": False})

    first = alter({"retention.ms": "5000", "segment.ms": "9000"})
    assert [r["error_code"] for r in first["responses"]] == [0]
    alter({"retention.ms": "7000"})
    wait_until(lambda: "segment.ms" not in dynamic(cluster, "raw-cfg"), 30, "segment.ms dropped")
    assert dynamic(cluster, "raw-cfg") == {"retention.ms": "7000"}
    with SyncAdmin(cluster.bootstrap) as admin:  # the bundled Admin's alter_configs: the same
        admin.alter_configs({MbResource("topic", "raw-cfg"): {"segment.ms": "1000"}})
    wait_until(lambda: dynamic(cluster, "raw-cfg") == {"segment.ms": "1000"}, 30, "replaced")


def dynamic(cluster, topic: str) -> dict:
    entries = mb_describe(cluster, "topic", topic)
    return {k: e.value for k, e in entries.items() if e.source == "DYNAMIC_TOPIC_CONFIG"}


def test_topic_configs_apply_live_to_produce_and_retention(cluster):
    with SyncAdmin(cluster.bootstrap) as admin, SyncProducer(cluster.bootstrap) as producer:
        admin.create_topics([NewTopic("mb-live", 1, 3)])
        producer.send("mb-live", b"x" * 5000)  # accepted under the default
        topic = MbResource("topic", "mb-live")
        admin.incremental_alter_configs({topic: [AlterConfigOp("max.message.bytes", "1000")]})
        # Every replica applies it as the metadata commits: the leader refuses at once
        # after its own broker has it; wait on the answer itself.

        def refused() -> bool:
            try:
                producer.send("mb-live", b"x" * 5000)
            except MessageTooLarge:
                return True
            return False

        wait_until(refused, 30, "a 5000-byte record refused under max.message.bytes=1000")
        # Tiny segments and a byte retention: old segments go at the next retention pass.
        admin.incremental_alter_configs(
            {
                topic: [
                    AlterConfigOp("max.message.bytes", None, "delete"),
                    AlterConfigOp("internal.segment.bytes", "200"),
                    AlterConfigOp("retention.bytes", "200"),
                ]
            }
        )
        wait_until(lambda: not refused(), 30, "5000 bytes accepted again once the key is deleted")
        for _ in range(20):
            producer.send("mb-live", b"y" * 100)

        def start_moved() -> bool:
            offsets = admin.list_offsets({("mb-live", 0): -2})
            return next(iter(offsets.values())).offset > 0

        wait_until(start_moved, 30, "retention.bytes=200 deleting old segments")


def test_bundled_admin_appends_to_and_subtracts_from_a_list_config(cluster):
    def policy() -> str | None:  # (any broker answers: it applies a change just after commit)
        return mb_describe(cluster, "topic", "mb-list")["cleanup.policy"].value

    with SyncAdmin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("mb-list", 1, 1)])
        topic = MbResource("topic", "mb-list")
        admin.incremental_alter_configs(
            {topic: [AlterConfigOp("cleanup.policy", "compact", "append")]}
        )
        wait_until(lambda: policy() == "compact", 30, "compact appended")
        admin.incremental_alter_configs(
            {topic: [AlterConfigOp("cleanup.policy", "delete", "append")]}
        )
        wait_until(lambda: policy() == "compact,delete", 30, "delete appended")
        admin.incremental_alter_configs(
            {topic: [AlterConfigOp("cleanup.policy", "compact", "subtract")]}
        )
        wait_until(lambda: policy() == "delete", 30, "compact subtracted")
        entry = mb_describe(cluster, "topic", "mb-list")["cleanup.policy"]
        assert (entry.value, entry.source) == ("delete", "DYNAMIC_TOPIC_CONFIG")
        with pytest.raises(InvalidConfig, match=r"retention\.ms"):
            admin.incremental_alter_configs({topic: [AlterConfigOp("retention.ms", "5", "append")]})
        assert admin.incremental_alter_configs(
            {topic: [AlterConfigOp("retention.ms", "5")]}, validate_only=True
        ) == {topic: None}
        assert (
            mb_describe(cluster, "topic", "mb-list")["retention.ms"].source
            != "DYNAMIC_TOPIC_CONFIG"
        )


# --- brokers ------------------------------------------------------------------------------


def test_broker_configs_layer_with_their_sources(cluster):
    admin = rd_admin(cluster)
    described = rd_describe(admin, ResourceType.BROKER, "1")
    assert described["faults.enable"].source == RdSource.STATIC_BROKER_CONFIG.value
    assert described["faults.enable"].is_read_only
    assert described["log.retention.ms"].source == RdSource.DEFAULT_CONFIG.value
    assert not described["log.retention.ms"].is_read_only
    # The cluster-wide default, then one broker's own value over it.
    # (librdkafka cannot name the default resource "": the bundled Admin does)
    with SyncAdmin(cluster.bootstrap) as mb:
        default = MbResource("broker", "")
        mb.incremental_alter_configs({default: [AlterConfigOp("log.retention.ms", "3600000")]})
    [future] = rd_set(admin, ResourceType.BROKER, "2", log_retention_ms="7200000").values()
    assert future.result(30) is None

    def sources() -> tuple:
        one = mb_describe(cluster, "broker", "1")["log.retention.ms"]
        two = mb_describe(cluster, "broker", "2")["log.retention.ms"]
        return (one.value, one.source, two.value, two.source)

    wait_until(
        lambda: (
            sources()
            == ("3600000", "DYNAMIC_DEFAULT_BROKER_CONFIG", "7200000", "DYNAMIC_BROKER_CONFIG")
        ),
        30,
        "every broker applying the dynamic configs",
    )
    default = mb_describe(cluster, "broker", "")
    assert {k: (e.value, e.source) for k, e in default.items()} == {
        "log.retention.ms": ("3600000", "DYNAMIC_DEFAULT_BROKER_CONFIG")
    }
    # A topic without its own retention inherits the new default.
    with SyncAdmin(cluster.bootstrap) as mb:
        mb.create_topics([NewTopic("mb-inherit", 1, 1)])
    wait_until(
        lambda: (
            mb_describe(cluster, "topic", "mb-inherit")["retention.ms"].source != "DEFAULT_CONFIG"
        ),
        30,
        "the inherited dynamic default",
    )
    entry = mb_describe(cluster, "topic", "mb-inherit")["retention.ms"]
    assert entry.value in ("3600000", "7200000") and entry.source.startswith("DYNAMIC_")
    # A setting that cannot change at runtime, or a bad value: INVALID_CONFIG naming it.
    for key, value in (("faults.enable", "false"), ("log.retention.ms", "x")):
        [future] = rd_set(
            admin, ResourceType.BROKER, "1", **{key.replace(".", "_"): value}
        ).values()
        with pytest.raises(KafkaException) as refused:
            future.result(30)
        assert refused.value.args[0].code() == ErrorCode.INVALID_CONFIG
        assert key in refused.value.args[0].str()
    with SyncAdmin(cluster.bootstrap) as mb:  # back to the static layer
        mb.incremental_alter_configs(
            {
                MbResource("broker", ""): [AlterConfigOp("log.retention.ms", None, "delete")],
                MbResource("broker", "2"): [AlterConfigOp("log.retention.ms", None, "delete")],
            }
        )
    wait_until(
        lambda: mb_describe(cluster, "broker", "2")["log.retention.ms"].source == "DEFAULT_CONFIG",
        30,
        "the dynamic layers removed",
    )


# --- the CLI ------------------------------------------------------------------------------


def test_cli_configs_alter_and_describe(cluster):
    rd_topic(cluster, "cli-cfg")
    at = ("--bootstrap", cluster.bootstrap)
    topic = ("--entity-type", "topics", "--entity-name", "cli-cfg")
    altered = cli(
        "configs", "alter", *topic, "--add-config", "retention.ms=1000,cleanup.policy=[compact,delete]", *at
    )  # fmt: skip
    assert altered.returncode == 0, altered.stderr
    assert "Completed updating config for topic cli-cfg." in altered.stdout
    wait_until(
        lambda: "retention.ms=1000" in cli("configs", "describe", *topic, *at).stdout,
        30,
        "the change on the broker asked",
    )
    described = cli("configs", "describe", *topic, *at)
    assert described.returncode == 0, described.stderr
    assert "  retention.ms=1000 (DYNAMIC_TOPIC_CONFIG)" in described.stdout
    assert "  cleanup.policy=compact,delete (DYNAMIC_TOPIC_CONFIG)" in described.stdout
    assert "segment.bytes" not in described.stdout  # only dynamic ones without --all
    assert "segment.bytes=" in cli("configs", "describe", *topic, "--all", *at).stdout
    deleted = cli("configs", "alter", *topic, "--delete-config", "retention.ms", *at)
    assert deleted.returncode == 0, deleted.stderr
    wait_until(
        lambda: "retention.ms" not in cli("configs", "describe", *topic, *at).stdout,
        30,
        "retention.ms deleted",
    )
    bad = cli("configs", "alter", *topic, "--add-config", "retention.ms=soon", *at)
    assert bad.returncode != 0 and "INVALID_CONFIG" in bad.stderr and "retention.ms" in bad.stderr
    assert "Traceback" not in bad.stderr
    brokers = ("--entity-type", "brokers", "--entity-default")
    assert (
        cli("configs", "alter", *brokers, "--add-config", "log.segment.ms=1", *at).returncode != 0
    )
    ok = cli("configs", "alter", *brokers, "--add-config", "log.roll.ms=86400000", *at)
    assert ok.returncode == 0, ok.stderr
    wait_until(
        lambda: "log.roll.ms" in cli("configs", "describe", *brokers, *at).stdout, 30, "log.roll.ms"
    )
    shown = cli("configs", "describe", *brokers, *at)
    assert "  log.roll.ms=86400000 (DYNAMIC_DEFAULT_BROKER_CONFIG)" in shown.stdout
    cli("configs", "alter", *brokers, "--delete-config", "log.roll.ms", *at)


# --- compression.type ---------------------------------------------------------------------


def stored_codec(cluster, topic: str) -> int:
    """The codec of the first batch the leader serves (a raw Kafka Fetch v4)."""
    from minibroker.protocol.kafka import records as kr

    header = KafkaRequestHeader(KafkaApi.FETCH, 4, 9, "codec-check")
    body = {
        "replica_id": -1,
        "max_wait_ms": 0,
        "min_bytes": 0,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "topics": [
            {
                "topic": topic,
                "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}],
            }
        ],
    }
    answer = ask(cluster, cluster.leader(topic), header, body)
    records = answer["responses"][0]["partitions"][0]["records"]
    return kr.unpack_header(records).compression


def test_compression_type_reencodes_a_stock_clients_batches(cluster):
    from confluent_kafka import Consumer, Producer

    from minibroker.protocol.kafka import records as kr

    admin = rd_admin(cluster)
    topic = RdNewTopic("rd-gzip", 1, 3, config={"compression.type": "gzip"})
    admin.create_topics([topic])["rd-gzip"].result(30)
    cluster.wait_for_leader("rd-gzip")
    producer = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "compression.type": "none"})
    for i in range(20):
        producer.produce("rd-gzip", b"value-%d" % i, partition=0)
    assert producer.flush(30) == 0
    assert stored_codec(cluster, "rd-gzip") == kr.GZIP
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": "rd-gzip",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe(["rd-gzip"])
        values: list[bytes] = []

        def read() -> bool:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value())
            return len(values) == 20

        wait_until(read, 60, "the 20 records", poll=0)
        assert values == [b"value-%d" % i for i in range(20)]
    finally:
        consumer.close()
    bad = rd_set(admin, ResourceType.TOPIC, "rd-gzip", compression_type="brotli")
    with pytest.raises(KafkaException) as refused:
        next(iter(bad.values())).result(30)
    assert refused.value.args[0].code() == ErrorCode.INVALID_CONFIG
