"""deploy/kafka_probe.py: which failures are worth a Kafka probe, and what the probe accepts."""

from __future__ import annotations

import contextlib
import socket
import threading

from minibroker.client.connection import NOT_OUR_PROTOCOL
from minibroker.deploy.kafka_probe import failed_like_kafka, native_address, speaks_kafka
from minibroker.deploy.launcher import free_port


def test_only_a_closed_or_foreign_answer_is_probed():
    a = "127.0.0.1:9192"
    assert failed_like_kafka(f"no broker answered METADATA: {a} (closed the connection)", a)
    assert failed_like_kafka(f"cannot connect to {a}: {NOT_OUR_PROTOCOL} (bad response)", a)
    assert not failed_like_kafka(f"no broker answered METADATA: {a} (connection refused)", a)
    assert not failed_like_kafka(f"no broker answered METADATA: {a} (no answer in 2000 ms)", a)
    # Another address's failure says nothing about this one.
    other = "127.0.0.1:9193 (closed the connection)"
    assert not failed_like_kafka(f"no broker answered METADATA: {other}", a)


def test_the_native_address_is_the_kafka_port_minus_the_offset():
    assert native_address("127.0.0.1:9192") == "127.0.0.1:9092"


def serve(answer: bytes) -> tuple[socket.socket, int]:
    listener = socket.create_server(("127.0.0.1", free_port()))

    def run() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(answer)

    threading.Thread(target=run, daemon=True).start()
    return listener, listener.getsockname()[1]


def test_what_is_not_a_kafka_answer_is_not_kafka():
    assert not speaks_kafka("127.0.0.1", free_port())  # refused
    for answer in (b"", b"HTTP/1.1 400 Bad Request\r\n\r\n", b"\x00\x00\x00\x08garbage!"):
        listener, port = serve(answer)
        try:
            assert not speaks_kafka("127.0.0.1", port, timeout=2), answer
        finally:
            listener.close()
