"""Fault injection for tests (only with ``faults.enable=true``).

Faults act on *this* broker: as a follower it can delay or drop its replica
fetches (so its leader sees it lag, shrink the ISR, time out acks=all); as a server
it can delay the responses of one API, or answer the next N requests of an API
with an error code. ``clear`` restores normal service.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from protocol.api import FAULT_ACTIONS
from protocol.errors import ErrorCode


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

    def matches_partition(self, key: tuple[str, int]) -> bool:
        return (self.topic is None or self.topic == key[0]) and self.partition in (-1, key[1])


class FaultInjector:
    def __init__(self) -> None:
        self.faults: list[Fault] = []

    def apply(self, request: dict) -> list[dict]:
        action = request["action"]
        if action not in FAULT_ACTIONS:
            raise FaultError(
                f"unknown fault action {action!r}; use one of {', '.join(FAULT_ACTIONS)}"
            )
        if action == "clear":
            self.faults.clear()
            return []
        fault = Fault(**request)
        if action in ("delay-replication", "delay-api") and fault.delay_ms <= 0:
            raise FaultError(f"{action} needs delay_ms > 0")
        if action in ("delay-api", "fail-api") and fault.api_key < 0:
            raise FaultError(f"{action} needs an api_key")
        if action == "fail-api" and (
            fault.error_code == 0 or ErrorCode.parse(fault.error_code) != fault.error_code
        ):
            raise FaultError(f"fail-api needs a known non-zero error_code, got {fault.error_code}")
        self.faults.append(fault)
        return self.describe()

    def describe(self) -> list[dict]:
        return [asdict(f) for f in self.faults]

    # --- queried on the hot paths (cheap when there are no faults) -------------------------

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

    def api_delay(self, api_key: int) -> int:
        if not self.faults:
            return 0
        return max(
            (f.delay_ms for f in self.faults if f.action == "delay-api" and f.api_key == api_key),
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
