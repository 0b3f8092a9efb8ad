"""The minibroker client: trio-native Producer, Consumer and Admin, plus a blocking facade.

Errors are the exceptions of ``protocol.errors``, named after Kafka's error codes
(``RequestTimedOut``, ``NotLeaderOrFollower``, ...), in ``client.errors``.
Importing this package never imports pyspark (the Spark source lives in its own module).
"""

from minibroker.client import errors
from minibroker.client.accumulator import DeliveryHandle
from minibroker.client.admin import Admin, NewTopic, TopicDescription
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

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "Admin",
    "BrokerInfo",
    "BufferFull",
    "Consumer",
    "ConsumerRecord",
    "DeliveryHandle",
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
    "errors",
    "key_partition",
    "load_config",
    "murmur2",
]
