"""Kafka's own wire protocol, for the Kafka listener: stock clients (librdkafka, the Java
client, kafka-python, aiokafka) speak it. Sans-IO like the rest of protocol/.

``messages`` compiles bodies from Kafka's JSON message specs (``specs/``, vendored from
apache/kafka under the Apache License 2.0), ``codec`` adds the request and response
headers, ``records`` is the v2 record batch.
"""

from minibroker.protocol.kafka.codec import (
    SUPPORTED,
    KafkaApi,
    KafkaRequestHeader,
    KafkaUnsupported,
    api_versions_body,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    unsupported_response,
)
from minibroker.protocol.kafka.messages import KafkaDecodeError, message_codec

__all__ = [
    "SUPPORTED",
    "KafkaApi",
    "KafkaDecodeError",
    "KafkaRequestHeader",
    "KafkaUnsupported",
    "api_versions_body",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "message_codec",
    "unsupported_response",
]
