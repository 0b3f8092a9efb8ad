"""The client's exceptions, named after Kafka's error codes: ``client.errors.RequestTimedOut``.

Every error code has exactly one class, exported here under its own name (no aliases),
plus their bases: ``KafkaError`` (each has ``.code`` and ``.retriable``) and
``ProtocolError`` (bytes that are not minibroker's protocol). They are the classes of
``protocol.errors``, so ``except client.errors.NotEnoughReplicas`` catches what the
client raises.
"""

from minibroker.protocol.errors import _BY_CODE, ErrorCode, KafkaError, ProtocolError, error_class

__all__ = ["ErrorCode", "KafkaError", "ProtocolError", "error_class"]

for _cls in _BY_CODE.values():
    globals()[_cls.__name__] = _cls
    __all__.append(_cls.__name__)
del _cls
