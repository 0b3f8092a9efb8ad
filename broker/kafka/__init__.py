"""The Kafka listener (``kafka.listener``): stock Kafka clients on the same partitions,
purgatories and replication as our own protocol. ``handler`` translates each Kafka API
onto the native one, ``batches`` moves record batches across, ``listener`` is the codec
the shared connection handler serves it with."""

from minibroker.broker.kafka.handler import KafkaRequestHandler
from minibroker.broker.kafka.listener import KafkaCodec

__all__ = ["KafkaCodec", "KafkaRequestHandler"]
