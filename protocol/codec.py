"""Requests and responses: msgpack envelopes plus per-API body validation.

Request:  ``[api_key, api_version, correlation_id, client_id, body]``
Response: ``[correlation_id, body]``

Decoding is two steps so a server can answer precisely: an envelope that cannot
be parsed is a ProtocolError (close the connection, we cannot even name the
request), while a bad body or unknown version becomes an error *response* for
that correlation id.
"""

from __future__ import annotations

import os
import struct
from typing import Any, NamedTuple

import msgpack

from minibroker.protocol.api import ERROR_RESPONSE, SCHEMAS, api_name
from minibroker.protocol.errors import ErrorCode, InvalidRequest, ProtocolError, UnsupportedVersion
from minibroker.protocol.framing import encode_frame, encode_frame_of

# What decoding one request may build. Memory is what a request can take that its frame
# does not show: every msgpack value becomes a Python object (an empty map, one byte on the
# wire, is a 64-byte dict and an 8-byte slot: 30 million of them in a 30 MB frame grew a
# broker by 2 GB and held its loop 7.6 s). Strings and bytes decode to about their wire
# size, so bounding the count of values bounds decoding to the frame plus
# MAX_REQUEST_VALUES objects (~10 MB) and its time to tens of milliseconds. Produce, the
# one request with bulk bytes, carries them as a few ``bin`` values; 2,000 topics created
# in one request are ~20,000 values.
MAX_REQUEST_VALUES = 1 << 17
_MARKER_INDEX = struct.Struct(">I")
_FRAME_LEN = struct.Struct(">I")


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def _unpack(payload: bytes | memoryview) -> Any:
    try:
        return msgpack.unpackb(payload, raw=False, use_list=True)
    except Exception as exc:  # msgpack raises many types on hostile input
        raise ProtocolError(f"undecodable msgpack: {type(exc).__name__}: {exc}") from None


def _check_request_values(payload: bytes | memoryview) -> None:
    """Raise InvalidRequest if ``payload`` announces more than MAX_REQUEST_VALUES values.

    A frame of n bytes holds at most n values, so only larger ones are walked, and the
    walk stops as soon as the containers read so far announce too many. A malformed
    payload ends the walk; unpacking it then names the problem.
    """
    if len(payload) > MAX_REQUEST_VALUES and _announced_values(payload) > MAX_REQUEST_VALUES:
        raise InvalidRequest(
            f"request of {len(payload)} bytes holds more than {MAX_REQUEST_VALUES} "
            "msgpack values: split it"
        )


# The walk reads msgpack's type bytes itself: msgpack.Unpacker would copy the whole frame
# into its buffer first (a Produce's megabytes of records, for a count of a dozen values).
# _FIXED_SIZE: the whole size of a value its first byte fixes (0: it does not);
# _PREFIXED: first byte -> (length field bytes, bytes after it, values per count or 0
# for a str/bin/ext whose length counts bytes).
_FIXED_SIZE = [0] * 256
for _b in [*range(0x00, 0x80), *range(0xE0, 0x100), 0xC0, 0xC2, 0xC3]:  # ints, nil, bools
    _FIXED_SIZE[_b] = 1
for _b in range(0xA0, 0xC0):  # fixstr
    _FIXED_SIZE[_b] = 1 + (_b & 0x1F)
for _b, _size in zip(
    range(0xCA, 0xD9), (5, 9, 2, 3, 5, 9, 2, 3, 5, 9, 3, 4, 6, 10, 18), strict=True
):
    _FIXED_SIZE[_b] = _size  # float, uint, int, fixext
_PREFIXED = {
    0xC4: (1, 0, 0), 0xC5: (2, 0, 0), 0xC6: (4, 0, 0),  # bin
    0xC7: (1, 1, 0), 0xC8: (2, 1, 0), 0xC9: (4, 1, 0),  # ext (+ its type byte)
    0xD9: (1, 0, 0), 0xDA: (2, 0, 0), 0xDB: (4, 0, 0),  # str
    0xDC: (2, 0, 1), 0xDD: (4, 0, 1), 0xDE: (2, 0, 2), 0xDF: (4, 0, 2),  # array, map
}  # fmt: skip


