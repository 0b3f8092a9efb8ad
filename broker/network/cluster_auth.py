"""Cluster membership: brokers prove they hold the cluster secret (HMAC challenge-response).

Internal APIs (registration, heartbeats, ISR changes, metadata pushes, follower fetches)
steer the whole cluster, so they are answered only on connections whose peer proved
membership. The proof never sends the secret: each side contributes a fresh random
nonce and answers with ``HMAC-SHA256(secret, role | transcript)``, where the transcript
binds the cluster id, both broker ids and both nonces. The server's proof comes back
too (mutual authentication), so a broker never takes data or metadata from an impostor.
The role label keeps one side's proof from being replayed as the other's.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from minibroker.broker.common.config import BrokerConfig, ConfigError
from minibroker.broker.network.session import ConnectionSession
from minibroker.protocol.errors import ErrorCode

MECHANISM = "MINIBROKER-HMAC-SHA256"
NONCE_BYTES = 32
_VERSION = 1


class SecretFileError(ValueError):
    """The cluster secret file is missing, unreadable, too open or malformed."""


@dataclass(frozen=True, slots=True)
class ClusterCredentials:
    """What this broker proves membership with. ``repr`` never shows the secret."""

    broker_id: int
    cluster_id: str
    secret: bytes = field(repr=False)


def load_credentials(path: Path, broker_id: int) -> ClusterCredentials:
    """Read ``{"cluster_id": ..., "secret": hex}`` from a file only its owner may read."""
    try:
        st = os.stat(path)
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise SecretFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        # As ssh does with private keys: a secret others can read is no secret.
        raise SecretFileError(
            f"{path} is accessible by others (mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it"
        )
    try:
        doc = json.loads(raw)
        cluster_id, secret_hex = doc["cluster_id"], doc["secret"]
        if type(cluster_id) is not str or not 0 < len(cluster_id) <= 64:
            raise ValueError("cluster_id must be a string of 1..64 characters")
        secret = bytes.fromhex(secret_hex)
    except (ValueError, KeyError, TypeError) as exc:
        # Never echo the document: it holds the secret.
        raise SecretFileError(
            f"{path} is not a cluster secret file ({type(exc).__name__})"
        ) from None
    if len(secret) < 16:
        raise SecretFileError(f"{path}: the secret is shorter than 16 bytes")
    return ClusterCredentials(broker_id, cluster_id, secret)


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def _transcript(
    cluster_id: str, client_id: int, server_id: int, client_nonce: bytes, server_nonce: bytes
) -> bytes:
    # msgpack: every field is length-delimited, so no two transcripts encode alike.
    return msgpack.packb([_VERSION, cluster_id, client_id, server_id, client_nonce, server_nonce])


def proof(secret: bytes, role: str, transcript: bytes) -> bytes:
    return hmac.new(secret, role.encode() + b"\0" + transcript, hashlib.sha256).digest()


def client_transcript(
    creds: ClusterCredentials, server_id: int, client_nonce: bytes, server_nonce: bytes
) -> bytes:
    return _transcript(creds.cluster_id, creds.broker_id, server_id, client_nonce, server_nonce)


def _refuse(code: ErrorCode, message: str) -> dict:
    return {"error_code": int(code), "error_message": message}


def credentials_from_config(
    broker_id: int, config: BrokerConfig, voters: dict[int, tuple[str, int]]
) -> ClusterCredentials | None:
    """The cluster secret; required as soon as there are other brokers to trust."""
    path = config["cluster.secret.file"]
    if path:
        try:
            return load_credentials(Path(path), broker_id)
        except SecretFileError as exc:
            raise ConfigError(f"config 'cluster.secret.file': {exc}") from None
    others = sorted(set(voters) - {broker_id})
    if others:
        raise ConfigError(
            "config 'cluster.secret.file' is required: controller.quorum.voters lists "
            f"other brokers ({', '.join(map(str, others))}), and brokers prove membership "
            "to each other with the cluster's secret ('minibroker cluster up' writes one)"
        )
    # A single broker has no peers: every internal API is refused (nobody can authenticate).
    return None


class Authenticator:
    """Server side: one pending challenge per connection, the principal set on success."""

    def __init__(self, credentials: ClusterCredentials | None, broker_id: int, logger) -> None:
        self.credentials = credentials
        self.broker_id = broker_id
        self.log = logger
        # Keyed by connection until it closes; the value is the challenge awaiting a proof.
        self._pending: dict[ConnectionSession, bytes | None] = {}

    def handshake(self, session: ConnectionSession, body: dict) -> dict:
        # A new handshake drops whatever the connection proved before.
        session.principal = None
        if session not in self._pending:
            session.on_close(lambda: self._pending.pop(session, None))
        self._pending[session] = None
        creds = self.credentials
        if creds is None:
            return _refuse(
                ErrorCode.SASL_AUTHENTICATION_FAILED,
                f"broker {self.broker_id} runs without cluster.secret.file: it has no peers",
            )
        if body["mechanism"] != MECHANISM:
            return {
                **_refuse(
                    ErrorCode.SASL_AUTHENTICATION_FAILED,
                    f"unsupported mechanism {body['mechanism'][:64]!r}",
                ),
                "mechanisms": [MECHANISM],
            }
        if body["cluster_id"] != creds.cluster_id:
            return _refuse(ErrorCode.SASL_AUTHENTICATION_FAILED, "cluster id does not match")
        if len(body["client_nonce"]) != NONCE_BYTES:
            return _refuse(
                ErrorCode.SASL_AUTHENTICATION_FAILED, f"client_nonce must be {NONCE_BYTES} bytes"
            )
        server_nonce = new_nonce()
        self._pending[session] = _transcript(
            creds.cluster_id, body["broker_id"], self.broker_id, body["client_nonce"], server_nonce
        )
        return {
            "error_code": 0,
            "error_message": None,
            "mechanisms": [MECHANISM],
            "broker_id": self.broker_id,
            "server_nonce": server_nonce,
        }

    def authenticate(self, session: ConnectionSession, body: dict) -> dict:
        transcript = self._pending.get(session)
        if transcript is not None:
            self._pending[session] = None  # one proof per challenge
        if transcript is None or self.credentials is None:
            return _refuse(ErrorCode.SASL_AUTHENTICATION_FAILED, "SASL_HANDSHAKE first")
        secret = self.credentials.secret
        if not hmac.compare_digest(body["auth_bytes"], proof(secret, "client", transcript)):
            self.log.warning("peer_authentication_failed", peer=session.peer)
            return _refuse(
                ErrorCode.SASL_AUTHENTICATION_FAILED, "wrong proof: not a cluster member"
            )
        claimed = msgpack.unpackb(transcript)[2]
        session.principal = claimed
        self.log.debug("peer_authenticated", peer=session.peer, principal=claimed)
        return {
            "error_code": 0,
            "error_message": None,
            "auth_bytes": proof(secret, "server", transcript),
        }
