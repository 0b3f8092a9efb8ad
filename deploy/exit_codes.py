"""`minibroker`'s exit statuses: one table, read by the commands, `--help` and docs/cli.md.

A script tells "you asked for something wrong" (1: fix the command) from "the cluster
could not do it" (2: look at the cluster, retry later) by the status alone. The rule
for an error code: Kafka's retriable codes are the cluster's state (no broker answered,
no leader or coordinator yet, too few in-sync replicas, a timeout), except
UNKNOWN_TOPIC_OR_PARTITION / UNKNOWN_TOPIC_ID, which Kafka retries because a topic may
be on its way but which a command line means as "no such topic".
"""

from __future__ import annotations

import signal
import textwrap

from minibroker.protocol.errors import ErrorCode, KafkaError

OK = 0
USER_ERROR = 1
CLUSTER_ERROR = 2  # also argparse's status for a command line it cannot parse
NOT_DELIVERED = 3
INTERRUPTED = 128 + signal.SIGINT
TERMINATED = 128 + signal.SIGTERM
CLOSED_PIPE = 128 + signal.SIGPIPE

# (status, meaning): the table `minibroker --help` prints and docs/cli.md carries.
TABLE: tuple[tuple[str, str], ...] = (
    (str(OK), "success"),
    (
        str(USER_ERROR),
        "user error: no such topic or group, a name taken, a bad setting or value; fix the command",
    ),
    (
        str(CLUSTER_ERROR),
        "cluster or usage error: no broker answered (or a Kafka port was given), a "
        "timeout, no leader or coordinator, a cluster command that failed; or a command "
        "line that does not parse",
    ),
    (str(NOT_DELIVERED), "partial delivery: produce could not deliver some records"),
    (
        f"{INTERRUPTED}/{TERMINATED}",
        "interrupted by Ctrl-C (SIGINT) / SIGTERM, after the command's clean-up",
    ),
    (str(CLOSED_PIPE), "stdout's reader left early (a `head` after the pipe), as coreutils do"),
)

_NOT_CLUSTER = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC_ID})


def of(exc: BaseException) -> int:
    """The status a command ends with when ``exc`` stopped it."""
    if isinstance(exc, KafkaError):
        cluster = exc.retriable and exc.code not in _NOT_CLUSTER
        return CLUSTER_ERROR if cluster else USER_ERROR
    if isinstance(exc, OSError):
        return CLUSTER_ERROR  # a socket or file the command could not use
    return USER_ERROR


def epilog() -> str:
    """The table as `minibroker --help` prints it (argparse keeps the line breaks with
    RawDescriptionHelpFormatter)."""
    width = max(len(status) for status, _ in TABLE)
    lines = ["exit status:"]
    for status, meaning in TABLE:
        wrapped = textwrap.wrap(meaning, 88 - width)
        lines.append(f"  {status.ljust(width)}  {wrapped[0]}")
        lines += [f"  {'':{width}}  {more}" for more in wrapped[1:]]
    return "\n".join(lines)


def markdown() -> str:
    """The table as docs/cli.md carries it (tests/unit/test_cli_help.py compares)."""
    lines = ["| Status | Meaning |", "|---|---|"]
    lines += [f"| {status} | {meaning} |" for status, meaning in TABLE]
    return "\n".join(lines)