def _announced_values(payload: bytes | memoryview) -> int:
    """How many values the containers read so far announce (the value itself included),
    up to just past MAX_REQUEST_VALUES; 0 for a payload that is not msgpack."""
    fixed, prefixed = _FIXED_SIZE, _PREFIXED
    end = len(payload)
    pos = read = 0
    announced = 1
    while read < announced <= MAX_REQUEST_VALUES:
        if pos >= end:
            return 0
        b = payload[pos]
        size = fixed[b]
        if size:
            pos += size
        elif 0x80 <= b <= 0x9F:  # fixmap, fixarray
            announced += b & 0x0F if b >= 0x90 else 2 * (b & 0x0F)
            pos += 1
        elif b in prefixed:
            width, after, per_count = prefixed[b]
            n = int.from_bytes(payload[pos + 1 : pos + 1 + width], "big")
            if per_count:
                announced += per_count * n
                pos += 1 + width
            else:
                pos += 1 + width + after + n
        else:  # 0xC1, never used
            return 0
        read += 1
    return announced


def _is_int(value: Any) -> bool:
    return type(value) is int


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def encode_request(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, body: dict
) -> bytes:
    """A whole frame, ready to send."""
    return encode_frame(pack([int(api_key), api_version, correlation_id, client_id, body]))


def decode_request_envelope(payload: bytes) -> tuple[RequestHeader, Any]:
    """Parse the envelope; the body is returned raw (validate with ``validate_request``).

    InvalidRequest for a request over MAX_REQUEST_VALUES (answer it if
    ``split_request_envelope`` can name it), ProtocolError for bytes that do not parse.
    """
    _check_request_values(payload)
    msg = _unpack(payload)
    if type(msg) is not list or len(msg) != 5:
        raise ProtocolError(
            "request is not [api_key, api_version, correlation_id, client_id, body]"
        )
    key, version, corr, client_id, body = msg
    if not (_is_int(key) and _is_int(version) and _is_int(corr)):
        raise ProtocolError("api_key, api_version and correlation_id must be integers")
    if not -(2**31) <= corr < 2**31:
        raise ProtocolError("correlation_id is not an int32")
    if client_id is not None and type(client_id) is not str:
        raise ProtocolError("client_id must be a string or nil")
    return RequestHeader(key, version, corr, client_id), body


def decode_request_body(body_bytes: bytes) -> Any:
    """The raw body from ``split_request_envelope``'s bytes (validate it next): exactly one
    msgpack value, as the whole envelope's decoding would have found it, within
    MAX_REQUEST_VALUES."""
    _check_request_values(body_bytes)
    return _unpack(body_bytes)


def split_request_envelope(payload: bytes) -> tuple[RequestHeader, bytes] | None:
    """The header and the body's bytes, without decoding the body; None unless the
    envelope has the form clients send (non-negative integers up to 2^31-1, a client id
    of at most 255 bytes or nil): decode those with ``decode_request_envelope``.

    Identical bodies are then identical bytes, so a server can validate one once for
    every connection that sends it (thousands of consumers long-polling one partition);
    new bytes need only ``decode_request_body``.
    """
    if payload[:1] != b"\x95":  # an array of five
        return None
    try:
        pos = 1
        ints = []
        for _ in range(3):
            b = payload[pos]
            if b < 0x80:  # positive fixint
                ints.append(b)
                pos += 1
            elif b == 0xCC:
                ints.append(payload[pos + 1])
                pos += 2
            elif b == 0xCD:
                ints.append(int.from_bytes(payload[pos + 1 : pos + 3], "big"))
                pos += 3
            elif b == 0xCE:
                ints.append(int.from_bytes(payload[pos + 1 : pos + 5], "big"))
                pos += 5
            else:
                return None
        b = payload[pos]
        if b == 0xC0:
            client_id = None
            pos += 1
        else:
            if 0xA0 <= b <= 0xBF:  # fixstr
                start, length = pos + 1, b - 0xA0
            elif b == 0xD9:  # str 8
                start, length = pos + 2, payload[pos + 1]
            else:
                return None
            pos = start + length
            client_id = payload[start:pos].decode()
    except (IndexError, UnicodeDecodeError):
        return None
    if pos >= len(payload) or ints[2] >= 2**31:
        return None
    return RequestHeader(ints[0], ints[1], ints[2], client_id), payload[pos:]


