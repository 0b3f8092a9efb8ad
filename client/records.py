"""The values users hold: records to send, topic-partitions, produced-record metadata,
consumed records."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Concatenate, NamedTuple, ParamSpec, TypeVar

Headers = list[tuple[str, bytes | None]]
HeadersIn = Mapping[str, Any] | Iterable[tuple[str, Any]] | None  # what users may pass


class ProducerRecord(NamedTuple):
    """A record to send (Kafka's ProducerRecord). Its fields, in this order, are the
    parameters of every send method: ``producer.send(*record)`` sends it.

    The value, key and header values are bytes, or str taken as UTF-8; the timestamp is
    milliseconds since the epoch (None: now); the partition None lets the partitioner pick.
    """

    topic: str
    value: bytes | str | None = None
    key: bytes | str | None = None
    partition: int | None = None
    headers: HeadersIn = None
    timestamp: int | None = None


# ProducerRecord's fields in its order, as the send methods' implementations receive them:
# a plain tuple, because building the NamedTuple would cost the per-record path ~120 ns.
RecordFields = tuple[Any, ...]

_P = ParamSpec("_P")
_S = TypeVar("_S")
_R = TypeVar("_R")


def _fields_as_parameters(
    record_type: Callable[_P, ProducerRecord],
) -> Callable[[Callable[[_S, RecordFields], _R]], Callable[Concatenate[_S, _P], _R]]:
    """A decorator: the method takes one RecordFields tuple, its callers the record's fields
    as parameters (``send(topic, value, key=None, ...)``).

    Bound to ProducerRecord once (below), so the parameter list is written once, in the
    record: a type checker reads it from the record's constructor (the ParamSpec), and
    ``help()`` and the sync facade from the function made here. The function is generated
    with real parameters, as ``collections.namedtuple`` makes ``__new__``: send_nowait is
    the producer's per-record path, and a ``*args, **kwargs`` wrapper would cost it a
    third.
    """
    hints = typing.get_type_hints(record_type)
    names = record_type._fields
    defaults = record_type._field_defaults
    fields = [
        inspect.Parameter(
            name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=defaults.get(name, inspect.Parameter.empty),
            annotation=hints[name],
        )
        for name in names
    ]
    params = ", ".join(f"{n}=_defaults[{n!r}]" if n in defaults else n for n in names)
    call = f"_method(self, ({', '.join(names)},))"

    def decorate(method: Callable[[_S, RecordFields], _R]) -> Callable[Concatenate[_S, _P], _R]:
        # A coroutine method's wrapper is a plain function returning the method's coroutine:
        # ``await producer.enqueue(...)`` is the producer's per-record path too, and an
        # ``async def`` wrapper made every record build and run two coroutines (~0.3 us,
        # 5-8 % of bench produce's client). What needs to know it is awaitable finds the
        # coroutine function through ``__wrapped__`` (``inspect.unwrap``, as the blocking
        # facade does); trio accepts any callable that returns a coroutine.
        source = f"def with_fields(self, {params}):\n    return {call}\n"
        scope = {"_method": method, "_defaults": defaults}
        exec(compile(source, f"<fields of {method.__qualname__}>", "exec"), scope)
        with_fields = functools.update_wrapper(scope["with_fields"], method)
        # Resolved now: the method's annotations are strings of its own module.
        returns = typing.get_type_hints(method).get("return", inspect.Signature.empty)
        self_param = next(iter(inspect.signature(method).parameters.values()))
        with_fields.__signature__ = inspect.Signature(
            [self_param, *fields], return_annotation=returns
        )
        with_fields.__annotations__ = {**{p.name: p.annotation for p in fields}, "return": returns}
        return with_fields

    return decorate


takes_record = _fields_as_parameters(ProducerRecord)


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed (offset -1 with acks=0: nobody told us)."""

    topic: str
    partition: int
    offset: int


# A consumed record's headers: (name, value) pairs in a tuple, () when there are none.
ConsumedHeaders = tuple[tuple[str, bytes | None], ...]
NO_HEADERS: ConsumedHeaders = ()


class ConsumerRecord(NamedTuple):
    """A record as poll() returns it: a value all the way down (headers are a tuple of
    pairs, not a list), so the record is hashable, and CPython's collector, which stops
    tracking plain tuples of atoms once it has seen them, walks one object per record a
    consumer holds in each full collection rather than two (issue 30: those walks were
    half of bench consume's CPU)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: ConsumedHeaders


def to_bytes(value: Any, what: str) -> bytes | None:
    """Records carry bytes; str is taken as UTF-8 so scripts need no serializer."""
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"record {what} must be bytes, str or None, got {type(value).__name__}")


def normalize_headers(headers: HeadersIn) -> Headers:
    """Accept a dict or (name, value) pairs; names are str, values bytes (str as UTF-8) or None."""
    if not headers:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for name, value in items:
        if not isinstance(name, str):
            raise TypeError(f"header names must be str, got {type(name).__name__}")
        out.append((name, to_bytes(value, f"header '{name}'")))
    return out
