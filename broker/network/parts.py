"""An answer frame in parts: bytes, and segment file regions sent with ``os.sendfile``.

Kafka's FileRecords.writeTo: a follower's Fetch answer (every replicated byte) goes from
the page cache to the socket, never read into Python, packed into the answer, joined
into a frame and written back (four copies of the records, each a pass over them in
this process). The encoder (protocol.encode_response_parts) leaves each region's
``bin`` header at the end of the bytes part before it, so the parts sent in order are
exactly the frame ``encode_response`` would make.

``len()`` is what is left to send, as for a frame the outbox sliced after a short
write: the outbox counts queued bytes with it.
"""

from __future__ import annotations

import errno
import os

from minibroker.broker.common.file_region import FileRegion


class PartsFrame:
    __slots__ = ("_at", "_done", "_parts", "remaining")

    def __init__(self, parts: list) -> None:
        self._parts = parts
        self._at = 0  # the part being sent
        self._done = 0  # bytes of it sent already
        self.remaining = sum(map(len, parts))

    def __len__(self) -> int:
        return self.remaining

    def send(self, fd: int) -> bool:
        """Send what the non-blocking socket ``fd`` takes now; True once all is sent.

        False when the socket is full (call again when it is writable). OSError when the
        peer is gone, or when a region's file ended early (truncated under the send: the
        frame can never be completed, so the connection must close).
        """
        parts = self._parts
        while self._at < len(parts):
            part = parts[self._at]
            done = self._done
            try:
                if type(part) is FileRegion:
                    sent = os.sendfile(fd, part.fd, part.position + done, part.size - done)
                    if not sent:
                        raise OSError(errno.EIO, "segment file ended before its region: truncated")
                elif done:
                    sent = os.write(fd, memoryview(part)[done:])
                else:
                    sent = os.write(fd, part) if part else 0
            except BlockingIOError:
                return False
            self.remaining -= sent
            if done + sent < len(part):
                self._done = done + sent
                return False  # a short send: the socket is full
            parts[self._at] = None  # a region's descriptor closes as soon as it is sent
            self._at += 1
            self._done = 0
        return True

    def flatten(self) -> bytes:
        """What is left, as bytes: for a stream without a descriptor (tests' memory streams)."""
        parts = self._parts[self._at :]
        if not parts:
            return b""
        data = b"".join(p.read() if type(p) is FileRegion else bytes(p) for p in parts)
        return data[self._done :]
