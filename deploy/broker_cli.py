"""`minibroker broker`: run one broker in the foreground.

Its own module, light to import: `cluster up`, the tests and the chaos run start every
broker as `python -m deploy.broker_cli ...`, which imports the broker and nothing of the
CLI's other commands (the client, Spark, the benchmarks): a few hundred ms less per
broker process, which is most of a cold start on a busy 2-core machine.
"""

from __future__ import annotations

import argparse
import errno
import resource
import sys
from collections.abc import Sequence
from pathlib import Path


class CommandError(Exception):
    """A user-facing failure: printed as one line."""


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--id", type=int, default=0, help="broker id (default 0)")
    p.add_argument(
        "--listen",
        type=parse_listen,
        default=("127.0.0.1", 9092),
        help="HOST:PORT to listen on (default 127.0.0.1:9092; anything but loopback is your explicit choice)",
    )
    p.add_argument(
        "--data-dir", type=Path, required=True, help="directory for this broker's logs and metadata"
    )
    p.add_argument("--config", type=Path, help="TOML file of broker settings (Kafka key names)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one setting (repeatable)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from minibroker.broker.common.config import ConfigError, load_config, parse_set_options
    from minibroker.broker.common.logs import configure_logging
    from minibroker.broker.metadata.image import MetadataStoreError
    from minibroker.broker.server import run_broker
    from minibroker.broker.storage.dir_lock import DataDirInUse

    try:
        config = load_config(args.config, parse_set_options(args.set))
    except ConfigError as exc:
        raise CommandError(f"{exc}; see docs/configuration.md for every key") from None
    host, port = args.listen
    logger = configure_logging(args.id, level=config["log.level"], fmt=config["log.format"])
    try:
        run_broker(args.id, host, port, args.data_dir, config, logger)
    except DataDirInUse as exc:
        raise CommandError(f"{exc}; stop it first or choose another --data-dir") from None
    except (ConfigError, MetadataStoreError, OSError, BaseExceptionGroup) as exc:
        # trio's nursery wraps a failed bind (or a refused setting) in an ExceptionGroup:
        # unwrap it to one line.
        error = _only_error(exc)
        if isinstance(error, (ConfigError, MetadataStoreError)):
            raise CommandError(str(error)) from None
        if isinstance(error, OSError):
            raise CommandError(describe_start_error(error, host, port, args.data_dir)) from None
        raise
    return 0


def _only_error(exc: BaseException) -> BaseException:
    """The one exception inside ``exc`` when that is all a group holds (a group of several
    is a real bug and stays as it is)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})
_LISTEN_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES, errno.EINVAL})


def describe_start_error(exc: OSError, host: str, port: int, data_dir: Path) -> str:
    """Name the real problem: the port, the data dir, or the file-descriptor limit."""
    reason = (exc.strerror or str(exc)).lower()
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return (
            f"too many open files (limit {soft}) while starting on {data_dir}: raise it with "
            "'ulimit -n' (a broker keeps files open for each partition's segments)"
        )
    if exc.filename is not None:  # a file operation: the data dir is the problem
        return f"cannot use data dir {data_dir}: {reason} ({exc.filename})"
    if exc.errno in _STORAGE_ERRNOS:
        # A write in the data dir (a checkpoint, a segment) that carried no file name:
        # never "cannot listen" (issue 26 found a full disk reported as a listen error).
        return (
            f"storage error in data dir {data_dir}: {reason}; its log "
            f"({data_dir / 'broker.log'} under `cluster up`) may be cut short on the same disk"
        )
    from minibroker.broker.server import ListenerBindError

    option = "--listen port"
    if isinstance(exc, ListenerBindError):  # not the broker's own port: name the right one
        host, port = exc.host, exc.port
        option = f"{exc.setting} port (--set {exc.setting}=HOST:PORT)"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is in use (another broker or program listens there): "
            f"stop it or choose another {option}"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host}:{port}: {host} is not an address of this machine"
    if exc.errno == errno.EACCES:
        return f"cannot listen on {host}:{port}: permission denied (ports below 1024 need root)"
    if exc.errno in _LISTEN_ERRNOS:
        return f"cannot listen on {host}:{port}: {reason}"
    return f"failed while starting on {data_dir}: {reason}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minibroker broker", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
