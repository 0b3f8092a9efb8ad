"""Kafka's message bodies, read and written from Kafka's own JSON message specs.

``specs/`` holds the JSON files Kafka generates its Java classes from (Apache 2.0, vendored
as data). Instead of hundreds of hand-written fields, each (api key, version) is compiled
once, at first use, into a list of per-field readers and writers: closures over
``struct`` (CPython's fastest path for fixed-size fields). Bodies are plain dicts keyed by
the spec's field names in snake_case (``TopicData`` -> ``topic_data``); a writer takes a
missing key as the spec's default, so an answer names only what it knows.

Flexible versions (KIP-482) are supported: compact strings, bytes and arrays, and tagged
fields (unknown tags are skipped, as Kafka does). Sans-IO: bytes in, dicts out; every
failure on hostile bytes is a ProtocolError.
"""

from __future__ import annotations

import json
import re
import struct
import uuid
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from minibroker.protocol.errors import ProtocolError

SPECS = Path(__file__).with_name("specs")

Reader = Callable[[bytes, int], tuple[Any, int]]
Writer = Callable[[bytearray, Any], None]

_INTS = {
    "int8": struct.Struct(">b"),
    "int16": struct.Struct(">h"),
    "uint16": struct.Struct(">H"),
    "int32": struct.Struct(">i"),
    "uint32": struct.Struct(">I"),
    "int64": struct.Struct(">q"),
    "float64": struct.Struct(">d"),
}
_I16 = _INTS["int16"]
_I32 = _INTS["int32"]
_MAX_ARRAY = 1 << 24  # more elements than any frame we accept could describe


class KafkaDecodeError(ProtocolError):
    """Bytes that are not the message the header names."""


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _in(versions: str | None, version: int) -> bool:
    """Kafka's version ranges: "3+", "0-5", "7", "none"."""
    if not versions or versions == "none":
        return False
    if versions.endswith("+"):
        return version >= int(versions[:-1])
    low, _, high = versions.partition("-")
    return int(low) <= version <= int(high or low)


def load_spec(name: str) -> dict:
    """A spec file without its ``//`` comments (Kafka's JSON carries them)."""
    text = (SPECS / f"{name}.json").read_text()
    return json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))


# --- varints (zigzag for signed, plain unsigned for compact lengths and tags) ---------------


def read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise KafkaDecodeError("varint longer than 10 bytes")


def write_uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value, pos = read_uvarint(buf, pos)
    return (value >> 1) ^ -(value & 1), pos


def write_varint(out: bytearray, value: int) -> None:
    write_uvarint(out, (value << 1) ^ (value >> 63))


# --- primitive readers and writers ----------------------------------------------------------


def _fixed(s: struct.Struct) -> tuple[Reader, Writer]:
    size = s.size
    unpack_from = s.unpack_from
    pack = s.pack

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        return unpack_from(buf, pos)[0], pos + size

    def write(out: bytearray, value: Any) -> None:
        out += pack(value)

    return read, write


def _read_bool(buf: bytes, pos: int) -> tuple[bool, int]:
    return buf[pos] != 0, pos + 1


def _write_bool(out: bytearray, value: bool) -> None:
    out.append(1 if value else 0)


def _read_uuid(buf: bytes, pos: int) -> tuple[uuid.UUID, int]:
    end = pos + 16
    if end > len(buf):
        raise KafkaDecodeError("uuid cut off")
    return uuid.UUID(bytes=bytes(buf[pos:end])), end


def _write_uuid(out: bytearray, value: uuid.UUID | None) -> None:
    out += value.bytes if value is not None else bytes(16)


def _bytes_codec(kind: str, compact: bool, nullable: bool) -> tuple[Reader, Writer]:
    """string (int16 length), bytes/records (int32 length), or their compact forms."""
    text = kind == "string"
    plain = _I16 if text else _I32

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        if compact:
            n, pos = read_uvarint(buf, pos)
            n -= 1
        else:
            n = plain.unpack_from(buf, pos)[0]
            pos += plain.size
        if n < 0:
            if not nullable:
                raise KafkaDecodeError(f"null {kind} in a non-nullable field")
            return None, pos
        end = pos + n
        if end > len(buf):
            raise KafkaDecodeError(f"{kind} of {n} bytes cut off")
        raw = buf[pos:end]
        if text:
            try:
                return str(raw, "utf-8"), end
            except UnicodeDecodeError:
                raise KafkaDecodeError("string is not UTF-8") from None
        return bytes(raw), end

    def write(out: bytearray, value: Any) -> None:
        if value is None:
            if compact:
                out.append(0)
            else:
                out += plain.pack(-1)
            return
        raw = value.encode() if text else value
        if compact:
            write_uvarint(out, len(raw) + 1)
        else:
            out += plain.pack(len(raw))
        out += raw

    return read, write


