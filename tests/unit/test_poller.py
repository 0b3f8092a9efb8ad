"""The poller contract (broker/network/poller.py), held by every backend this OS has.

Each backend runs the same checks on real sockets. kqueue, which Linux lacks, runs them
against a model of the kernel's EVFILT_READ (macOS's semantics, the stricter ones): the
model stands in for the OS, the backend's own logic is what is tested.
"""

from __future__ import annotations

import os
import select
import socket
import sys
from types import SimpleNamespace

import pytest
import trio

from minibroker.broker.common.config import ConfigError
from minibroker.broker.network.poller import (
    POLLER_ENV,
    KqueuePoller,
    available_backends,
    choose_backend,
    open_poller,
)


class _Pair:
    """A socket the poller watches (``fd``) and the client's end of it."""

    def __init__(self) -> None:
        self.ours, self.theirs = socket.socketpair()
        self.ours.setblocking(False)
        self.fd = self.ours.fileno()

    def send(self, data: bytes) -> None:
        self.theirs.sendall(data)

    def hang_up(self) -> None:
        self.theirs.close()

    def read(self) -> bytes:
        return self.ours.recv(1 << 16)

    def close(self) -> None:
        self.ours.close()
        self.theirs.close()


# --- a model of kqueue's EVFILT_READ on sockets, for systems without kqueue -------------

_EV_ADD, _EV_DELETE, _EV_CLEAR, _EV_EOF = 0x1, 0x2, 0x20, 0x8000
_NOTE_LOWAT, _HIWAT = 0x1, 8192


class _ModelSocket:
    def __init__(self, kernel: _ModelKernel, fd: int) -> None:
        self.kernel, self.fd = kernel, fd
        self.buffered = 0
        self.eof = False

    def send(self, data: bytes) -> None:
        self.buffered = min(_HIWAT, self.buffered + len(data))
        self.kernel.activate(self.fd)

    def hang_up(self) -> None:
        self.eof = True
        self.kernel.activate(self.fd)

    def read(self) -> bytes:
        data, self.buffered = b"x" * self.buffered, 0
        return data

    def close(self) -> None:
        pass


class _ModelKernel:
    """kevent(2) for read filters: level-triggered unless EV_CLEAR (then reported once
    per activation); NOTE_LOWAT capped at the buffer size as macOS does; EV_EOF first."""

    def __init__(self) -> None:
        self.sockets: dict[int, _ModelSocket] = {}
        self.filters: dict[int, SimpleNamespace] = {}

    def socket(self, fd: int) -> _ModelSocket:
        self.sockets[fd] = _ModelSocket(self, fd)
        return self.sockets[fd]

    def activate(self, fd: int) -> None:
        if fd in self.filters:
            self.filters[fd].active = True

    def fires(self, fd: int, knote: SimpleNamespace) -> int | None:
        sock = self.sockets.get(fd)
        if sock is None:  # the wake-up pipe, a real descriptor
            readable = bool(select.select([fd], [], [], 0)[0])
            return 0 if readable else None
        if knote.clear and not knote.active:
            return None
        if sock.eof:
            return _EV_EOF
        low = min(knote.lowat, _HIWAT) if knote.lowat else 1
        return 0 if sock.buffered >= low else None

    def control(self, changes, max_events, timeout=None):
        for ev in changes or ():
            if ev.flags & _EV_DELETE:
                if ev.ident not in self.filters:
                    raise FileNotFoundError(2, "No such file or directory")
                del self.filters[ev.ident]
            if ev.flags & _EV_ADD:
                lowat = ev.data if ev.fflags & _NOTE_LOWAT else 0
                self.filters[ev.ident] = SimpleNamespace(
                    clear=bool(ev.flags & _EV_CLEAR), lowat=lowat, active=True
                )
        out = []
        for fd, knote in list(self.filters.items())[:]:
            flags = self.fires(fd, knote)
            if flags is not None and len(out) < max_events:
                knote.active = False
                out.append(SimpleNamespace(ident=fd, flags=flags))
        # Ready knotes go to the back of the queue, as the kernel's do.
        for ev in out:
            self.filters[ev.ident] = self.filters.pop(ev.ident)
        return out


def _model_select(kernel: _ModelKernel) -> SimpleNamespace:
    return SimpleNamespace(
        kqueue=lambda: SimpleNamespace(control=kernel.control, fileno=lambda: -1, close=lambda: 0),
        kevent=lambda ident, filter, flags, fflags=0, data=0: SimpleNamespace(
            ident=ident, filter=filter, flags=flags, fflags=fflags, data=data
        ),
        KQ_FILTER_READ=-1,
        KQ_EV_ADD=_EV_ADD,
        KQ_EV_DELETE=_EV_DELETE,
        KQ_EV_CLEAR=_EV_CLEAR,
        KQ_EV_EOF=_EV_EOF,
        KQ_NOTE_LOWAT=_NOTE_LOWAT,
    )


