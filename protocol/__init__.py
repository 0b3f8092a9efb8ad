"""Sans-IO wire format shared by broker and client: frames, API codecs, record batches, errors.

No sockets, no trio, no files, no clocks: bytes in, values out.
"""

from . import errors
from .api import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, ApiKey, api_name, supported_versions
from .batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    CorruptBatch,
    Record,
    check_batch,
    decode_records,
    encode_batch,
    increment_sequence,
    iter_batches,
    patch_base_offset,
    patch_leader_epoch,
    read_records,
    unpack_header,
)
from .codec import (
    RequestHeader,
    decode_request,
    decode_request_envelope,
    decode_response_envelope,
    encode_request,
    encode_response,
    error_body,
    validate_request,
    validate_response,
)
from .errors import (
    ErrorCode,
    FrameTooLarge,
    InvalidRequest,
    KafkaError,
    ProtocolError,
    UnsupportedVersion,
    error_class,
    raise_for,
)
from .framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "EARLIEST_TIMESTAMP",
    "HEADER_SIZE",
    "LATEST_TIMESTAMP",
    "LOG_OVERHEAD",
    "ApiKey",
    "BatchHeader",
    "CorruptBatch",
    "ErrorCode",
    "FrameDecoder",
    "FrameTooLarge",
    "InvalidRequest",
    "KafkaError",
    "ProtocolError",
    "Record",
    "RequestHeader",
    "UnsupportedVersion",
    "api_name",
    "check_batch",
    "decode_records",
    "decode_request",
    "decode_request_envelope",
    "decode_response_envelope",
    "encode_batch",
    "encode_frame",
    "encode_request",
    "encode_response",
    "error_body",
    "error_class",
    "errors",
    "increment_sequence",
    "iter_batches",
    "patch_base_offset",
    "patch_leader_epoch",
    "raise_for",
    "read_records",
    "supported_versions",
    "unpack_header",
    "validate_request",
    "validate_response",
]
