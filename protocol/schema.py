"""A tiny strict schema language for message bodies.

Decoding validates types and ranges and fills optional fields with their
defaults, so handlers get complete dicts and never see a wrong type. Failures
raise ``InvalidRequest`` naming the path (``topics[0].partitions[2].partition``).

Validators are plain closures (fast to call), but ``struct``, ``nullable`` and ``array``
keep what they were built from as attributes (``fields``/``optional``, ``inner``, ``item``),
so a test can check another description of a message (the quorum's dataclasses) against
its schema field by field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minibroker.protocol.errors import InvalidRequest

Validator = Callable[[Any, str], Any]

_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}


# Validation errors quote the request (paths, map keys, unknown field names): a hostile
# body with a million unknown keys made an 8 MB error message. Every schema error is
# built by _fail, so it is cut here, once, to a few hundred characters.
MAX_ERROR_CHARS = 300


def bounded(message: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``message`` cut to ``limit`` characters, saying how many were left out."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}... ({len(message) - limit} more)"


# The path an array or a mapping gives its elements while checking them: none. Naming
# each one (``topics[17].partitions[2].fetch_offset``) cost a string per element and
# field: a follower's Fetch of 240 partitions took 785 us to check, 620 without. The
# error path pays instead: an array or mapping whose content failed checks it again
# with the names and raises what that finds (a check is pure: it finds the same failure).
NESTED = None


def _fail(path: str | None, what: str) -> InvalidRequest:
    return InvalidRequest(bounded(f"{path or 'body'}: {what}"))


def integer(kind: str = "int32", *, min: int | None = None, max: int | None = None) -> Validator:
    lo, hi = _INT_RANGES[kind]
    if min is not None:
        lo = min
    if max is not None:
        hi = max

    def check(value: Any, path: str) -> int:
        # bool is an int subclass in Python; msgpack true/false is not a number.
        if type(value) is not int:
            raise _fail(path, f"expected {kind}, got {type(value).__name__}")
        if not lo <= value <= hi:
            raise _fail(path, f"{value} is outside [{lo}, {hi}]")
        return value

    return check


def float64() -> Validator:
    """A finite number (Kafka's float64: quota values); an int is taken as one."""

    def check(value: Any, path: str) -> float:
        if type(value) is not float and type(value) is not int:
            raise _fail(path, f"expected float64, got {type(value).__name__}")
        if value != value or value in (float("inf"), float("-inf")):
            raise _fail(path, f"{value} is not a finite number")
        return float(value)

    return check


def boolean() -> Validator:
    def check(value: Any, path: str) -> bool:
        if type(value) is not bool:
            raise _fail(path, f"expected bool, got {type(value).__name__}")
        return value

    return check


def string(*, max_len: int = 32767) -> Validator:
    def check(value: Any, path: str) -> str:
        if type(value) is not str:
            raise _fail(path, f"expected string, got {type(value).__name__}")
        if len(value) > max_len:
            raise _fail(path, f"string longer than {max_len}")
        return value

    return check


def binary(*, max_len: int | None = None) -> Validator:
    def check(value: Any, path: str) -> bytes:
        # Decoded msgpack is always bytes; a bytearray is a body built in the broker (its
        # Kafka listener hands its native produce a CheckedBatches: protocol/batch.py).
        if type(value) is not bytes and not isinstance(value, bytearray):
            raise _fail(path, f"expected bytes, got {type(value).__name__}")
        if max_len is not None and len(value) > max_len:
            raise _fail(path, f"bytes longer than {max_len}")
        return value

    return check


def nullable(inner: Validator) -> Validator:
    def check(value: Any, path: str) -> Any:
        return None if value is None else inner(value, path)

    check.inner = inner
    return check


def array(item: Validator, *, max_len: int = 1_000_000) -> Validator:
    def check(value: Any, path: str) -> list:
        if type(value) is not list:
            raise _fail(path, f"expected array, got {type(value).__name__}")
        if len(value) > max_len:
            raise _fail(path, f"array longer than {max_len}")
        try:
            return [item(v, NESTED) for v in value]
        except InvalidRequest:
            if path is NESTED:
                raise
            for i, v in enumerate(value):  # again, to name the element that failed
                item(v, f"{path}[{i}]")
            raise

    check.item = item
    return check


def mapping(key: Validator, value: Validator) -> Validator:
    def check(obj: Any, path: str) -> dict:
        if type(obj) is not dict:
            raise _fail(path, f"expected map, got {type(obj).__name__}")
        try:
            return {key(k, NESTED): value(v, NESTED) for k, v in obj.items()}
        except InvalidRequest:
            if path is NESTED:
                raise
            for k, v in obj.items():  # again, to name the entry that failed
                key(k, f"{path}.<key>")
                value(v, f"{path}.{k}")
            raise

    return check


_REQUIRED = object()


def struct(
    fields: dict[str, Validator], optional: dict[str, tuple[Validator, Any]] | None = None
) -> Validator:
    """A msgpack map with exactly these keys; ``optional`` maps name -> (validator, default)."""
    optional = optional or {}
    known = set(fields) | set(optional)

    def check(value: Any, path: str) -> dict:
        if type(value) is not dict:
            raise _fail(path, f"expected map, got {type(value).__name__}")
        # Named only when its container names it (at the top, or checking again after a
        # failure: see NESTED); nested, its fields are checked without names.
        prefix = NESTED if path is NESTED else f"{path}." if path else ""
        out = {}
        for name, validate in fields.items():
            if name not in value:
                raise _fail(path, f"missing field '{name}'")
            out[name] = validate(value[name], NESTED if prefix is NESTED else prefix + name)
        for name, (validate, default) in optional.items():
            raw = value.get(name, _REQUIRED)
            if raw is not _REQUIRED:
                default = validate(raw, NESTED if prefix is NESTED else prefix + name)
            out[name] = default
        if len(value) > len(out) or not known.issuperset(value):
            extra = sorted(str(k) for k in value if k not in known)
            raise _fail(path, f"unknown field(s) {', '.join(extra)}")
        return out

    check.fields, check.optional = fields, optional
    return check


def narrow(schema: Validator, value: Any) -> Any:
    """``value`` (valid for a newer version) with only the keys ``schema`` knows, at every
    depth: a newer version's answer in an older version's shape, for a peer that asked in
    the older one (whose schema rejects unknown keys). Only structs lose keys; the rest
    passes through as it is."""
    fields = getattr(schema, "fields", None)
    if fields is not None and type(value) is dict:
        known = {**fields, **{name: v for name, (v, _) in schema.optional.items()}}
        return {k: narrow(known[k], v) for k, v in value.items() if k in known}
    item = getattr(schema, "item", None)
    if item is not None and type(value) is list:
        return [narrow(item, v) for v in value]
    inner = getattr(schema, "inner", None)
    if inner is not None and value is not None:
        return narrow(inner, value)
    return value


def anything() -> Validator:
    return lambda value, path: value


INT8 = integer("int8")
INT16 = integer("int16")
INT32 = integer("int32")
INT64 = integer("int64")
FLOAT64 = float64()
BOOL = boolean()
STRING = string()
BYTES = binary()
