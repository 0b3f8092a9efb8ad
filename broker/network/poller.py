"""The readiness poller under the broker's selector loop, one backend per OS family.

The reactor (broker/network/socket_server.py) needs five things from the OS: watch a
socket for requests, stop reading a full connection (*mute*) while still noticing that
its client hung up, report ready sockets a bounded pass at a time, sleep in trio until
something is ready, and be woken by the trio thread. The stdlib ``selectors`` module
cannot do the first three (no bound on a pass, no mute under kqueue), so:

- ``epoll`` (Linux): muted = ``EPOLLRDHUP`` only; ``poll(0, n)`` is the bounded pass.
- ``kqueue`` (macOS, BSD): a disabled filter reports nothing, not even ``EV_EOF``, so a
  muted socket keeps its read filter with a low-water mark no buffer reaches
  (``NOTE_LOWAT``) and ``EV_CLEAR``: it fires for end-of-file, and at most once per
  change otherwise (macOS caps the mark at the buffer size), which the backend drops;
  ``control(None, n, 0)`` is the bounded pass.
- ``poll`` (any POSIX): ``select.poll`` with ``POLLRDHUP`` where the OS has it (Linux);
  without it a muted socket shows only ``POLLHUP``/``POLLERR`` (a reset, not a FIN).
  It has no descriptor for trio to wait on, so a worker thread blocks in ``poll()``.

The contract every backend keeps: ``poll(n)`` returns at most ``n`` ``(fd, events)``
pairs, and a pair for a muted socket always means its peer is gone. Wake-ups are a
self-pipe (POSIX; Linux's eventfd is not on macOS): one write when the reactor must run
with nothing readable, and nothing at all on the hot path.
"""

from __future__ import annotations

import os
import select
import sys
from functools import partial
from typing import Protocol

import trio

from minibroker.broker.common.config import ConfigError

POLLER_ENV = "MINIBROKER_POLLER"
BACKENDS = ("epoll", "kqueue", "poll")


class Poller(Protocol):
    name: str
    wakeup_fd: int

    def register(self, fd: int) -> None: ...
    def unregister(self, fd: int) -> None: ...
    def mute(self, fd: int) -> None: ...
    def unmute(self, fd: int) -> None: ...
    def poll(self, max_events: int) -> list[tuple[int, int]]: ...
    async def wait(self) -> None: ...
    def wake(self) -> None: ...
    def woken(self) -> None: ...
    def close(self) -> None: ...


def available_backends() -> tuple[str, ...]:
    """The backends this OS has, in order of preference."""
    return tuple(name for name in BACKENDS if hasattr(select, name))


def choose_backend(configured: str = "auto") -> str:
    """``$MINIBROKER_POLLER`` first (so a test run can force one for every broker it
    starts), then ``socket.poller``; ``auto`` takes the best this OS has."""
    name = os.environ.get(POLLER_ENV) or configured
    source = f"${POLLER_ENV}" if os.environ.get(POLLER_ENV) else "config 'socket.poller'"
    if name == "auto":
        return available_backends()[0]
    if name not in BACKENDS:
        raise ConfigError(f"{source}: {name!r} is not one of auto, {', '.join(BACKENDS)}")
    if name not in available_backends():
        raise ConfigError(
            f"{source}: {name!r} is not available on {sys.platform} "
            f"(available: {', '.join(available_backends())})"
        )
    return name


def open_poller(name: str) -> Poller:
    return {"epoll": EpollPoller, "kqueue": KqueuePoller, "poll": PollPoller}[name]()


class _Waker:
    """The self-pipe: ``wake`` makes ``wakeup_fd`` readable, ``woken`` empties it."""

    def __init__(self) -> None:
        self.wakeup_fd, self._wake_w = os.pipe()  # non-inheritable already
        os.set_blocking(self.wakeup_fd, False)
        os.set_blocking(self._wake_w, False)

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:  # full: the reactor will run anyway
            pass

    def woken(self) -> None:
        try:
            while os.read(self.wakeup_fd, 4096):
                pass
        except BlockingIOError:
            pass

    def _close_waker(self) -> None:
        os.close(self.wakeup_fd)
        os.close(self._wake_w)


class EpollPoller(_Waker):
    """Level-triggered epoll; each socket registered once, muted by modify()."""

    name = "epoll"

    def __init__(self) -> None:
        super().__init__()
        self._epoll = select.epoll()
        self._fd = self._epoll.fileno()
        self._epoll.register(self.wakeup_fd, select.EPOLLIN)
        # trio sleeps on the epoll descriptor itself: readable when any socket is ready.
        self.wait = partial(trio.lowlevel.wait_readable, self._fd)
        epoll = self._epoll
        # The epoll calls themselves, arguments bound (no Python frame): the reactor calls
        # poll once a pass, and these are all it does between two requests.
        self.poll = partial(epoll.poll, 0)
        self.register = partial(epoll.register, eventmask=select.EPOLLIN)
        self.unmute = partial(epoll.modify, eventmask=select.EPOLLIN)
        # Not readable, but still reporting a FIN (EPOLLHUP and EPOLLERR always are).
        self.mute = partial(epoll.modify, eventmask=select.EPOLLRDHUP)

    def unregister(self, fd: int) -> None:
        try:
            self._epoll.unregister(fd)
        except OSError:
            pass

    def close(self) -> None:
        self._epoll.close()
        self._close_waker()