def _array_codec(
    element: tuple[Reader, Writer], compact: bool, nullable: bool
) -> tuple[Reader, Writer]:
    read_element, write_element = element

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        if compact:
            n, pos = read_uvarint(buf, pos)
            n -= 1
        else:
            n = _I32.unpack_from(buf, pos)[0]
            pos += 4
        if n < 0:
            if not nullable:
                raise KafkaDecodeError("null array in a non-nullable field")
            return None, pos
        if n > _MAX_ARRAY or n > len(buf) - pos:  # every element is at least a byte
            raise KafkaDecodeError(f"array of {n} elements cannot fit in the message")
        items = []
        append = items.append
        for _ in range(n):
            item, pos = read_element(buf, pos)
            append(item)
        return items, pos

    def write(out: bytearray, value: Any) -> None:
        if value is None:
            if compact:
                out.append(0)
            else:
                out += _I32.pack(-1)
            return
        if compact:
            write_uvarint(out, len(value) + 1)
        else:
            out += _I32.pack(len(value))
        for item in value:
            write_element(out, item)

    return read, write


# --- structs ---------------------------------------------------------------------------------


def _default(field: dict, version: int) -> Any:
    kind = field["type"]
    raw = field.get("default")
    nullable = _in(field.get("nullableVersions"), version)
    if raw == "null":
        return None
    if kind.startswith("[]"):
        return []
    if kind in _INTS:
        if raw is None:
            return 0
        if kind == "float64":
            return float(raw)
        return raw if isinstance(raw, int) else int(raw, 0)
    if kind == "bool":
        return raw in ("true", True)
    if kind == "string":
        return raw if raw is not None else ""
    if kind in ("bytes", "records"):
        return None if nullable else b""
    if kind == "uuid":
        return None
    return None if nullable else {}  # a struct: its own defaults


class _Struct:
    """The compiled fields of one struct at one version."""

    __slots__ = ("absent", "defaults", "fields", "flexible", "tagged")

    def __init__(self) -> None:
        self.fields: list[tuple[str, Reader, Writer, Any]] = []
        self.tagged: dict[int, tuple[str, Reader, Writer, Any]] = {}
        self.defaults: dict[str, Any] = {}
        # Fields this version does not carry, read as their defaults (as Kafka's generated
        # messages have every field at every version): a handler reads a v4 Fetch's
        # current_leader_epoch as -1, not a KeyError answered UNKNOWN_SERVER_ERROR.
        self.absent: list[tuple[str, Any]] = []
        self.flexible = False

    def read(self, buf: bytes, pos: int) -> tuple[dict, int]:
        out = {}
        for name, value in self.absent:
            # A fresh list or dict per read: a decoded body is the caller's to keep.
            out[name] = value.copy() if isinstance(value, list | dict) else value
        for name, read, _, _ in self.fields:
            out[name], pos = read(buf, pos)
        if self.flexible:
            count, pos = read_uvarint(buf, pos)
            for _ in range(count):
                tag, pos = read_uvarint(buf, pos)
                size, pos = read_uvarint(buf, pos)
                end = pos + size
                if end > len(buf):
                    raise KafkaDecodeError("tagged field cut off")
                known = self.tagged.get(tag)
                if known is not None:
                    out[known[0]], at = known[1](buf, pos)
                    if at != end:
                        raise KafkaDecodeError(f"tagged field {tag} has the wrong size")
                pos = end
            for tag_name, value in self.defaults.items():
                out.setdefault(tag_name, value)
        return out, pos

    def write(self, out: bytearray, value: dict) -> None:
        get = value.get
        for name, _, write, default in self.fields:
            write(out, get(name, default))
        if self.flexible:
            present = []
            for tag, (name, _, write, default) in sorted(self.tagged.items()):
                v = get(name, default)
                if v != default:
                    body = bytearray()
                    write(body, v)
                    present.append((tag, body))
            write_uvarint(out, len(present))
            for tag, body in present:
                write_uvarint(out, tag)
                write_uvarint(out, len(body))
                out += body


