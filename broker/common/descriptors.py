"""Every file descriptor a broker opens, budgeted from its RLIMIT_NOFILE.

A broker opens descriptors for its partitions (each one's active segment log; indexes
are opened only to be written, sealed segments share a small cache), for connections
in (clients and the other brokers) and out (one replica-fetch link per leader it
follows, the controller and quorum links), and for itself (std streams, the poller and
its wake-up pipe, trio's wake-up socket pair, the listener, the data-dir lock, the
quorum's log, checkpoint files while written, the one file the segment flusher
thread is fsyncing, a spare kept to refuse connections at the limit). Connections
and partitions draw on one shared budget: the controller refuses a partition over the
partition cap (which leaves a floor of connections), and
the acceptor stops accepting when the descriptors left would not cover the partitions
open now plus a headroom for ones still to open. So the default admits as many
connections as the limit allows (a fixed quarter for connections held 15,000 of a
20,000 limit for partitions that did not exist). EMFILE is what is left to handle,
never the usual way to learn the limit.

At start a broker raises its soft limit to the hard one (``raise_fd_limit``), as a
server is expected to; ``MINIBROKER_NOFILE_LIMIT=n`` instead sets both to ``n``, for
tests and for trying what a smaller machine would hold.
"""

from __future__ import annotations

import os
import resource
from typing import NamedTuple

from minibroker.broker.common.config import ConfigError

# Sealed segments' log files kept open at once, over all partitions of the process.
SEALED_OPEN = 64
# The broker's own descriptors (see the module docstring), with room to spare.
BASE_FDS = 48
# Outgoing links to each other broker: replica fetch (one per leader, leader_link.py),
# the controller's (requests, ISR changes) and the quorum's (fetch, control) lanes.
OUTGOING_PER_PEER = 5
FDS_PER_PARTITION = 1
# Connections the partition cap always leaves (this fraction of the rest, at least
# MIN_CONNECTIONS), and descriptors connections always leave for partitions still to
# open (this fraction, at least MIN_HEADROOM).
CONNECTION_FLOOR_SHARE = 16
MIN_CONNECTIONS = 16
HEADROOM_SHARE = 64
MIN_HEADROOM = 16

NOFILE_ENV = "MINIBROKER_NOFILE_LIMIT"


class DescriptorBudget(NamedTuple):
    limit: int
    reserved: int  # the broker's own and its outgoing links
    connections: int  # max.connections: configured, or all the limit allows
    partitions: int  # partition replicas this broker may host
    headroom: int  # kept from connections for partitions still to open

    @property
    def connection_floor(self) -> int:
        """Connections the partition cap leaves room for, whatever is open."""
        return max(1, self.limit - self.reserved - self.headroom - self.partitions)

    def connection_room(self, open_partitions: int) -> int:
        """Connections allowed while ``open_partitions`` are open: never fewer than the
        floor, never more than ``connections``."""
        room = self.limit - self.reserved - self.headroom - open_partitions * FDS_PER_PARTITION
        return min(self.connections, max(room, self.connection_floor))


def fd_limit() -> int:
    """This process's soft RLIMIT_NOFILE (a large number when unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 2**31 - 1 if soft == resource.RLIM_INFINITY else soft


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard one (or set both to $MINIBROKER_NOFILE_LIMIT);
    the (before, after) soft limits. A process may always raise its soft limit that far."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = os.environ.get(NOFILE_ENV, "").strip()
    if wanted:
        if not wanted.isdigit() or int(wanted) < 64:
            raise ConfigError(f"{NOFILE_ENV}={wanted!r}: give a whole number of descriptors >= 64")
        target = int(wanted) if hard == resource.RLIM_INFINITY else min(int(wanted), hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, target))
    elif soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return soft, fd_limit()


def descriptor_budget(
    brokers: int, max_connections: int = -1, limit: int | None = None
) -> DescriptorBudget:
    """How ``limit`` descriptors split for a broker in a cluster of ``brokers``."""
    limit = fd_limit() if limit is None else limit
    reserved = BASE_FDS + SEALED_OPEN + OUTGOING_PER_PEER * max(0, brokers - 1)
    rest = max(0, limit - reserved)
    headroom = max(MIN_HEADROOM, rest // HEADROOM_SHARE)
    floor = max(MIN_CONNECTIONS, rest // CONNECTION_FLOOR_SHARE)
    allowed = max(1, rest - headroom)
    connections = allowed if max_connections <= 0 else min(max_connections, allowed)
    partitions = max(1, rest - floor - headroom)
    return DescriptorBudget(limit, reserved, connections, partitions, headroom)


def connections_error(max_connections: int, brokers: int) -> str | None:
    """Why an explicit ``max.connections`` cannot be held under this limit (or None):
    refused at start, not cut silently."""
    budget = descriptor_budget(brokers)
    allowed = budget.limit - budget.reserved - budget.headroom
    if max_connections <= max(1, allowed):  # -1 (derived) takes what there is
        return None
    return (
        f"config 'max.connections' = {max_connections} but `ulimit -n` = {budget.limit} allows "
        f"at most {allowed} ({budget.reserved} go to the broker's own files and links, "
        f"{budget.headroom} are kept for partitions): raise `ulimit -n` (hard limit) or "
        "lower max.connections"
    )
