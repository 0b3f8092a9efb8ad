"""Length-prefixed frames: 4-byte big-endian length, then that many bytes of msgpack.

The decoder is incremental (feed bytes as they arrive, get whole frames out) and
refuses a frame larger than its maximum as soon as the 4-byte header is seen,
before buffering a single byte of it.
"""

from __future__ import annotations

import struct

from minibroker.protocol.errors import FrameTooLarge, ProtocolError

_LEN = struct.Struct(">I")
FRAME_HEADER_SIZE = 4
DEFAULT_MAX_FRAME_BYTES = 104857600  # Kafka's socket.request.max.bytes
_VIEW_ABOVE = 1 << 16  # frames copied out through a memoryview (slower for small ones)


def encode_frame(payload: bytes) -> bytes:
    return _LEN.pack(len(payload)) + payload


def encode_frame_of(*parts: bytes) -> bytes:
    """The frame of the parts' concatenation, copied once."""
    return b"".join((_LEN.pack(sum(map(len, parts))), *parts))


def oversized_frame_message(header: bytes, length: int, maximum: int) -> str:
    """Why a frame header is refused. Text where a length should be (b"HTTP" reads as
    1213486160) means the peer speaks another protocol, which is what the reader must hear."""
    if all(32 <= b < 127 for b in header):
        return (
            f"the peer does not speak minibroker's protocol: it sent text ({header!r}...), "
            f"not a frame length (read as {length} bytes, over the maximum of {maximum})"
        )
    return f"frame of {length} bytes exceeds the maximum of {maximum}"


class FrameDecoder:
    """Feed raw bytes, collect complete frame payloads."""

    __slots__ = ("_buf", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed_bytes(self, data: bytes) -> list[bytes] | tuple[memoryview]:
        """``feed`` for bytes the caller will not reuse (a socket read's own ``bytes``).

        When they are exactly one whole frame and nothing is buffered (a peer's answer
        read in one go: a follower's Fetch answer, most of the bytes it replicates) the
        frame is a view into them: neither copied into the buffer nor copied out of it.
        A view, not bytes: a caller decodes it (msgpack reads any buffer) and keeps none.
        """
        if not self._buf and len(data) > FRAME_HEADER_SIZE:
            (length,) = _LEN.unpack_from(data)
            if length == len(data) - FRAME_HEADER_SIZE and length <= self.max_frame_bytes:
                return (memoryview(data)[FRAME_HEADER_SIZE:],)
        return self.feed(data)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add bytes; return every frame now complete (possibly none).

        Raises FrameTooLarge / ProtocolError for a header that can never be valid;
        after that the stream is unusable and the connection should close.
        """
        buf = self._buf
        buf += data
        frames = []
        pos = 0
        end = len(buf)
        while end - pos >= FRAME_HEADER_SIZE:
            (length,) = _LEN.unpack_from(buf, pos)
            if length > self.max_frame_bytes:
                header = bytes(buf[pos : pos + FRAME_HEADER_SIZE])
                del buf[:]
                raise FrameTooLarge(oversized_frame_message(header, length, self.max_frame_bytes))
            if length == 0:
                del buf[:]
                raise ProtocolError("empty frame")
            if end - pos - FRAME_HEADER_SIZE < length:
                break
            start = pos + FRAME_HEADER_SIZE
            if length < _VIEW_ABOVE:
                frames.append(bytes(buf[start : start + length]))
            else:
                # One copy, not two (a bytearray slice, then bytes of it): a 100 MB frame
                # held twice more for a moment is what a client could make a broker hold.
                with memoryview(buf) as view:
                    frames.append(bytes(view[start : start + length]))
            pos = start + length
        if pos:
            del buf[:pos]
        return frames