class _Harness:
    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.pairs: list = []
        if backend == "kqueue-model":
            self.kernel = _ModelKernel()
            self.poller = KqueuePoller(_model_select(self.kernel))
        else:
            self.poller = open_poller(backend)

    def socket(self):
        if self.backend == "kqueue-model":
            pair = self.kernel.socket(1000 + len(self.pairs))
        else:
            pair = _Pair()
        self.pairs.append(pair)
        self.poller.register(pair.fd)
        return pair

    def ready(self, max_events: int = 256) -> set[int]:
        return {fd for fd, _ in self.poller.poll(max_events)}

    def close(self) -> None:
        for pair in self.pairs:
            self.poller.unregister(pair.fd)
            pair.close()
        self.poller.close()


@pytest.fixture(params=[*available_backends(), "kqueue-model"])
def harness(request):
    h = _Harness(request.param)
    yield h
    h.close()


def test_a_readable_socket_is_reported_until_read(harness):
    sock = harness.socket()
    assert harness.ready() == set()
    sock.send(b"request")
    assert harness.ready() == {sock.fd}
    assert harness.ready() == {sock.fd}  # level-triggered: nothing is lost between passes
    assert sock.read()
    assert harness.ready() == set()


def test_a_muted_socket_is_reported_only_when_its_client_hangs_up(harness):
    sock, other = harness.socket(), harness.socket()
    harness.poller.mute(sock.fd)
    for _ in range(3):  # more requests, up to a full buffer: not read, not reported
        sock.send(b"r" * 4096)
        assert harness.ready() == set()
    other.send(b"request")
    assert harness.ready() == {other.fd}
    sock.hang_up()
    assert harness.ready() == {sock.fd, other.fd}
    harness.poller.unmute(sock.fd)
    assert harness.ready() == {sock.fd, other.fd}


def test_an_unmuted_socket_is_read_again(harness):
    sock = harness.socket()
    harness.poller.mute(sock.fd)
    sock.send(b"request")
    assert harness.ready() == set()
    harness.poller.unmute(sock.fd)
    assert harness.ready() == {sock.fd}


def test_a_pass_is_bounded_and_the_next_passes_reach_every_ready_socket(harness):
    socks = [harness.socket() for _ in range(10)]
    for sock in socks:
        sock.send(b"request")
    seen: set[int] = set()
    for _ in range(4):
        ready = harness.poller.poll(3)
        assert 1 <= len(ready) <= 3
        seen |= {fd for fd, _ in ready}
    assert seen == {sock.fd for sock in socks}


def test_wake_reports_the_wakeup_descriptor_once(harness):
    poller = harness.poller
    poller.wake()
    poller.wake()
    assert harness.ready() == {poller.wakeup_fd}
    poller.woken()
    assert harness.ready() == set()


@pytest.mark.parametrize("backend", available_backends())
async def test_wait_returns_for_data_a_wake_and_a_socket_registered_meanwhile(backend):
    h = _Harness(backend)
    try:
        poller = h.poller
        first = h.socket()
        first.send(b"request")
        with trio.fail_after(5):
            await poller.wait()
        first.read()

        async def then(action) -> None:
            await trio.sleep(0.05)  # the waiter is asleep by then (a thread, for poll)
            action()

        for action in (poller.wake, lambda: h.socket().send(b"request")):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(then, action)
                with trio.fail_after(5):
                    await poller.wait()
            assert h.ready()
            poller.woken()
    finally:
        h.close()


async def test_a_poll_waiter_cancelled_at_shutdown_returns_and_stops_its_thread():
    poller = open_poller("poll")
    try:
        with trio.fail_after(5):
            with trio.move_on_after(0.05) as cancelled:
                await poller.wait()  # nothing will ever be ready
        assert cancelled.cancelled_caught
        # The abandoned thread's poll() is ended through the pipe, not left forever.
        assert select.select([poller.wakeup_fd], [], [], 0)[0]
    finally:
        poller.close()


def test_the_backend_is_chosen_by_env_then_config(monkeypatch):
    monkeypatch.delenv(POLLER_ENV, raising=False)
    best = available_backends()[0]
    assert best == ("epoll" if sys.platform == "linux" else best)
    assert choose_backend() == best
    assert choose_backend("poll") == "poll"
    monkeypatch.setenv(POLLER_ENV, "poll")
    assert choose_backend("auto") == "poll"
    monkeypatch.setenv(POLLER_ENV, "select")
    with pytest.raises(ConfigError, match=r"\$MINIBROKER_POLLER: 'select' is not one of"):
        choose_backend()
    monkeypatch.delenv(POLLER_ENV)
    missing = [b for b in ("epoll", "kqueue") if b not in available_backends()]
    with pytest.raises(ConfigError, match=f"config 'socket.poller': '{missing[0]}' is not"):
        choose_backend(missing[0])
    assert os.environ.get(POLLER_ENV) is None


def test_kqueue_a_muted_full_socket_does_not_keep_the_queue_ready():
    """macOS caps NOTE_LOWAT at the buffer size, so a muted socket whose buffer is full
    fires once; EV_CLEAR keeps it from firing again (the reactor would spin on it)."""
    h = _Harness("kqueue-model")
    try:
        sock = h.socket()
        h.poller.mute(sock.fd)
        sock.send(b"r" * _HIWAT)
        assert h.ready() == set()  # fired, dropped by the backend
        assert h.kernel.control(None, 256) == []  # and not pending any more
        sock.hang_up()
        assert h.ready() == {sock.fd}
    finally:
        h.close()
