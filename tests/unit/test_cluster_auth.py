"""The membership handshake: HMAC challenge-response, mutual, one proof per challenge."""

from __future__ import annotations

import json
import os
import stat

import pytest
import structlog

from minibroker.broker.network.cluster_auth import (
    MECHANISM,
    Authenticator,
    ClusterCredentials,
    SecretFileError,
    client_transcript,
    load_credentials,
    new_nonce,
    proof,
)
from minibroker.broker.network.session import ConnectionSession
from minibroker.deploy.cluster_secret import SECRET_FILE, ensure_cluster_secret
from minibroker.protocol.errors import ErrorCode

SECRET = bytes(range(32))
LOG = structlog.get_logger("test")


def server(secret: bytes = SECRET) -> Authenticator:
    return Authenticator(ClusterCredentials(0, "cluster-a", secret), 0, LOG)


def hello(broker_id: int, nonce: bytes, cluster_id: str = "cluster-a") -> dict:
    return {
        "mechanism": MECHANISM,
        "broker_id": broker_id,
        "cluster_id": cluster_id,
        "client_nonce": nonce,
    }


def login(auth: Authenticator, session: ConnectionSession, creds: ClusterCredentials) -> dict:
    """What PeerConnection does: handshake, proof; returns the authenticate answer."""
    nonce = new_nonce()
    answer = auth.handshake(session, hello(creds.broker_id, nonce, creds.cluster_id))
    assert answer["error_code"] == 0, answer
    transcript = client_transcript(creds, answer["broker_id"], nonce, answer["server_nonce"])
    done = auth.authenticate(session, {"auth_bytes": proof(creds.secret, "client", transcript)})
    if done["error_code"] == 0:
        # Mutual: the server's proof is checkable by the client, and differs from ours.
        assert done["auth_bytes"] == proof(creds.secret, "server", transcript)
        assert done["auth_bytes"] != proof(creds.secret, "client", transcript)
    return done


def test_member_with_the_secret_becomes_the_principal():
    session = ConnectionSession("peer")
    done = login(server(), session, ClusterCredentials(2, "cluster-a", SECRET))
    assert done["error_code"] == 0
    assert session.principal == 2


def test_wrong_secret_is_refused_and_leaves_no_principal():
    session = ConnectionSession("peer")
    done = login(server(), session, ClusterCredentials(1, "cluster-a", b"x" * 32))
    assert done["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert session.principal is None


def test_wrong_cluster_id_or_mechanism_is_refused_at_handshake():
    auth, session = server(), ConnectionSession("peer")
    assert (
        auth.handshake(session, hello(1, new_nonce(), "cluster-b"))["error_code"]
        == ErrorCode.SASL_AUTHENTICATION_FAILED
    )
    answer = auth.handshake(session, {**hello(1, new_nonce()), "mechanism": "PLAIN"})
    assert answer["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert answer["mechanisms"] == [MECHANISM]
    assert auth.handshake(session, hello(1, b"short"))["error_code"] != 0


def test_a_proof_is_good_for_one_challenge_only():
    auth = server()
    creds = ClusterCredentials(1, "cluster-a", SECRET)
    first = ConnectionSession("a")
    nonce = new_nonce()
    answer = auth.handshake(first, hello(1, nonce))
    good = proof(SECRET, "client", client_transcript(creds, 0, nonce, answer["server_nonce"]))
    assert auth.authenticate(first, {"auth_bytes": good})["error_code"] == 0
    # Replayed on the same challenge, or on another connection's fresh challenge: refused.
    assert auth.authenticate(first, {"auth_bytes": good})["error_code"] != 0
    second = ConnectionSession("b")
    auth.handshake(second, hello(1, nonce))
    assert auth.authenticate(second, {"auth_bytes": good})["error_code"] != 0
    assert second.principal is None


def test_authenticate_without_handshake_and_new_handshake_drops_principal():
    auth, session = server(), ConnectionSession("peer")
    assert auth.authenticate(session, {"auth_bytes": b"\0" * 32})["error_code"] != 0
    login(auth, session, ClusterCredentials(1, "cluster-a", SECRET))
    assert session.principal == 1
    auth.handshake(session, hello(1, new_nonce()))
    assert session.principal is None


def test_closed_connections_leave_no_pending_challenge():
    auth = server()
    sessions = [ConnectionSession(str(i)) for i in range(50)]
    for session in sessions:
        for _ in range(3):
            auth.handshake(session, hello(1, new_nonce()))
    for session in sessions:
        session.close()
    assert auth._pending == {}


def test_broker_without_secret_authenticates_nobody():
    auth, session = Authenticator(None, 0, LOG), ConnectionSession("peer")
    assert auth.handshake(session, hello(1, new_nonce()))["error_code"] != 0
    assert auth.authenticate(session, {"auth_bytes": b"\0" * 32})["error_code"] != 0
    assert session.principal is None


def test_generated_secret_file_is_0600_stable_and_loadable(tmp_path):
    path = ensure_cluster_secret(tmp_path / "cluster")
    assert path == (tmp_path / "cluster" / SECRET_FILE).resolve()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    content = path.read_bytes()
    assert ensure_cluster_secret(tmp_path / "cluster") == path
    assert path.read_bytes() == content  # once per cluster, not per start
    creds = load_credentials(path, 3)
    assert creds.broker_id == 3 and len(creds.secret) == 32
    assert creds.secret.hex() not in repr(creds)
    other = load_credentials(ensure_cluster_secret(tmp_path / "other"), 3)
    assert other.secret != creds.secret and other.cluster_id != creds.cluster_id


def test_secret_file_readable_by_others_or_malformed_is_refused(tmp_path):
    path = tmp_path / "s"
    secret_hex = "ab" * 32
    path.write_text(json.dumps({"cluster_id": "c", "secret": secret_hex}))
    path.chmod(0o644)
    with pytest.raises(SecretFileError, match="chmod 600"):
        load_credentials(path, 0)
    path.chmod(0o600)
    assert load_credentials(path, 0).secret == bytes.fromhex(secret_hex)
    for bad in ("[]", "{", '{"cluster_id": "c", "secret": "zz' + secret_hex + '"}', ""):
        path.write_text(bad)
        with pytest.raises(SecretFileError) as info:
            load_credentials(path, 0)
        assert secret_hex not in str(info.value)  # never echo the secret
    with pytest.raises(SecretFileError, match="cannot read"):
        load_credentials(tmp_path / "missing", 0)
