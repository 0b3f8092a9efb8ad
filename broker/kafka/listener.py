"""The Kafka listener's codec: what the shared connection handler asks of a protocol.

broker/network/socket_server.py serves this listener's connections on the same path as
ours (limits, reactor, backpressure, parked answers, metrics); this object only turns a
frame into ``(header, body)``, names the dispatcher, and encodes answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minibroker.broker.common.config import BrokerConfig, ConfigError
from minibroker.protocol.kafka import (
    KafkaApi,
    KafkaRequestHeader,
    KafkaUnsupported,
    decode_request,
    encode_response,
    unsupported_response,
)


def kafka_listener(config: BrokerConfig) -> tuple[str, int] | None:
    """``kafka.listener`` as (host, port), None when off; ConfigError when malformed."""
    text = config["kafka.listener"].strip()
    if not text:
        return None
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"kafka.listener: expected host:port, got {text!r}")
    return host, int(port)


# A request's first two bytes are its api key (int16, big-endian).
_PRODUCE_KEY = int(KafkaApi.PRODUCE).to_bytes(2, "big")


class KafkaCodec:
    __slots__ = ("dispatcher",)

    def __init__(self, dispatcher: Any) -> None:
        self.dispatcher = dispatcher

    def decode(self, payload: bytes) -> tuple[KafkaRequestHeader, dict]:
        """Raises ProtocolError to close the connection; an unsupported API or version
        carries its UNSUPPORTED_VERSION answer instead (``answer``)."""
        try:
            return decode_request(payload)
        except KafkaUnsupported as exc:
            exc.answer = unsupported_response(exc.header)
            raise

    @staticmethod
    def overtakes(payload: bytes) -> bool:
        """May this request be dispatched while an earlier one on its connection is still
        parked (its answer still goes after the earlier one's)? A Produce may: appending
        it early changes nothing a client can see (Kafka appends it once the earlier one
        is answered; its records land after the earlier request's either way), and a
        client's pipelined acks=all produces then share one replication round instead of
        waiting one round each. Anything else (a Metadata after CreateTopics, a Fetch)
        may depend on what the parked request does, and waits as in Kafka."""
        return payload[:2] == _PRODUCE_KEY

    @staticmethod
    def packer(header: KafkaRequestHeader) -> Callable[[int, dict], bytes]:
        return lambda _correlation_id, body: encode_response(header, body)
