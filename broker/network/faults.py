"""Fault injection for tests (only with ``faults.enable=true``).

Faults act on *this* broker: as a follower it can delay or drop its replica
fetches (so its leader sees it lag, shrink the ISR, time out acks=all); as a server
it can delay the responses of one API (``delay-api``: handled at once, answered
late), hold one API's requests before handling them (``delay-request``: a slow link
in, so the answer reflects the broker's state when the request finally lands, e.g. a
Heartbeat judged against a generation that moved on while it was held), or answer the
next N requests of an API with an error code; ``isolate`` makes it drop, unanswered, every request from the
named peer brokers (one side of a network partition: the CLI isolates both sides).
``clear`` restores normal service.

A dropped request is never processed. It is held, unanswered, until its connection
closes or the isolation is lifted; then it is answered NETWORK_EXCEPTION. While the
partition lasts that is a lost packet; at the heal it is TCP's retransmission reaching
a server that lost the request, so the peer retries at once instead of waiting out a
30 s fetch timeout.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from minibroker.broker.network.pending import PendingResponse
from minibroker.broker.network.session import ConnectionSession
from minibroker.protocol.api import FAULT_ACTIONS
from minibroker.protocol.errors import ErrorCode


class FaultError(ValueError):
    """A fault request that does not make sense; the message says why."""


@dataclass(slots=True)
class Fault:
    action: str
    topic: str | None = None
    partition: int = -1
    delay_ms: int = 0
    api_key: int = -1
    error_code: int = 0
    count: int = -1  # -1: until cleared
    brokers: tuple[int, ...] = ()  # isolate: the peers cut off

    def __post_init__(self) -> None:
        self.brokers = tuple(sorted(set(self.brokers)))

    def matches_partition(self, key: tuple[str, int]) -> bool:
        return (self.topic is None or self.topic == key[0]) and self.partition in (-1, key[1])


class FaultInjector:
    def __init__(self) -> None:
        self.faults: list[Fault] = []
        # The union of every isolate fault's peers, kept apart so the per-request check
        # is one set lookup.
        self.isolated: frozenset[int] = frozenset()
        # Dropped requests, by the peer that sent them: answered once it is reachable again.
        self._held: dict[PendingResponse, int] = {}

    def apply(self, request: dict, self_id: int | None = None) -> list[dict]:
        action = request["action"]
        if action not in FAULT_ACTIONS:
            raise FaultError(
                f"unknown fault action {action!r}; use one of {', '.join(FAULT_ACTIONS)}"
            )
        if action == "clear":
            self._clear(request.get("brokers") or ())
            return self.describe()
        fault = Fault(**request)
        if action == "isolate":
            if not fault.brokers:
                raise FaultError("isolate needs the ids of the brokers to cut off (brokers)")
            if self_id in fault.brokers:
                raise FaultError(f"broker {self_id} cannot be isolated from itself")
        if action in ("delay-replication", "delay-api", "delay-request") and fault.delay_ms <= 0:
            raise FaultError(f"{action} needs delay_ms > 0")
        if action in ("delay-api", "delay-request", "fail-api") and fault.api_key < 0:
            raise FaultError(f"{action} needs an api_key")
        if action == "fail-api" and (
            fault.error_code == 0 or ErrorCode.parse(fault.error_code) != fault.error_code
        ):
            raise FaultError(f"fail-api needs a known non-zero error_code, got {fault.error_code}")
        self.faults.append(fault)
        self._isolated_changed()
        return self.describe()

    def _clear(self, peers: tuple[int, ...] | list[int]) -> None:
        """Everything; or, given peers, only the isolation from those peers."""
        if not peers:
            self.faults.clear()
        else:
            lifted = set(peers)
            for f in list(self.faults):
                if f.action == "isolate":
                    f.brokers = tuple(b for b in f.brokers if b not in lifted)
                    if not f.brokers:
                        self.faults.remove(f)
        self._isolated_changed()

    def _isolated_changed(self) -> None:
        self.isolated = frozenset(
            b for f in self.faults if f.action == "isolate" for b in f.brokers
        )
        for pending, peer in list(self._held.items()):
            if peer not in self.isolated:
                del self._held[pending]
                pending.set(
                    {
                        "error_code": int(ErrorCode.NETWORK_EXCEPTION),
                        "error_message": f"request from broker {peer} was lost to fault isolate",
                    }
                )

    def describe(self) -> list[dict]:
        return [{**asdict(f), "brokers": list(f.brokers)} for f in self.faults]

    # --- queried on the hot paths (cheap when there are no faults) -------------------------

    def drops(self, peer: int | None) -> bool:
        """True if a request from broker ``peer`` (None: not a broker) must go unanswered."""
        return peer is not None and peer in self.isolated

    def hold(self, peer: int, session: ConnectionSession) -> PendingResponse:
        """The never-processed request's answer: none until ``peer`` is reachable again."""
        pending = PendingResponse()
        self._held[pending] = peer
        session.on_close(lambda: self._held.pop(pending, None))
        return pending

    def replication(self, key: tuple[str, int]) -> tuple[int, bool]:
        """(delay_ms, drop) for this broker's fetches of ``key`` as a follower."""
        if not self.faults:
            return 0, False
        delay = 0
        drop = False
        for f in self.faults:
            if f.matches_partition(key):
                if f.action == "delay-replication":
                    delay = max(delay, f.delay_ms)
                elif f.action == "drop-replication":
                    drop = True
        return delay, drop

    def api_delay(self, api_key: int, action: str = "delay-api") -> int:
        """How long to hold this API's answers (``delay-api``) or, with ``action=
        "delay-request"``, its requests before they are handled."""
        if not self.faults:
            return 0
        return max(
            (f.delay_ms for f in self.faults if f.action == action and f.api_key == api_key),
            default=0,
        )

    def take_failure(self, api_key: int) -> int:
        """The error code to answer this request with (consuming one of N), or 0."""
        if not self.faults:
            return 0
        for f in self.faults:
            if f.action == "fail-api" and f.api_key == api_key and f.count != 0:
                if f.count > 0:
                    f.count -= 1
                    if f.count == 0:
                        self.faults.remove(f)
                return f.error_code
        return 0
