"""A warm parent for broker processes: the broker is imported once, each broker is a fork.

Starting a broker as ``python -m ...broker_cli`` costs an interpreter and ~0.3-0.45 s of
CPU importing trio, structlog, msgpack, psutil and our modules, three times over on two
cores for a 3-broker cluster. The fork server pays that once: it imports the broker, then
forks one child per request, and the child runs ``broker_cli.main(argv)`` as the command
line would have. Each broker is still its own process (own pid, own session, log in its
data dir), so pause/kill/restart and the fault tools work on it as before.

Fork is safe here because the server is single-threaded and never runs a trio loop: the
child starts its own, with nothing inherited but imported modules (``random`` reseeds
itself in a forked child; ``os.register_at_fork``).

The launcher side (``spawn``) starts one server per launcher process on first use, talks
to it over a socketpair (one JSON line each way) and the server exits when the launcher
does (its end of the socket closes). The server ignores SIGCHLD, so the kernel reaps
brokers that exit; launchers watch them by pid and start time (psutil), not as children.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class ForkServerError(RuntimeError):
    """The fork server could not be started or did not answer."""


# --- the launcher's side --------------------------------------------------------------------


class ForkServer:
    """A running server process and the launcher's end of its socket."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "minibroker.deploy.forkserver", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            # Its own session: a Ctrl-C at the launcher's terminal reaches neither it nor
            # the brokers it forks.
            start_new_session=True,
        )
        theirs.close()
        self.sock = ours
        self.file = ours.makefile("rwb")
        self.lock = threading.Lock()  # a nemesis thread may restart a broker meanwhile

    def spawn(self, argv: list[str], log_path: Path, cwd: Path) -> int:
        """Fork a broker running ``broker_cli.main(argv)``; its pid."""
        # What a child of the launcher would inherit and the server's fork would not:
        # the launcher's environment and file-descriptor limit as they are now.
        request = {
            "argv": argv,
            "log": str(log_path),
            "cwd": str(cwd),
            "env": dict(os.environ),
            "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
        }
        with self.lock:
            try:
                self.file.write(json.dumps(request).encode() + b"\n")
                self.file.flush()
                line = self.file.readline()
            except OSError as exc:
                raise ForkServerError(f"the fork server is gone: {exc}") from None
        if not line:
            raise ForkServerError(f"the fork server exited (code {self.proc.poll()})")
        return int(json.loads(line)["pid"])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Close our end: the server finishes its loop and exits; brokers keep running."""
        self.file.close()
        self.sock.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


_server: ForkServer | None = None
_server_lock = threading.Lock()


def fork_server() -> ForkServer:
    """This launcher's fork server, started on first use (and again if it died)."""
    global _server
    with _server_lock:
        if _server is None or not _server.alive():
            _server = ForkServer()
        return _server


def spawn(argv: list[str], log_path: Path, cwd: Path | None = None) -> int:
    """Start a broker process from the warm parent: ``broker_cli.main(argv)``; its pid."""
    server = fork_server()
    try:
        return server.spawn(argv, log_path, cwd or Path.cwd())
    except ForkServerError:
        # Died between the check and the request (killed, say): one fresh server, once.
        return fork_server().spawn(argv, log_path, cwd or Path.cwd())


def shutdown() -> None:
    """Stop this launcher's fork server (brokers keep running); the next spawn starts a
    fresh one, importing the broker again (what a cold start measures)."""
    global _server
    with _server_lock:
        if _server is not None:
            _server.close()
            _server = None


# --- the server's side ----------------------------------------------------------------------


def _warm() -> None:
    """Import everything a broker imports, so a child imports nothing."""
    import minibroker.broker.common.config
    import minibroker.broker.common.logs
    import minibroker.broker.metadata.image
    import minibroker.broker.server
    import minibroker.deploy.broker_cli  # noqa: F401

    # Start-up's objects are shared copy-on-write with every child: keep the collector
    # from touching (and so copying) them.
    gc.collect()
    gc.freeze()


def _child(request: dict, server_sock: socket.socket) -> None:
    """In the forked child: become the broker process, never return."""
    code = 1
    try:
        server_sock.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, tuple(request["nofile"]))
        except (ValueError, OSError) as exc:  # a hard limit above the server's, unprivileged
            print(f"fork server: keeping the file limit: {exc}", file=sys.stderr)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(devnull)
        os.close(log)
        from minibroker.deploy.broker_cli import main

        code = main(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(fd: int) -> None:
    _warm()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # exited brokers are reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    stream = sock.makefile("rwb")
    for line in stream:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, sock)
        stream.write(json.dumps({"pid": pid}).encode() + b"\n")
        stream.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
