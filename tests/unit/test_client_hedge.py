"""Hedged requests on trio's MockClock: who is asked when, who wins, what a total failure says."""

import math

import pytest
import trio

from minibroker.client.hedge import AllFailed, NoAnswer, first_answer
from minibroker.protocol.errors import InvalidRequest, NotController

HEDGE = 0.25


class Brokers:
    """Scripted addresses: each answers, fails or stays silent after a delay; records when
    it was asked and whether it was cancelled."""

    def __init__(self, **script):
        self.script = script
        self.asked: dict[str, float] = {}
        self.cancelled: set[str] = set()

    async def ask(self, name):
        self.asked[name] = trio.current_time()
        delay, outcome = self.script[name]
        try:
            await trio.sleep(delay)
        except trio.Cancelled:
            self.cancelled.add(name)
            raise
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


async def test_a_silent_first_address_costs_one_hedge_delay(autojump_clock):
    brokers = Brokers(a=(math.inf, None), b=(0.001, "from b"), c=(0.001, "from c"))
    start = trio.current_time()
    assert await first_answer("abc", brokers.ask, HEDGE) == ("b", "from b")
    assert brokers.asked["b"] - start == pytest.approx(HEDGE)
    assert "c" not in brokers.asked  # b answered before c's turn
    assert brokers.cancelled == {"a"}  # the silent attempt does not linger


async def test_a_refused_address_hands_over_at_once(autojump_clock):
    brokers = Brokers(a=(0, NoAnswer("connection refused")), b=(0.001, "ok"))
    start = trio.current_time()
    assert await first_answer("ab", brokers.ask, HEDGE) == ("b", "ok")
    assert brokers.asked["b"] == start


async def test_a_slow_answer_still_wins_when_it_comes_first(autojump_clock):
    # a answers after 0.3 s, b (asked at 0.25 s) would take a second: a wins, b is cancelled.
    brokers = Brokers(a=(0.3, "slow a"), b=(1.0, "b"))
    assert await first_answer("ab", brokers.ask, HEDGE) == ("a", "slow a")
    assert brokers.cancelled == {"b"}


async def test_every_failure_is_listed_in_the_order_asked(autojump_clock):
    brokers = Brokers(
        a=(5, NoAnswer("no answer in 5000 ms")),
        b=(0, NoAnswer("connection refused")),
        c=(0.01, NotController("ask another")),
    )
    with pytest.raises(AllFailed) as failed:
        await first_answer("abc", brokers.ask, HEDGE)
    assert [(addr, str(exc)) for addr, exc in failed.value.failures] == [
        ("b", "connection refused"),
        ("c", "NOT_CONTROLLER: ask another"),
        ("a", "no answer in 5000 ms"),
    ]


async def test_a_brokers_verdict_is_the_answer(autojump_clock):
    brokers = Brokers(a=(math.inf, None), b=(0.001, InvalidRequest("bad body")), c=(0, "never"))
    with pytest.raises(InvalidRequest, match="bad body"):
        await first_answer("abc", brokers.ask, HEDGE)
    assert brokers.cancelled == {"a"}
    assert "c" not in brokers.asked


async def test_without_hedging_the_next_address_waits_for_a_failure(autojump_clock):
    brokers = Brokers(a=(3, NoAnswer("no answer in 3000 ms")), b=(0.001, "b"))
    start = trio.current_time()
    assert await first_answer("ab", brokers.ask, math.inf) == ("b", "b")
    assert brokers.asked["b"] - start == pytest.approx(3)


async def test_no_address_is_a_failure_with_nothing_listed():
    with pytest.raises(AllFailed) as failed:
        await first_answer([], None, HEDGE)
    assert failed.value.failures == []
