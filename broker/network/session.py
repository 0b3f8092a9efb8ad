"""What the broker knows about one client connection, handed to every request handler.

Kafka's RequestChannel.Request carries the connection's session (principal, client
address) to the handlers; this is ours. The network layer creates one per
connection and marks it closed when the peer goes away; handlers read who is
asking (``principal``: the authenticated broker id of a cluster peer, None for a
plain client) and may register cleanups that must run when the connection ends.
"""

from __future__ import annotations

from collections.abc import Callable


class ConnectionSession:
    __slots__ = ("_on_close", "closed", "peer", "principal", "throttle_hook")

    def __init__(self, peer: str) -> None:
        self.peer = peer
        # Authenticated cluster member (broker id), set by the authentication handshake.
        self.principal: int | None = None
        self.closed = False
        self._on_close: list[Callable[[], None]] = []
        # Set by the network layer: ``throttle_hook(True)`` mutes the connection for a
        # quota's throttle, ``(False)`` ends one (broker/quota/throttle.py calls both).
        self.throttle_hook: Callable[[bool], None] | None = None

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the connection ends (at once if it already has)."""
        if self.closed:
            callback()
        else:
            self._on_close.append(callback)

    def close(self) -> None:
        """Called once by the network layer; cleanups run in registration order."""
        if self.closed:
            return
        self.closed = True
        callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            callback()
