"""What this broker knows of the cluster right now (Kafka's MetadataCache).

The committed metadata it serves from, which voter is the active controller, and two
events: ``leader_known`` (fired, then replaced, whenever the controller changes: a
caller that got NOT_CONTROLLER waits on it before asking again) and ``ready`` (set once
this broker's metadata has caught up with the quorum after its start; client requests
that answer from metadata wait for it).
"""

from __future__ import annotations

import trio

from minibroker.broker.metadata.image import ClusterMetadata


class MetadataCache:
    def __init__(self) -> None:
        self.metadata = ClusterMetadata()
        # The active controller: whichever voter leads the metadata quorum (KRaft).
        self.controller_id = -1
        self.leader_known = trio.Event()
        self.ready = trio.Event()
        # Woken by each update: requests held for a topic not applied here yet wait on it.
        self.updated = trio.lowlevel.ParkingLot()

    def update(self, md: ClusterMetadata) -> None:
        """Serve ``md`` from now on; it names the controller this broker knows of."""
        md.controller_id = self.controller_id
        self.metadata = md
        self.updated.unpark_all()

    def controller_changed(self, controller_id: int) -> None:
        """The quorum named a (possibly new) controller: wake whoever waits for one."""
        if controller_id != self.controller_id:
            self.controller_id = controller_id
            self.metadata.controller_id = controller_id
            self.wake_controller_waiters()

    def wake_controller_waiters(self) -> None:
        self.leader_known.set()
        self.leader_known = trio.Event()
