"""The minibroker client: trio-native Producer, Consumer and Admin, plus a blocking facade.

Errors are the exceptions of ``protocol.errors``, named after Kafka's error codes
(``RequestTimedOut``, ``NotLeaderOrFollower``, ...), in ``client.errors``.
Importing this package never imports pyspark (the Spark source lives in its own module).
"""

from . import errors
from .accumulator import DeliveryHandle
from .admin import Admin, NewTopic, TopicDescription
from .cluster import BrokerInfo, PartitionInfo
from .config import DEFAULT_BOOTSTRAP, load_config
from .consumer import Consumer
from .offsets import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, OffsetAndTimestamp
from .partitioner import key_partition, murmur2
from .producer import BufferFull, Producer, ProducerClosed
from .records import ConsumerRecord, RecordMetadata, TopicPartition
from .sync import SyncAdmin, SyncConsumer, SyncDeliveryHandle, SyncProducer

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
