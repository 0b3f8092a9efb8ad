"""The request/response side of a connection, without I/O: bytes out, responses in.

Like h11's ``Connection``, this object owns the protocol state (correlation ids, the
requests waiting for an answer, the frame decoder) and never touches a socket: the
caller writes the bytes :meth:`Connection.send_request` returns, feeds what it reads
to :meth:`Connection.receive_data`, and gets back :class:`Response` values matched to
the requests it sent. The broker's peer links (one request at a time, reconnecting)
and the client's broker connections (many requests in flight, one reader task) wrap
this same object, so both follow one set of rules:

- Correlation ids are issued here, one per request, and each answer is matched to its
  request by id. An answer to a request the caller gave up on (:meth:`forget`) is
  dropped, never handed to someone else.
- A body that fails its API's schema fails *that* request (:attr:`Response.problem`);
  bytes that cannot be framed or parsed raise ProtocolError: the stream is unusable.
- **Top-level errors** (:func:`check_error`): a non-zero top-level ``error_code`` is the
  verdict on the whole request and raises the exception named after it, on every API.
  Errors about one item of a request (a partition of a produce, fetch, list-offsets;
  a topic of metadata or create-topics) sit inside that item and are the caller's to
  read; the top-level code of those APIs is non-zero only when the request as a whole
  failed (unsupported version, invalid body, not the controller, an injected fault).
  The exceptions are listed in ``protocol.api.ITEM_VERDICT_APIS``: AlterPartition proposes
  the ISR of one partition, so its ``error_code`` is that partition's (per partition,
  as in Kafka's AlterPartition), and a stale proposal is answered INVALID_REQUEST
  *with* the current ISR and partition epoch for the leader to catch up from; the
  quorum's APIs answer with the epoch and leader the Raft core learns from. Their body
  is returned and the caller reads the code, unless it is a bare error body (nothing
  but ``error_code`` and ``error_message``), which raises as on every API.
"""

from __future__ import annotations

import itertools
from typing import Any

from minibroker.protocol.api import ITEM_VERDICT_APIS
from minibroker.protocol.codec import decode_response_envelope, encode_request, validate_response
from minibroker.protocol.errors import ProtocolError, raise_for
from minibroker.protocol.framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder

__all__ = ["ITEM_VERDICT_APIS", "Connection", "Response", "check_error"]


# A body that is nothing but an error (a refusal, an unsupported version, an injected
# fault) is the request's failure even for an item-verdict API: there is no state to read.
_BARE_ERROR = frozenset({"error_code", "error_message"})


def check_error(api_key: int, body: dict) -> dict:
    """Return ``body``, or raise its top-level error under the rule in the module docstring."""
    code = body.get("error_code")
    if code and (api_key not in ITEM_VERDICT_APIS or body.keys() <= _BARE_ERROR):
        raise_for(code, body.get("error_message") or "")
    return body


class Response:
    """One answer matched to its request: a validated ``body`` or the ``problem`` with it."""

    __slots__ = ("api_key", "api_version", "body", "correlation_id", "problem", "waiter")

    def __init__(
        self,
        correlation_id: int,
        api_key: int,
        api_version: int,
        waiter: Any,
        body: dict | None,
        problem: ProtocolError | None,
    ) -> None:
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.api_version = api_version
        # Whatever the caller passed to send_request (an event, a slot): sans-IO keeps
        # it opaque so the I/O side needs no second map from id to waiter.
        self.waiter = waiter
        self.body = body
        self.problem = problem

    def result(self) -> dict:
        """The body; raises the ProtocolError with it, or its top-level error."""
        if self.problem is not None:
            raise self.problem
        return check_error(self.api_key, self.body)


class Connection:
    """Correlation ids, requests waiting for an answer, and the incoming frame decoder."""

    __slots__ = ("_decoder", "_ids", "_pending", "client_id")

    def __init__(
        self, client_id: str | None, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    ) -> None:
        self.client_id = client_id
        self._decoder = FrameDecoder(max_frame_bytes)
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, int, Any]] = {}

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered, forgotten or failed."""
        return len(self._pending)

    def send_request(
        self,
        api_key: int,
        body: dict,
        version: int = 0,
        *,
        waiter: Any = None,
        expect_response: bool = True,
    ) -> tuple[int, bytes]:
        """``(correlation_id, frame)``: write the frame; its answer comes from receive_data.

        With ``expect_response=False`` (acks=0 produce) nothing waits for an answer.
        """
        correlation_id = next(self._ids) & 0x7FFFFFFF
        frame = encode_request(api_key, version, correlation_id, self.client_id, body)
        if expect_response:
            self._pending[correlation_id] = (api_key, version, waiter)
        return correlation_id, frame

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Response]:
        """Feed bytes read from the peer; return the answers now complete.

        Raises ProtocolError when the bytes cannot be framed or an envelope cannot be
        parsed: the stream is out of step and must be closed.
        """
        responses = []
        decoder = self._decoder
        frames = decoder.feed_bytes(data) if type(data) is bytes else decoder.feed(data)
        for payload in frames:
            correlation_id, raw = decode_response_envelope(payload)
            pending = self._pending.pop(correlation_id, None)
            if pending is None:
                continue  # the caller gave up (timeout or cancel); drop the late answer
            api_key, version, waiter = pending
            try:
                body, problem = validate_response(api_key, version, raw), None
            except ProtocolError as exc:
                body, problem = None, exc
            responses.append(Response(correlation_id, api_key, version, waiter, body, problem))
        return responses

    def forget(self, correlation_id: int) -> None:
        """The caller stopped waiting: its answer, if it comes, is dropped."""
        self._pending.pop(correlation_id, None)

    def fail_all(self) -> list[Any]:
        """Forget every waiting request (the stream died); their waiters, to wake."""
        pending, self._pending = self._pending, {}
        return [waiter for _, _, waiter in pending.values()]
