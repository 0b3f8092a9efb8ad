"""Each quorum dataclass (broker/raft/messages.py) against its schema (protocol/api.py).

wire.py derives the codec from the dataclasses; the schema is the one other description
(protocol cannot import the core). These tests hold the two to each other, field by field
and version by version, so neither can change alone.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

import pytest

from minibroker.broker.raft import messages as m
from minibroker.broker.raft.wire import (
    QUORUM_APIS,
    REQUEST_TYPES,
    REQUEST_VERSIONS,
    RESPONSE_TYPES,
    WIRE_NAMES,
    decode_request,
    decode_response,
    encode,
)
from minibroker.protocol import ApiKey
from minibroker.protocol.api import SCHEMAS
from minibroker.protocol.codec import (
    RequestHeader,
    decode_request_envelope,
    encode_request,
    validate_request,
    validate_response,
)
from minibroker.protocol.errors import ErrorCode, InvalidRequest

NOT_MODELLED = {"error_message"}  # schema fields the core has no use for (always optional)


def _nested(hint):
    """The dataclass inside ``X``, ``X | None`` or ``tuple[X, ...]``, if any."""
    for candidate in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(candidate):
            return candidate
    return None


def _unwrap(validator):
    while hasattr(validator, "inner") or hasattr(validator, "item"):
        validator = getattr(validator, "inner", None) or validator.item
    return validator


def disagreements(cls: type, schema, newest: bool, path: str = "") -> list[str]:
    """Where dataclass ``cls`` and struct ``schema`` differ (empty: they agree)."""
    out = []
    required, optional = schema.fields, schema.optional
    hints = typing.get_type_hints(cls)
    seen = set()
    for f in dataclasses.fields(cls):
        wire = WIRE_NAMES.get(f.name, f.name)
        seen.add(wire)
        where = f"{path}{cls.__name__}.{f.name}"
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            if wire not in required:
                out.append(f"{where} has no default but '{wire}' is not a required field")
        elif wire in optional:
            default = f.default
            wire_default = list(default) if isinstance(default, tuple) else default
            if optional[wire][1] != wire_default:
                out.append(f"{where} defaults to {default!r}, the schema to {optional[wire][1]!r}")
        elif wire in required:
            out.append(f"{where} has a default (left off the wire) but '{wire}' is required")
        elif newest:
            out.append(f"{where} is not in the newest schema")
        inner = _nested(hints[f.name])
        validator = required.get(wire) or optional.get(wire, (None,))[0]
        if inner is not None and validator is not None:
            out += disagreements(inner, _unwrap(validator), newest, f"{where} -> ")
    for wire in (set(required) | set(optional)) - seen - NOT_MODELLED:
        out.append(f"{path}{cls.__name__} lacks the schema's field '{wire}'")
    return out


@pytest.mark.parametrize("key", sorted(QUORUM_APIS), ids=lambda k: ApiKey(k).name)
def test_every_quorum_dataclass_agrees_with_its_schema_in_every_version(key):
    newest = max(SCHEMAS[key])
    for version, (request_schema, response_schema) in SCHEMAS[key].items():
        is_newest = version == newest
        assert disagreements(REQUEST_TYPES[key], request_schema, is_newest) == [], version
        assert disagreements(RESPONSE_TYPES[key], response_schema, is_newest) == [], version
    assert REQUEST_VERSIONS[key] == newest


def test_the_agreement_check_catches_a_field_added_on_one_side_only():
    @dataclass(frozen=True)
    class Drifted:
        candidate_epoch: int
        candidate_id: int
        last_offset_epoch: int
        last_offset: int
        pre_vote: bool = True  # the schema says False
        priority: int = 0  # not in the schema at all

    vote_v1 = SCHEMAS[ApiKey.VOTE][1][0]
    found = disagreements(Drifted, vote_v1, newest=True)
    assert any("pre_vote defaults to True" in d for d in found)
    assert any("priority is not in the newest schema" in d for d in found)

    @dataclass(frozen=True)
    class Short:
        candidate_epoch: int
        candidate_id: int

    found = disagreements(Short, vote_v1, newest=True)
    assert "Short lacks the schema's field 'last_offset'" in found
    # nested structs are compared too: a record without its control flag
    found = disagreements(_AnswerOfBareEntries, SCHEMAS[ApiKey.QUORUM_FETCH][0][1], newest=True)
    assert found == [
        "_AnswerOfBareEntries.records -> _BareEntry lacks the schema's field 'control'"
    ]


@dataclass(frozen=True)
class _BareEntry:
    offset: int
    epoch: int
    data: bytes


@dataclass(frozen=True)
class _AnswerOfBareEntries:
    correlation_id: int
    error: ErrorCode
    leader_epoch: int
    leader_id: int | None
    high_watermark: int | None = None
    records: tuple[_BareEntry, ...] = ()
    diverging_epoch: m.OffsetAndEpoch | None = None
    snapshot_id: m.OffsetAndEpoch | None = None


def _over_the_wire(key: int, version: int, request):
    frame = encode_request(key, version, 1, "t", encode(request))
    header, raw = decode_request_envelope(frame[4:])
    return decode_request(key, validate_request(header, raw))


def test_a_pre_vote_needs_vote_v1_and_a_standard_vote_is_valid_in_both_versions():
    pre = m.VoteRequest(4, 1, 3, 17, pre_vote=True)
    assert _over_the_wire(ApiKey.VOTE, 1, pre) == pre
    with pytest.raises(InvalidRequest, match="pre_vote"):
        validate_request(RequestHeader(ApiKey.VOTE, 0, 1, "t"), encode(pre))
    standard = m.VoteRequest(4, 1, 3, 17)
    assert encode(standard) == {
        "candidate_epoch": 4,
        "candidate_id": 1,
        "last_offset_epoch": 3,
        "last_offset": 17,
    }
    for version in (0, 1):
        assert _over_the_wire(ApiKey.VOTE, version, standard) == standard
    answer = m.VoteResponse(ErrorCode.NONE, 4, None, True, pre_vote=True)
    body = validate_response(ApiKey.VOTE, 1, encode(answer))
    assert decode_response(ApiKey.VOTE, body) == answer
    # an error code we do not know decodes as UNKNOWN_SERVER_ERROR, never a crash
    strange = validate_response(ApiKey.VOTE, 1, {**encode(answer), "error_code": 999})
    assert decode_response(ApiKey.VOTE, strange).error == ErrorCode.UNKNOWN_SERVER_ERROR


def test_a_field_at_its_default_stays_off_the_wire():
    entry = m.Entry(5, 2, b"x")
    answer = m.FetchResponse(9, ErrorCode.NONE, 2, 0, 5, (entry,))
    body = encode(answer)
    assert body["records"] == [{"offset": 5, "epoch": 2, "data": b"x"}]
    assert "diverging_epoch" not in body and "snapshot_id" not in body
    validated = validate_response(ApiKey.QUORUM_FETCH, 0, body)
    assert decode_response(ApiKey.QUORUM_FETCH, validated) == answer
