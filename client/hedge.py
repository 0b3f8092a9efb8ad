"""Hedged requests: when the broker asked is slow to answer, ask the next one too.

A paused (SIGSTOPped) broker is silent, not gone: its kernel still completes TCP
handshakes, so a client that asks it for metadata hears nothing until
``request.timeout.ms`` runs out, while the next broker on the list would have answered
in a millisecond. So a request that any broker can answer alike (metadata, a producer
id, stats) is sent to the first address, and to the next one as soon as an attempt
fails or after ``hedge.delay.ms`` without an answer (the "hedged request" of Dean and
Barroso's *The Tail at Scale*); the first answer wins and the other attempts are
cancelled. A request with one right address (a produce to a partition's leader) is
never hedged: it is sent where it must go, and retried after a metadata refresh.

``first_answer`` knows nothing of brokers: an attempt either returns, raises
:class:`NoAnswer` (the address was silent, refused, or spoke another protocol: try the
others) or raises what the broker said, and then that is the answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import trio

from minibroker.protocol.errors import KafkaError

A = TypeVar("A")
T = TypeVar("T")


class NoAnswer(Exception):
    """An address that gave no answer; ``reason`` says what happened, in words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AllFailed(Exception, Generic[A]):
    """No attempt answered usefully: ``failures`` holds (address, NoAnswer or KafkaError)
    for every address, in the order they were asked."""

    def __init__(self, failures: list[tuple[A, BaseException]]) -> None:
        super().__init__(f"{len(failures)} attempt(s) failed")
        self.failures = failures


class _Race(Generic[A, T]):
    """The state of one hedged request: who has answered, who has failed, and a nudge
    for the loop that starts attempts whenever one fails."""

    def __init__(self, ask: Callable[[A], Awaitable[T]]) -> None:
        self.ask = ask
        self.failures: list[tuple[A, BaseException]] = []
        self.outcome: tuple[A, T] | None = None
        self.raised: KafkaError | None = None
        self.failed = trio.Event()

    async def attempt(self, address: A, scope: trio.CancelScope) -> None:
        try:
            value = await self.ask(address)
        except NoAnswer as exc:
            self._fail(address, exc)
            return
        except KafkaError as exc:
            if exc.retriable:  # a broker said "not now" (not the controller...): try the others
                self._fail(address, exc)
                return
            self.raised = exc  # a broker's verdict: that is the answer
        else:
            self.outcome = (address, value)
        scope.cancel()

    def _fail(self, address: A, exc: BaseException) -> None:
        self.failures.append((address, exc))
        self.failed.set()


async def first_answer(
    addresses: Sequence[A], ask: Callable[[A], Awaitable[T]], hedge_delay: float
) -> tuple[A, T]:
    """``(address, answer)`` of the first attempt to answer; the others are cancelled.

    ``ask(address)`` is started for each address in order: the next one when an attempt
    has failed, or when ``hedge_delay`` seconds have passed since the last start
    without an answer (``math.inf``: only after a failure, for requests that must not
    be sent twice). A non-retriable KafkaError is a broker's answer and is raised; when
    every attempt fails, AllFailed lists how.
    """
    race: _Race[A, T] = _Race(ask)
    async with trio.open_nursery() as nursery:
        for address in addresses:
            if race.outcome is not None or race.raised is not None:
                break
            race.failed = trio.Event()
            nursery.start_soon(race.attempt, address, nursery.cancel_scope)
            with trio.move_on_after(hedge_delay):
                await race.failed.wait()
    if race.raised is not None:
        raise race.raised
    if race.outcome is None:
        raise AllFailed(race.failures)
    return race.outcome