# A low-water mark no receive buffer reaches: a muted socket's read filter fires for
# end-of-file only (FreeBSD); macOS caps it at the buffer's size, so a full buffer fires
# too, once per change thanks to EV_CLEAR, and the backend drops that report.
_MUTED_LOWAT = 2**31 - 1


class KqueuePoller(_Waker):
    """kqueue with one EVFILT_READ per socket, level-triggered while read, re-added
    edge-triggered with an unreachable low-water mark while muted.

    ``select_module`` is for tests on systems without kqueue: anything with the same
    names (``kqueue``, ``kevent``, the ``KQ_*`` constants) drives it.
    """

    name = "kqueue"

    def __init__(self, select_module=select) -> None:
        super().__init__()
        s = select_module
        self._s = s
        self._kq = s.kqueue()
        self._fd = self._kq.fileno()
        self._control = self._kq.control
        self._muted: set[int] = set()
        self._control([s.kevent(self.wakeup_fd, s.KQ_FILTER_READ, s.KQ_EV_ADD)], 0)
        # A kqueue is itself readable when an event is pending: trio (on kqueue too) waits
        # on it as on any descriptor.
        self.wait = partial(trio.lowlevel.wait_readable, self._fd)

    def _read_filter(self, fd: int, flags: int, fflags: int = 0, data: int = 0):
        s = self._s
        return s.kevent(fd, s.KQ_FILTER_READ, flags, fflags, data)

    def register(self, fd: int) -> None:
        self._control([self._read_filter(fd, self._s.KQ_EV_ADD)], 0)

    def unregister(self, fd: int) -> None:
        self._muted.discard(fd)
        try:
            self._control([self._read_filter(fd, self._s.KQ_EV_DELETE)], 0)
        except OSError:
            pass

    def mute(self, fd: int) -> None:
        # EV_ADD on an existing filter keeps its EV_CLEAR-ness: delete and re-add, in one
        # kevent() call.
        s = self._s
        self._muted.add(fd)
        self._control(
            [
                self._read_filter(fd, s.KQ_EV_DELETE),
                self._read_filter(fd, s.KQ_EV_ADD | s.KQ_EV_CLEAR, s.KQ_NOTE_LOWAT, _MUTED_LOWAT),
            ],
            0,
        )

    def unmute(self, fd: int) -> None:
        s = self._s
        self._muted.discard(fd)
        self._control(
            [self._read_filter(fd, s.KQ_EV_DELETE), self._read_filter(fd, s.KQ_EV_ADD)], 0
        )

    def poll(self, max_events: int) -> list[tuple[int, int]]:
        muted = self._muted
        eof = self._s.KQ_EV_EOF
        return [
            (ev.ident, ev.flags)
            for ev in self._control(None, max_events, 0)
            if ev.flags & eof or ev.ident not in muted
        ]

    def close(self) -> None:
        self._kq.close()
        self._close_waker()


class PollPoller(_Waker):
    """``select.poll``: the plain backend. A pass rotates through the ready sockets
    (poll() lists them in registration order, and a bounded pass must not starve the
    last ones); waiting is a worker thread blocked in ``poll()``, woken through the pipe
    when the set of readable sockets grows while it sleeps."""

    name = "poll"

    def __init__(self) -> None:
        super().__init__()
        self._poll = select.poll()
        self._in = select.POLLIN
        self._muted_mask = getattr(select, "POLLRDHUP", 0)  # HUP/ERR/NVAL: always
        self._poll.register(self.wakeup_fd, self._in)
        self._blocked = False  # a worker thread is inside poll(); it sees no changes
        self._turn = 0

    def register(self, fd: int) -> None:
        self._poll.register(fd, self._in)
        if self._blocked:
            self.wake()

    def unregister(self, fd: int) -> None:
        try:
            self._poll.unregister(fd)
        except KeyError:
            pass
        if self._blocked:
            # A poll() in progress holds the socket open (Linux): the close that follows
            # would send no FIN until it returns.
            self.wake()

    def mute(self, fd: int) -> None:
        self._poll.modify(fd, self._muted_mask)

    def unmute(self, fd: int) -> None:
        self._poll.modify(fd, self._in)
        if self._blocked:
            self.wake()

    def poll(self, max_events: int) -> list[tuple[int, int]]:
        ready = self._poll.poll(0)
        if len(ready) <= max_events:
            return ready
        start = self._turn % len(ready)
        self._turn = start + max_events
        return (ready[start:] + ready[:start])[:max_events]

    async def wait(self) -> None:
        # Registering while the thread sleeps is safe (CPython rebuilds poll()'s array at
        # the next call), and wakes it so the new socket is watched. Cancelled (shutdown),
        # the thread is abandoned and the pipe ends its poll().
        self._blocked = True
        try:
            await trio.to_thread.run_sync(self._poll.poll, None, abandon_on_cancel=True)
        except trio.Cancelled:
            self.wake()
            raise
        finally:
            self._blocked = False

    def close(self) -> None:
        self._close_waker()