def _compile_struct(fields: list[dict], version: int, flexible: bool, common: dict) -> _Struct:
    compiled = _Struct()
    compiled.flexible = flexible
    for field in fields:
        if not _in(field.get("versions"), version):
            compiled.absent.append((snake(field["name"]), _default(field, version)))
            continue
        name = snake(field["name"])
        codec = _field_codec(field, version, flexible, common)
        default = _default(field, version)
        if flexible and _in(field.get("taggedVersions"), version):
            compiled.tagged[field["tag"]] = (name, *codec, default)
            compiled.defaults[name] = default
        else:
            compiled.fields.append((name, *codec, default))
    return compiled


def _field_codec(field: dict, version: int, flexible: bool, common: dict) -> tuple[Reader, Writer]:
    kind = field["type"]
    nullable = _in(field.get("nullableVersions"), version)
    # A field may opt out of compact encoding (the request header's client id does).
    compact = flexible and (
        "flexibleVersions" not in field or _in(field["flexibleVersions"], version)
    )
    if kind.startswith("[]"):
        inner = kind[2:]
        if inner in _INTS or inner in ("string", "bool", "uuid", "bytes"):
            element = _field_codec(
                {**field, "type": inner, "nullableVersions": None}, version, flexible, common
            )
        else:
            element = _struct_codec(field, inner, version, flexible, common)
        return _array_codec(element, compact, nullable)
    if kind in _INTS:
        return _fixed(_INTS[kind])
    if kind == "bool":
        return _read_bool, _write_bool
    if kind == "uuid":
        return _read_uuid, _write_uuid
    if kind in ("string", "bytes", "records"):
        return _bytes_codec(kind, compact, nullable)
    reader, writer = _struct_codec(field, kind, version, flexible, common)
    if not nullable:
        return reader, writer

    def read(buf: bytes, pos: int) -> tuple[Any, int]:  # nullable struct: int8 marker first
        marker = buf[pos]
        if marker == 0xFF:
            return None, pos + 1
        return reader(buf, pos + 1)

    def write(out: bytearray, value: Any) -> None:
        if value is None:
            out.append(0xFF)
        else:
            out.append(1)
            writer(out, value)

    return read, write


def _struct_codec(
    field: dict, kind: str, version: int, flexible: bool, common: dict
) -> tuple[Reader, Writer]:
    fields = field.get("fields") or common.get(kind)
    if fields is None:
        raise ValueError(f"spec type {kind!r} is neither a primitive nor a known struct")
    compiled = _compile_struct(fields, version, flexible, common)
    return compiled.read, compiled.write


class MessageCodec:
    """One API's request or response body at one version."""

    __slots__ = ("_struct", "api_key", "flexible", "name", "version")

    def __init__(self, spec: dict, version: int) -> None:
        self.name = spec["name"]
        self.api_key = spec.get("apiKey", -1)  # -1: a "data" spec (ConsumerProtocol...)
        self.version = version
        self.flexible = _in(spec.get("flexibleVersions"), version)
        common = {c["name"]: c["fields"] for c in spec.get("commonStructs", ())}
        self._struct = _compile_struct(spec["fields"], version, self.flexible, common)

    def read(self, buf: bytes, pos: int = 0) -> tuple[dict, int]:
        """The body at ``buf[pos:]`` and where it ends (bytes after it are the caller's)."""
        try:
            return self._struct.read(buf, pos)
        except ProtocolError:
            raise
        except Exception as exc:  # struct.error, IndexError, ValueError on hostile bytes
            raise KafkaDecodeError(f"{self.name} v{self.version}: {type(exc).__name__}") from None

    def decode(self, buf: bytes, pos: int = 0) -> dict:
        """The body at ``buf[pos:]``, which it must use up exactly."""
        body, end = self.read(buf, pos)
        if end != len(buf):
            raise KafkaDecodeError(
                f"{self.name} v{self.version}: {len(buf) - end} bytes left after the body"
            )
        return body

    def encode_into(self, out: bytearray, body: dict) -> None:
        self._struct.write(out, body)

    def encode(self, body: dict) -> bytes:
        out = bytearray()
        self._struct.write(out, body)
        return bytes(out)


def valid_versions(name: str) -> tuple[int, int]:
    low, _, high = _spec(name)["validVersions"].partition("-")
    return int(low), int(high or low)


@cache
def _spec(name: str) -> dict:
    return load_spec(name)


@cache
def message_codec(name: str, version: int) -> MessageCodec:
    """``message_codec("ProduceRequest", 8)``: compiled once, then shared."""
    spec = _spec(name)
    if not _in(spec["validVersions"], version):
        raise ValueError(f"{name} has no version {version}")
    return MessageCodec(spec, version)
