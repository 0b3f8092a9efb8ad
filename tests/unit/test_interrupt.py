"""The CLI's signal handlers outside trio: what they raise decides the exit status."""

from __future__ import annotations

import os
import signal

import pytest

from minibroker.deploy import interrupt


@pytest.fixture
def cli_handlers():
    saved = {s: signal.getsignal(s) for s in interrupt.SIGNALS}
    interrupt.raise_on_signals()
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.parametrize(
    ("signum", "raised", "status"),
    [(signal.SIGINT, interrupt.Interrupted, 130), (signal.SIGTERM, interrupt.Terminated, 143)],
)
def test_a_signal_raises_a_keyboard_interrupt_subclass_with_the_shells_status(
    cli_handlers, signum, raised, status
):
    with pytest.raises(KeyboardInterrupt) as caught:
        os.kill(os.getpid(), signum)
        signal.sigtimedwait([], 0)  # a checkpoint: the Python handler runs by here
    # Never KeyboardInterrupt itself: CPython remembers one that left any code it ran
    # and ends the process with SIGINT at exit (-2), whatever status the CLI chose.
    assert type(caught.value) is raised
    assert interrupt.status_of(caught.value) == status


def test_commands_that_run_trio_themselves_get_pythons_own_sigint_back(cli_handlers):
    interrupt.default_signals()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
