"""Was that a Kafka listener? The CLI's answer to `--bootstrap` given a Kafka port.

A broker's Kafka listener (cluster up: the native port + KAFKA_PORT_OFFSET) closes the
connection on minibroker's msgpack frame, so the client can only say "closed the
connection: is the cluster running?" -- wrong, since it is. When a bootstrap address
failed that way, one Kafka ApiVersions v0 request (the request every Kafka client opens
with, in Kafka's own codec) tells a Kafka listener from anything else, and the CLI
names the mistake and the native address to use instead.

Blocking sockets, on the error path only: the command has failed already, trio's loop
is over, and one loopback round trip costs ~1 ms.
"""

from __future__ import annotations

import socket
import struct

from minibroker.client.connection import CLOSED_BY_PEER, CONNECTION_BROKE, NOT_OUR_PROTOCOL
from minibroker.deploy.cluster import KAFKA_PORT_OFFSET
from minibroker.protocol.errors import ProtocolError
from minibroker.protocol.kafka import KafkaApi, KafkaRequestHeader, decode_response, encode_request

# How a Kafka listener answers a minibroker frame, in the words client.connection uses:
# it closes the connection (the frame is not a Kafka request), or it answers with bytes
# that are not our response. "connection refused" or "no answer" are something else.
KAFKA_LIKE_FAILURES = (CLOSED_BY_PEER, CONNECTION_BROKE, NOT_OUR_PROTOCOL)
PROBE_TIMEOUT_S = 1.0
_SIZE = struct.Struct(">i")
_MAX_ANSWER = 1 << 20  # an ApiVersions answer is a few hundred bytes


def failed_like_kafka(message: str, address: str) -> bool:
    """``message`` (the client's error listing what happened to each address) says that
    ``address`` closed the connection or answered in another protocol."""
    return any(
        f"{address} ({reason}" in message or f"{address}: {reason}" in message
        for reason in KAFKA_LIKE_FAILURES
    )


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed before a whole answer")
        data += chunk
    return bytes(data)


def speaks_kafka(host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True when ``host:port`` answers a Kafka ApiVersions v0 request with a readable,
    error-free ApiVersions response."""
    header = KafkaRequestHeader(KafkaApi.API_VERSIONS, 0, 1, "minibroker-cli-probe")
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(encode_request(header, {}))
            (size,) = _SIZE.unpack(_read_exactly(sock, _SIZE.size))
            if not 4 <= size <= _MAX_ANSWER:
                return False
            answer = decode_response(header, _read_exactly(sock, size))
    except (OSError, ProtocolError, ValueError, IndexError, struct.error):
        return False
    return answer.get("error_code") == 0 and bool(answer.get("api_keys"))


def native_address(address: str) -> str:
    """The native listener beside the Kafka listener ``address`` in a `cluster up` cluster."""
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) - KAFKA_PORT_OFFSET}"


def kafka_listener_hint(message: str, bootstrap: str) -> str | None:
    """One line naming the bootstrap addresses that are Kafka listeners and the
    --bootstrap to use instead; None when none failed like one or none speaks Kafka."""
    addresses = [a.strip() for a in bootstrap.split(",") if a.strip()]
    kafka = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not port.isdigit() or int(port) <= KAFKA_PORT_OFFSET:
            continue
        if failed_like_kafka(message, address) and speaks_kafka(host or "127.0.0.1", int(port)):
            kafka.append(address)
    if not kafka:
        return None
    fixed = ",".join(native_address(a) if a in kafka else a for a in addresses)
    if len(kafka) == 1:
        return (
            f"{kafka[0]} speaks Kafka's protocol: that is the Kafka listener; "
            f"use --bootstrap {fixed}"
        )
    return (
        f"{','.join(kafka)} speak Kafka's protocol: those are Kafka listeners; "
        f"use --bootstrap {fixed}"
    )
