"""The minibroker client: trio-native Producer, Consumer and Admin, plus a blocking facade.

Errors are the exceptions of ``protocol.errors``, named after Kafka's error codes
(``RequestTimedOut``, ``NotLeaderOrFollower``, ...), in ``client.errors``.
Importing this package never imports pyspark (the Spark source lives in its own module).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and editors see; at run time, __getattr__ below
    from minibroker.client import errors
    from minibroker.client.accumulator import DeliveryHandle
    from minibroker.client.admin import (
        Admin,
        AlterConfigOp,
        ConfigEntry,
        ConfigResource,
        NewPartitions,
        NewTopic,
        TopicDescription,
    )
    from minibroker.client.cluster import BrokerInfo, PartitionInfo
    from minibroker.client.config import DEFAULT_BOOTSTRAP, load_config
    from minibroker.client.consumer import Consumer
    from minibroker.client.offsets import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, OffsetAndTimestamp
    from minibroker.client.partitioner import key_partition, murmur2
    from minibroker.client.producer import BufferFull, Producer, ProducerClosed
    from minibroker.client.records import (
        ConsumerRecord,
        ProducerRecord,
        RecordMetadata,
        TopicPartition,
    )
    from minibroker.client.sync import SyncAdmin, SyncConsumer, SyncDeliveryHandle, SyncProducer
    from minibroker.client.transactions import ConsumerGroupMetadata
    from minibroker.client.txn_state import IllegalTransactionState, TransactionAborted

# Re-exported lazily (PEP 562), as minibroker.broker's are: importing one light module
# (``minibroker.client.config`` for a default in a --help text, ``client.records``) must
# not import trio and every client class, ~0.17 s of CPU for each `minibroker` command.
_PUBLIC = {
    "errors": "minibroker.client.errors",
    "DeliveryHandle": "minibroker.client.accumulator",
    "Admin": "minibroker.client.admin",
    "NewTopic": "minibroker.client.admin",
    "NewPartitions": "minibroker.client.admin",
    "AlterConfigOp": "minibroker.client.admin",
    "ConfigEntry": "minibroker.client.admin",
    "ConfigResource": "minibroker.client.admin",
    "TopicDescription": "minibroker.client.admin",
    "BrokerInfo": "minibroker.client.cluster",
    "PartitionInfo": "minibroker.client.cluster",
    "DEFAULT_BOOTSTRAP": "minibroker.client.config",
    "load_config": "minibroker.client.config",
    "Consumer": "minibroker.client.consumer",
    "EARLIEST_TIMESTAMP": "minibroker.client.offsets",
    "LATEST_TIMESTAMP": "minibroker.client.offsets",
    "OffsetAndTimestamp": "minibroker.client.offsets",
    "key_partition": "minibroker.client.partitioner",
    "murmur2": "minibroker.client.partitioner",
    "BufferFull": "minibroker.client.producer",
    "Producer": "minibroker.client.producer",
    "ProducerClosed": "minibroker.client.producer",
    "ConsumerRecord": "minibroker.client.records",
    "ProducerRecord": "minibroker.client.records",
    "RecordMetadata": "minibroker.client.records",
    "TopicPartition": "minibroker.client.records",
    "SyncAdmin": "minibroker.client.sync",
    "SyncConsumer": "minibroker.client.sync",
    "SyncDeliveryHandle": "minibroker.client.sync",
    "SyncProducer": "minibroker.client.sync",
    "ConsumerGroupMetadata": "minibroker.client.transactions",
    "IllegalTransactionState": "minibroker.client.txn_state",
    "TransactionAborted": "minibroker.client.txn_state",
}

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "Admin",
    "AlterConfigOp",
    "BrokerInfo",
    "BufferFull",
    "ConfigEntry",
    "ConfigResource",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "DeliveryHandle",
    "IllegalTransactionState",
    "NewPartitions",
    "NewTopic",
    "OffsetAndTimestamp",
    "PartitionInfo",
    "Producer",
    "ProducerClosed",
    "ProducerRecord",
    "RecordMetadata",
    "SyncAdmin",
    "SyncConsumer",
    "SyncDeliveryHandle",
    "SyncProducer",
    "TopicDescription",
    "TopicPartition",
    "TransactionAborted",
    "errors",
    "key_partition",
    "load_config",
    "murmur2",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name == "errors":  # a submodule, not a name in one
        return importlib.import_module(module)
    return getattr(importlib.import_module(module), name)
