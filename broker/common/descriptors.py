"""Every file descriptor a broker opens, budgeted from its RLIMIT_NOFILE.

A broker opens descriptors for its partitions (each one's active segment log; indexes
are opened only to be written, sealed segments share a small cache), for connections
in (clients and the other brokers) and out (one replica-fetch link per leader it
follows, the controller and quorum links), and for itself (std streams, the poller and
its wake-up pipe, trio's wake-up socket pair, the listener, the data-dir lock, the
quorum's log, checkpoint files while written, a spare kept to refuse connections at
the limit). One budget splits the limit between them, so partitions and connections at
their caps together still fit: the controller refuses a partition over the partition
cap, the acceptor stops at the connection cap, and EMFILE is what is left to handle,
never the usual way to learn the limit (issue 26: fetchers' own connections made
followed partitions cost 2.3 descriptors where the cap counted 1, and brokers died).
"""

from __future__ import annotations

import resource
from typing import NamedTuple

# Sealed segments' log files kept open at once, over all partitions of the process.
SEALED_OPEN = 64
# The broker's own descriptors (see the module docstring), with room to spare.
BASE_FDS = 48
# Outgoing links to each other broker: replica fetch (one per leader, leader_link.py),
# the controller's (requests, ISR changes) and the quorum's (fetch, control) lanes.
OUTGOING_PER_PEER = 5
FDS_PER_PARTITION = 1
# A derived max.connections takes this fraction of what is left, partitions the rest.
CONNECTION_SHARE = 4
MIN_CONNECTIONS = 16

_configured_connections = -1


class DescriptorBudget(NamedTuple):
    limit: int
    reserved: int  # the broker's own and its outgoing links
    connections: int  # max.connections, derived or configured
    partitions: int  # partition replicas this broker may host


def fd_limit() -> int:
    """This process's soft RLIMIT_NOFILE (a large number when unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 2**31 - 1 if soft == resource.RLIM_INFINITY else soft


def set_max_connections(configured: int) -> None:
    """The broker's ``max.connections`` (-1: derived), for budgets computed without it
    (the controller's partition cap). One broker per process."""
    global _configured_connections
    _configured_connections = configured


def descriptor_budget(
    brokers: int, max_connections: int | None = None, limit: int | None = None
) -> DescriptorBudget:
    """How ``limit`` descriptors split for a broker in a cluster of ``brokers``."""
    limit = fd_limit() if limit is None else limit
    configured = _configured_connections if max_connections is None else max_connections
    reserved = BASE_FDS + SEALED_OPEN + OUTGOING_PER_PEER * max(0, brokers - 1)
    rest = max(0, limit - reserved)
    if configured > 0:
        # A configured value may take most, never all, of what is left.
        connections = min(configured, rest - rest // CONNECTION_SHARE)
    else:
        connections = max(MIN_CONNECTIONS, rest // CONNECTION_SHARE)
    partitions = max(1, (rest - connections) // FDS_PER_PARTITION)
    return DescriptorBudget(limit, reserved, max(1, connections), partitions)
