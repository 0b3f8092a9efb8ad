"""Ctrl-C and SIGTERM end a command quietly: exit 130 / 143, its cleanup done first.

Python's SIGINT handler raises KeyboardInterrupt wherever the main thread happens to be.
Inside ``trio.run`` that can be between a nursery's enter and exit (a client's background
nursery is opened by hand, client/background.py): a group consumer once ended in 80
lines of "Nursery stack corrupted" and left its member in the group. So while a
command's trio loop runs (:func:`run`), trio's own signal receiver hears SIGINT and
SIGTERM and turns them into cancellation:

- the first cancels the command's work: the :func:`work` scope it is in, or the whole
  command when it is in none. What follows a ``work()`` block still runs uncancelled:
  a group consumer commits and sends LeaveGroup (its group rebalances at once rather
  than after session.timeout.ms), a producer delivers the lines it has read.
- a second one cancels that cleanup too (a cluster that no longer answers).

Before a command runs (imports, argument parsing) SIGINT and SIGTERM are only noted
(:func:`note_signals`), and the command is not started: the entry point exits with the
signal's status, without a word. Raised there instead, a signal's exception could land
anywhere: inside an import (CPython then remembered a bare KeyboardInterrupt and killed
the process with SIGINT after it had exited 130) or in a weakref callback of the import
machinery, where it is printed as "Exception ignored" and the command runs on.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_status(signum: int) -> int:
    """The shell's convention for a command a signal ended: 128 + its number."""
    return 128 + signum


_NOTED: list[int] = []  # signals that came before the command's own handling took over


def note_signals() -> None:
    """From the entry point on: SIGINT and SIGTERM are noted, never raised (see above)."""
    for s in SIGNALS:
        signal.signal(s, lambda signum, _frame: _NOTED.append(signum))


def noted_status() -> int | None:
    """The status of the first signal noted so far (None: none came)."""
    return exit_status(_NOTED[0]) if _NOTED else None


def ignore_late_signals() -> None:
    """Once the command is done (its output flushed, its status known) a signal changes
    nothing: the process is exiting, and must not print a traceback on the way."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def default_signals() -> None:
    """For a command that runs without :func:`run`: SIGTERM ends it as it always did, and
    SIGINT is Python's own KeyboardInterrupt again (which trio.run knows how to deliver;
    an exception raised by our own handler inside trio's loop is the bug above)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def handles_signals(command: Callable[..., int]) -> Callable[..., int]:
    """Mark a command function that runs its trio loop through :func:`run`."""
    command.handles_signals = True  # type: ignore[attr-defined]
    return command


def handles(command: Callable[..., int]) -> bool:
    return getattr(command, "handles_signals", False)


class _Run:
    """One command's trio run: the signal that arrived, the scopes it cancels."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.command: Any = None  # trio.CancelScope of the whole command
        self.work: list[Any] = []  # the work() scopes open now

    def interrupt(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum
            if self.work:
                for scope in self.work:
                    scope.cancel()
                return
        self.command.cancel()  # a second signal, or no work() scope to stop


_RUN: ContextVar[_Run | None] = ContextVar("minibroker_interrupt_run", default=None)


@contextmanager
def work() -> Iterator[None]:
    """The part of a command the first signal cancels; the code after the block (closing
    a consumer, flushing a producer) still runs. Outside :func:`run`, no effect."""
    state = _RUN.get()
    if state is None:
        yield
        return
    import trio

    with trio.CancelScope() as scope:
        if state.signum is not None:
            scope.cancel()
        state.work.append(scope)
        try:
            yield
        finally:
            state.work.remove(scope)


def run(main: Callable[..., Awaitable[int]], *args: Any) -> int:
    """``trio.run(main, *args)``, ended by SIGINT/SIGTERM as the module docstring says:
    then 128 + the signal's number, whatever ``main`` returned."""
    import trio

    # From here until trio's receiver is open (and again after it closed) a signal is
    # only noted: raising it inside trio's loop is what this module exists to avoid.
    with held() as noted:
        noted.extend(_NOTED)  # one that came while the command was starting: not started
        if noted:
            return exit_status(noted[0])
        status = trio.run(_supervised, main, args, noted)
    return exit_status(noted[0]) if noted else status


@contextmanager
def held() -> Iterator[list[int]]:
    """SIGINT and SIGTERM arriving inside the block are only noted in the list it gives
    (then the previous handlers are back): for a clean-up that must finish, such as
    stopping the processes a command started, and around :func:`run`'s trio loop."""
    noted: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: noted.append(signum)) for s in SIGNALS}
    try:
        yield noted
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


async def _supervised(main: Callable[..., Awaitable[int]], args: tuple, noted: list[int]) -> int:
    import trio

    state = _Run()
    _RUN.set(state)

    async def listen() -> None:
        # Opened here, not around main: main may end before this task first runs.
        with trio.open_signal_receiver(*SIGNALS) as signals:
            for signum in noted:  # arrived before the receiver opened
                state.interrupt(signum)
            async for signum in signals:
                state.interrupt(signum)

    # A system task: cancelled when main returns (a signal still queued then is handed
    # back to run()'s handler), and no nursery around main, whose exceptions then reach
    # the caller as they are, not in an ExceptionGroup.
    trio.lowlevel.spawn_system_task(listen)
    status = 0  # main cancelled: the status is the signal's
    with trio.CancelScope() as state.command:
        status = await main(*args)
    if state.signum is not None:
        noted.insert(0, state.signum)
    return status
