"""The CLI's signal handling before a command runs: a signal is noted, never raised."""

from __future__ import annotations

import os
import signal

import pytest

from minibroker.deploy import interrupt


@pytest.fixture
def cli_handlers(monkeypatch):
    saved = {s: signal.getsignal(s) for s in interrupt.SIGNALS}
    monkeypatch.setattr(interrupt, "_NOTED", [])
    interrupt.note_signals()
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_starting_is_noted_not_raised(cli_handlers, signum, status):
    # Raised, it could land in an import (CPython then kills the process with SIGINT at
    # exit) or in a weakref callback (printed, and the command runs on).
    assert interrupt.noted_status() is None
    os.kill(os.getpid(), signum)
    signal.sigtimedwait([], 0)  # a checkpoint: the Python handler has run by here
    assert interrupt.noted_status() == status


def test_a_command_signalled_while_starting_is_never_started(cli_handlers):
    started = []

    async def command() -> int:
        started.append(True)
        return 0

    os.kill(os.getpid(), signal.SIGTERM)
    signal.sigtimedwait([], 0)
    assert interrupt.run(command) == 143
    assert started == []


def test_commands_that_run_trio_themselves_get_pythons_own_sigint_back(cli_handlers):
    interrupt.default_signals()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
