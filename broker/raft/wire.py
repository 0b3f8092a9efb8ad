"""The quorum's messages as wire bodies (protocol/api.py's VOTE ... FETCH_SNAPSHOT schemas).

One description per message: the dataclass in messages.py. The encoder and decoder here
are derived from its fields and type hints when this module is imported, so a field added
to a dataclass travels without a hand-written line. The schema in protocol/api.py is the
other description, and it must stay separate: protocol is below broker and may not import
the core's types, and it validates bodies from untrusted peers before they reach us.
tests/unit/test_quorum_wire.py checks the two agree field by field (names, required or
optional, defaults, nested structs), in every version.

The only name that differs is ``error`` (an ErrorCode) against the wire's ``error_code``.
A field at its dataclass default is left out (the schema makes every defaulted field
optional with the same default, and fills it back in), so a standard Vote is also a valid
Vote v0 body and an empty Fetch answer carries no null fields.

Pure conversion both ways, so it stays on the sans-IO side: the driver sends a request's
body under its API key and version, and turns the validated answer back into the core's
response type. Bodies arrive already validated by the schema, so decoding only rebuilds
the dataclasses.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any

from minibroker.broker.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    VoteRequest,
    VoteResponse,
)
from minibroker.protocol import ApiKey
from minibroker.protocol.api import SCHEMAS
from minibroker.protocol.errors import ErrorCode

REQUEST_KEYS: dict[type, ApiKey] = {
    VoteRequest: ApiKey.VOTE,
    BeginQuorumEpochRequest: ApiKey.BEGIN_QUORUM_EPOCH,
    EndQuorumEpochRequest: ApiKey.END_QUORUM_EPOCH,
    FetchRequest: ApiKey.QUORUM_FETCH,
    FetchSnapshotRequest: ApiKey.FETCH_SNAPSHOT,
}
# The response type that answers each API: the driver matches a core's Send to a waiting call.
RESPONSE_TYPES: dict[ApiKey, type] = {
    ApiKey.VOTE: VoteResponse,
    ApiKey.BEGIN_QUORUM_EPOCH: BeginQuorumEpochResponse,
    ApiKey.END_QUORUM_EPOCH: EndQuorumEpochResponse,
    ApiKey.QUORUM_FETCH: FetchResponse,
    ApiKey.FETCH_SNAPSHOT: FetchSnapshotResponse,
}
QUORUM_APIS = frozenset(RESPONSE_TYPES)
REQUEST_TYPES: dict[ApiKey, type] = {key: cls for cls, key in REQUEST_KEYS.items()}
# Requests go out in the newest version we have (VOTE v1 carries pre_vote).
REQUEST_VERSIONS: dict[ApiKey, int] = {key: max(SCHEMAS[key]) for key in QUORUM_APIS}
# The request field naming its sender: it must be the authenticated peer (no speaking for others).
SENDER_FIELDS: dict[int, str] = {
    ApiKey.VOTE: "candidate_id",
    ApiKey.BEGIN_QUORUM_EPOCH: "leader_id",
    ApiKey.END_QUORUM_EPOCH: "leader_id",
    ApiKey.QUORUM_FETCH: "replica_id",
    ApiKey.FETCH_SNAPSHOT: "replica_id",
}
# dataclass field -> wire field, where Kafka's wire name differs from ours
WIRE_NAMES = {"error": "error_code"}

Convert = Callable[[Any], Any] | None  # None: the value goes as it is (int, bool, bytes, None)


def _error(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


def _converters(hint: Any) -> tuple[Convert, Convert]:
    """(encode, decode) for a value of type ``hint``: nested dataclasses become maps,
    tuples lists, ErrorCode its number; ``X | None`` passes None through."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType):  # X | None
        (inner,) = [a for a in args if a is not type(None)]
        enc, dec = _converters(inner)
        if enc is None:
            return None, None
        return (lambda v: None if v is None else enc(v)), (lambda v: None if v is None else dec(v))
    if typing.get_origin(hint) is tuple:  # tuple[X, ...]
        enc, dec = _converters(args[0])
        if enc is None:
            return list, tuple
        return (lambda v: [enc(x) for x in v]), (lambda v: tuple(dec(x) for x in v))
    if hint is ErrorCode:
        return int, _error
    if dataclasses.is_dataclass(hint):
        return codec_for(hint)
    return None, None


def codec_for(cls: type) -> tuple[Callable[[Any], dict], Callable[[dict], Any]]:
    """The (encode, decode) pair derived from dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    plan = []  # (attribute, wire name, has default, default, encode, decode)
    for f in dataclasses.fields(cls):
        enc, dec = _converters(hints[f.name])
        has_default = f.default is not dataclasses.MISSING
        plan.append((f.name, WIRE_NAMES.get(f.name, f.name), has_default, f.default, enc, dec))

    def encode(message: Any) -> dict:
        body = {}
        for attr, wire, has_default, default, enc, _dec in plan:
            value = getattr(message, attr)
            if has_default and value == default:
                continue  # the schema's default for it is the same (the wire test checks)
            body[wire] = value if enc is None else enc(value)
        return body

    def decode(body: dict) -> Any:
        values = []
        for _attr, wire, has_default, default, _enc, dec in plan:
            value = body.get(wire, default) if has_default else body[wire]
            values.append(value if dec is None else dec(value))
        return cls(*values)

    return encode, decode


_ENCODERS: dict[type, Callable[[Any], dict]] = {}
_DECODERS: dict[tuple[int, bool], Callable[[dict], Any]] = {}  # (api key, is request)
for _key, _cls in [*REQUEST_TYPES.items(), *RESPONSE_TYPES.items()]:
    _enc, _dec = codec_for(_cls)
    _ENCODERS[_cls] = _enc
    _DECODERS[int(_key), _cls in REQUEST_KEYS] = _dec


def encode(message: Message) -> dict:
    """The wire body of any quorum message (request or response)."""
    encoder = _ENCODERS.get(type(message))
    if encoder is None:
        raise TypeError(f"not a quorum message: {type(message).__name__}")
    return encoder(message)


def decode_request(api_key: int, body: dict) -> Message:
    decoder = _DECODERS.get((api_key, True))
    if decoder is None:
        raise ValueError(f"API {api_key} is not a quorum request")
    return decoder(body)


def decode_response(api_key: int, body: dict) -> Message:
    decoder = _DECODERS.get((api_key, False))
    if decoder is None:
        raise ValueError(f"API {api_key} is not a quorum API")
    return decoder(body)