def _schemas(api_key: int, api_version: int) -> tuple:
    versions = SCHEMAS.get(api_key)
    if versions is None:
        raise UnsupportedVersion(f"unknown api_key {api_key}")
    pair = versions.get(api_version)
    if pair is None:
        raise UnsupportedVersion(
            f"{api_name(api_key)} version {api_version} is not supported "
            f"(supported: {min(versions)}..{max(versions)})"
        )
    return pair


def validate_request(header: RequestHeader, body: Any) -> dict:
    """Check the body against its schema; raises UnsupportedVersion / InvalidRequest."""
    request_schema, _ = _schemas(header.api_key, header.api_version)
    return request_schema(body, "")


def decode_request(payload: bytes) -> tuple[RequestHeader, dict]:
    header, body = decode_request_envelope(payload)
    return header, validate_request(header, body)


def encode_response(correlation_id: int, body: dict) -> bytes:
    return encode_frame(pack([correlation_id, body]))


def encode_packed_response(correlation_id: int, packed_body: bytes) -> bytes:
    """The frame ``encode_response`` makes, from a body packed beforehand: a body many
    answers share (thousands of long polls woken by one append) is packed once."""
    return encode_frame_of(b"\x92", pack(correlation_id), packed_body)  # fixarray of 2


def encode_response_parts(correlation_id: int, body: dict, external: type) -> list:
    """``encode_response``'s frame as parts: bytes, and each ``external`` value of the body
    (a ``bin`` field whose bytes the caller sends from elsewhere, e.g. a file) in place.

    A bytes part ends with the ``bin`` header of the external part after it, so the
    concatenation of the parts is exactly ``encode_response`` of the body with those
    values' bytes. Each external value is packed as a marker first (unique to this call,
    and found in order), then the packed body is cut at the markers: only the small
    packed body is searched, never the external bytes.
    """
    externals: list = []
    nonce = os.urandom(12)

    def marker(value: Any) -> bytes:
        if not isinstance(value, external):
            raise TypeError(f"cannot serialize {type(value).__name__}")
        externals.append(value)
        return nonce + _MARKER_INDEX.pack(len(externals))

    packed = msgpack.packb([correlation_id, body], use_bin_type=True, default=marker)
    parts: list = []
    pos = 0
    for n, value in enumerate(externals, 1):
        # The marker packs as a bin 8 of 16 bytes: 0xc4 0x10, then the marker.
        at = packed.index(b"\xc4\x10" + nonce + _MARKER_INDEX.pack(n), pos)
        parts.append(packed[pos:at] + _bin_header(len(value)))
        parts.append(value)
        pos = at + 18
    parts.append(packed[pos:])
    parts[0] = _FRAME_LEN.pack(sum(map(len, parts))) + parts[0]
    return parts


def _bin_header(length: int) -> bytes:
    if length < 1 << 8:
        return b"\xc4" + bytes([length])
    if length < 1 << 16:
        return b"\xc5" + length.to_bytes(2, "big")
    return b"\xc6" + length.to_bytes(4, "big")


def error_body(code: ErrorCode, message: str | None = None) -> dict:
    """The top-level error body that is a valid response to any API."""
    return {"error_code": int(code), "error_message": message}


def decode_response_envelope(payload: bytes) -> tuple[int, Any]:
    msg = _unpack(payload)
    if type(msg) is not list or len(msg) != 2 or not _is_int(msg[0]):
        raise ProtocolError("response is not [correlation_id, body]")
    return msg[0], msg[1]


def validate_response(api_key: int, api_version: int, body: Any) -> dict:
    """Validate a response body; a bare top-level error body is accepted for any API."""
    if (
        type(body) is dict
        and body.get("error_code")
        and set(body) <= {"error_code", "error_message"}
    ):
        return ERROR_RESPONSE(body, "")
    _, response_schema = _schemas(api_key, api_version)
    try:
        return response_schema(body, "")
    except InvalidRequest as exc:
        raise ProtocolError(f"malformed {api_name(api_key)} response: {exc.message}") from None
