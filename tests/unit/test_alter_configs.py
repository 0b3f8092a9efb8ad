"""IncrementalAlterConfigs/AlterConfigs on the controller: Config records in one change,
INVALID_CONFIG naming the key, and the dynamic broker layers with their sources."""

from __future__ import annotations

from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.common.dynamic_config import DynamicBrokerConfig
from minibroker.broker.controller.configs import alter_configs
from minibroker.broker.metadata.config_view import describe_configs
from minibroker.broker.metadata.image import ClusterMetadata
from minibroker.broker.metadata.records import MetadataImage, encode_change
from minibroker.broker.raft import Entry
from minibroker.protocol.errors import ErrorCode
from tests.unit.test_preferred_leader import controller, metadata

SET, DELETE = 0, 1


def res(kind: int, name: str, *ops: tuple[str, int, str | None]) -> dict:
    return {
        "resource_type": kind,
        "resource_name": name,
        "configs": [{"name": n, "config_operation": op, "value": v} for n, op, v in ops],
    }


def codes(answer: dict) -> list[int]:
    return [r["error_code"] for r in answer["responses"]]


def test_topic_and_broker_changes_are_config_records_every_voter_applies():
    md = metadata([(0, [0, 1], [0, 1])])
    image = MetadataImage()
    image.metadata = md.copy()
    ctl, quorum = controller(md)
    answer = alter_configs(
        ctl,
        [
            res(2, "t", ("retention.ms", SET, "1000"), ("cleanup.policy", SET, "compact")),
            res(4, "", ("log.retention.ms", SET, "5000")),
            res(4, "1", ("min.insync.replicas", SET, "2")),
        ],
        validate_only=False,
        replace=False,
    )
    assert codes(answer) == [0, 0, 0]
    [records] = quorum.batches
    assert {r["type"] for r in records} == {"Config"}
    assert len(records) == 4
    image.apply(Entry(0, 1, encode_change(records)))
    assert image.metadata.topics["t"].configs == {
        "retention.ms": "1000",
        "cleanup.policy": "compact",
    }
    assert image.metadata.broker_configs == {
        "": {"log.retention.ms": "5000"},
        "1": {"min.insync.replicas": "2"},
    }
    # A snapshot keeps them.
    again = MetadataImage()
    again.restore(image.snapshot())
    assert again.metadata.broker_configs == image.metadata.broker_configs
    # Deleting the last key removes the broker's map; replace drops keys left out.
    alter_configs(ctl, [res(4, "1", ("min.insync.replicas", DELETE, None))], False, False)
    alter_configs(ctl, [res(2, "t", ("segment.ms", SET, "60000"))], False, True)
    for offset, batch in enumerate(quorum.batches[1:], start=1):
        image.apply(Entry(offset, 1, encode_change(batch)))
    assert "1" not in image.metadata.broker_configs
    assert image.metadata.topics["t"].configs == {"segment.ms": "60000"}


def test_bad_input_names_the_key_and_changes_nothing():
    ctl, quorum = controller(metadata([(0, [0, 1], [0, 1])]))
    cases = [
        (res(2, "t", ("retention.ms", SET, "soon")), ErrorCode.INVALID_CONFIG, "retention.ms"),
        (res(2, "t", ("nope.key", SET, "1")), ErrorCode.INVALID_CONFIG, "nope.key"),
        (res(2, "t", ("retention.ms", 2, "1")), ErrorCode.INVALID_CONFIG, "retention.ms"),
        (res(2, "gone", ("retention.ms", SET, "1")), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "gone"),
        (res(4, "0", ("broker.id.x", SET, "1")), ErrorCode.INVALID_CONFIG, "broker.id.x"),
        (res(4, "0", ("faults.enable", SET, "true")), ErrorCode.INVALID_CONFIG, "faults.enable"),
        (res(4, "x", ("log.retention.ms", SET, "1")), ErrorCode.INVALID_REQUEST, "broker id"),
        (res(2, "t", ("retention.ms", SET, "1"), ("retention.ms", SET, "2")), ErrorCode.INVALID_REQUEST, "duplicate"),
        (res(8, "t", ("retention.ms", SET, "1")), ErrorCode.INVALID_REQUEST, "resource type"),
    ]  # fmt: skip
    for resource, code, named in cases:
        [result] = alter_configs(ctl, [resource], False, False)["responses"]
        assert (result["error_code"], named in result["error_message"]) == (code, True), resource
    assert quorum.batches == []
    assert ctl.metadata.broker_configs == {}


def test_describe_shows_each_layer_as_its_source():
    static = BrokerConfig({"log.segment.bytes": 2_000_000, "faults.enable": True})
    config = DynamicBrokerConfig(static)
    changed = config.reconfigure({"log.retention.ms": "5000"}, {"log.roll.ms": "7000"})
    assert changed == {"log.retention.ms", "log.roll.ms"}
    assert config["log.retention.ms"] == 5000
    md = ClusterMetadata()
    md.topics = metadata([(0, [0], [0])]).topics
    md.topics["t"].configs = {"retention.ms": "100"}
    body = {
        "resources": [
            {"resource_type": 2, "resource_name": "t", "configuration_keys": None},
            {"resource_type": 4, "resource_name": "0", "configuration_keys": None},
            {"resource_type": 4, "resource_name": "1", "configuration_keys": None},
        ],
        "include_synonyms": True,
        "include_documentation": False,
    }
    topic, broker, other = describe_configs(body, md, config, 0)["results"]
    sources = {c["name"]: (c["value"], c["config_source"]) for c in topic["configs"]}
    assert sources["retention.ms"] == ("100", 1)  # DYNAMIC_TOPIC_CONFIG
    assert sources["segment.ms"] == ("7000", 2)  # inherited DYNAMIC_BROKER_CONFIG
    assert sources["segment.bytes"] == ("2000000", 4)  # STATIC_BROKER_CONFIG
    assert sources["delete.retention.ms"][1] == 5  # DEFAULT_CONFIG
    entries = {c["name"]: c for c in broker["configs"]}
    assert entries["log.retention.ms"]["config_source"] == 3  # DYNAMIC_DEFAULT_BROKER_CONFIG
    assert [s["source"] for s in entries["log.retention.ms"]["synonyms"]] == [3, 5]
    assert entries["faults.enable"]["read_only"] and not entries["log.roll.ms"]["read_only"]
    assert other["error_code"] == ErrorCode.INVALID_REQUEST
    # Going back to the static layer reports the keys that changed.
    assert config.reconfigure({}, {}) == {"log.retention.ms", "log.roll.ms"}
