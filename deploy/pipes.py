"""A closed stdout (``minibroker cluster status | head -1``) ends a command quietly.

Python ignores SIGPIPE, so a write to a pipe whose reader has gone raises
BrokenPipeError, and the interpreter's last flush of stdout reports it once more on
the way out. Coreutils die of SIGPIPE instead: no message, and the shell sees exit
status 141 (128 + SIGPIPE), which ``set -o pipefail`` scripts may rely on. Every
``minibroker`` command runs through :func:`run_piped` to do the same.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE


def stdout_closed() -> int:
    """Point stdout at /dev/null, so no later flush fails again; the exit status to use."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_CLOSED_PIPE


def run_piped(main: Callable[[], int]) -> int:
    """``main()``'s exit status, or 141 without a word when stdout's reader left early
    (also when argparse prints --help and exits)."""
    try:
        try:
            return main()
        finally:
            sys.stdout.flush()  # inside the try: a write that fails, fails here
    except BrokenPipeError:
        return stdout_closed()
