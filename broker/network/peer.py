"""Broker-to-broker RPC: one request at a time over a lazily (re)opened connection.

Replica fetchers and controller pushes talk to other brokers with this. (The broker
never imports ``client``; this is the small part of a client a broker needs.)
Every failure surfaces as ``NetworkException`` naming the peer; correlation ids, framing
and the rule for a top-level error are protocol.connection's (shared with the client). With cluster
credentials, each new connection first proves membership (and checks the peer's proof)
before it carries any request, so every broker-to-broker link is authenticated.
"""

from __future__ import annotations

import hmac
import os
from typing import Any

import trio

from minibroker.broker.network.cluster_auth import (
    MECHANISM,
    ClusterCredentials,
    client_transcript,
    new_nonce,
    proof,
)
from minibroker.protocol import DEFAULT_MAX_FRAME_BYTES, ApiKey, ProtocolError, api_name, raise_for
from minibroker.protocol.connection import Connection, check_error
from minibroker.protocol.errors import (
    ClusterAuthorizationFailed,
    KafkaError,
    NetworkException,
    SaslAuthenticationFailed,
)

_REFUSALS = (SaslAuthenticationFailed, ClusterAuthorizationFailed)


def log_peer_failure(log: Any, event: str, exc: KafkaError) -> None:
    """A peer down or paused is routine (debug: the caller retries); a refusal (wrong
    secret, not authorized) will not heal by retrying, so it is a warning."""
    (log.warning if isinstance(exc, _REFUSALS) else log.debug)(event, error=str(exc))


class PeerConnection:
    def __init__(
        self,
        host: str,
        port: int,
        client_id: str,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        *,
        credentials: ClusterCredentials | None = None,
        peer_id: int | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self.max_frame_bytes = max_frame_bytes
        self.credentials = credentials
        # The broker id we expect to answer; its proof must be for that id.
        self.peer_id = peer_id
        self._stream: trio.SocketStream | None = None
        self._fd = -1  # the stream's socket, written directly (see _exchange)
        self._conn = Connection(client_id, max_frame_bytes)
        self._lock = trio.Lock()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        self._fd = -1
        self._conn = Connection(self.client_id, self.max_frame_bytes)
        if stream is not None:
            await stream.aclose()

    async def request(self, api_key: int, body: dict, *, timeout: float, version: int = 0) -> dict:
        """Send one request and return its validated body; a top-level error raises its
        class (protocol.connection.check_error has the rule)."""
        # The lock is nearly always free (a leader link's connection is its own): taken
        # without trio.Lock's scheduler pass, which was one of the follower's per-round
        # costs (bench produce at --throughput 50000: ~480 rounds a follower per 200,000
        # records). The round trip still waits for its answer, so the call checkpoints.
        lock = self._lock
        if lock.locked():
            await lock.acquire()
        else:
            lock.acquire_nowait()
        try:
            try:
                with trio.fail_after(timeout):
                    body = await self._round_trip(api_key, version, body)
            except KafkaError:
                raise  # a refusal while authenticating (the stream is already reset)
            except trio.TooSlowError:
                await self._reset()
                raise NetworkException(
                    f"{api_name(api_key)} to {self.address} timed out after {timeout}s"
                ) from None
            except (
                OSError,
                trio.BrokenResourceError,
                trio.ClosedResourceError,
                ProtocolError,
            ) as exc:
                await self._reset()
                raise NetworkException(
                    f"{api_name(api_key)} to {self.address} failed: {exc}"
                ) from None
            except BaseException:
                # Cancelled midway (a fetcher stopped, a round called back): the answer is
                # still on its way, and no later request may read it as its own.
                await self._reset()
                raise
        finally:
            lock.release()
        return check_error(api_key, body)

    async def _reset(self) -> None:
        stream, self._stream = self._stream, None
        self._fd = -1
        self._conn = Connection(self.client_id, self.max_frame_bytes)
        if stream is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _round_trip(self, api_key: int, version: int, body: dict) -> dict:
        if self._stream is None:
            self._stream = await trio.open_tcp_stream(self.host, self.port)
            self._fd = self._stream.socket.fileno()
            if self.credentials is not None:
                try:
                    await self._authenticate(self.credentials)
                except BaseException:
                    # Never leave an unauthenticated stream behind for the next request.
                    await self._reset()
                    raise
        return await self._exchange(api_key, version, body)

    async def _authenticate(self, creds: ClusterCredentials) -> None:
        """Prove membership, and check the peer's proof, before the first request."""
        client_nonce = new_nonce()
        hello = await self._exchange(
            ApiKey.SASL_HANDSHAKE,
            0,
            {
                "mechanism": MECHANISM,
                "broker_id": creds.broker_id,
                "cluster_id": creds.cluster_id,
                "client_nonce": client_nonce,
            },
        )
        self._check(hello)
        server_id = hello["broker_id"]
        if self.peer_id is not None and server_id != self.peer_id:
            raise SaslAuthenticationFailed(
                f"{self.address} is broker {server_id}, expected broker {self.peer_id}"
            )
        transcript = client_transcript(creds, server_id, client_nonce, hello["server_nonce"])
        done = await self._exchange(
            ApiKey.SASL_AUTHENTICATE, 0, {"auth_bytes": proof(creds.secret, "client", transcript)}
        )
        self._check(done)
        if not hmac.compare_digest(done["auth_bytes"], proof(creds.secret, "server", transcript)):
            raise SaslAuthenticationFailed(f"{self.address} did not prove cluster membership")

    def _check(self, body: dict) -> None:
        if body["error_code"]:
            message = body.get("error_message") or ""
            raise_for(body["error_code"], f"authenticating to {self.address}: {message}")

    async def _exchange(self, api_key: int, version: int, body: dict) -> dict:
        """One round trip; the body unchecked for a top-level error (the caller decides)."""
        _, frame = self._conn.send_request(api_key, body, version)
        # A request nearly always fits the socket buffer: one write(2), without trio's
        # send machinery (a conflict detector, error translation, a scheduler pass after
        # the send), as the broker's Outbox writes its answers. What does not fit (or an
        # EAGAIN) goes the trio way; a dead peer raises OSError, which request() handles.
        try:
            sent = os.write(self._fd, frame)
        except BlockingIOError:
            sent = 0
        if sent < len(frame):
            await self._stream.send_all(memoryview(frame)[sent:])
        while True:
            data = await self._stream.receive_some(1 << 20)
            if not data:
                raise ProtocolError("connection closed by peer")
            # Ours is the only request waiting (one at a time; a timeout resets the
            # connection), so an answer is ours; anything else was dropped as unasked.
            for response in self._conn.receive_data(data):
                if response.problem is not None:
                    raise response.problem
                return response.body
