"""Consumer groups (Kafka's classic group protocol), coordinated through the purgatory.

Each broker coordinates the groups of the ``__consumer_offsets`` partitions it leads.
Joins, syncs and per-member heartbeats wait in purgatories on the broker's one timer
(delayed.py); group state and offsets are records in that replicated topic (records.py),
so a coordinator failover is a partition leader failover plus a load (manager.py).

=====================================  ==============================================
here                                   Kafka (core/.../coordinator/group)
=====================================  ==============================================
``GroupMetadata``, ``MemberMetadata``  GroupMetadata, MemberMetadata
(group.py)
``GroupCoordinator`` (coordinator.py)  GroupCoordinator: join, sync, heartbeat, leave
``StaticMembership`` (static.py)       its static members (KIP-345): doStaticNewMemberJoin,
                                       updateStaticMemberAndRebalance
offsets.py                             handleCommitOffsets, handleFetchOffsets,
                                       handleListGroups, handleDescribeGroup(s),
                                       handleDeleteGroups
``GroupMetadataManager`` (manager.py)  GroupMetadataManager: ownership, loading,
                                       storeGroup / storeOffsets
``DelayedJoin``, ``InitialDelayedJoin``,
``DelayedHeartbeat``, ``DelayedSync``  the same names
``CoordinatorService`` (service.py)    what KafkaApis calls, plus FindCoordinator
=====================================  ==============================================
"""

from minibroker.broker.coordinator.coordinator import GroupCoordinator
from minibroker.broker.coordinator.group import GroupMetadata, GroupState, MemberMetadata
from minibroker.broker.coordinator.manager import GroupMetadataManager, partition_for
from minibroker.broker.coordinator.records import OFFSETS_TOPIC
from minibroker.broker.coordinator.service import CoordinatorService

__all__ = [
    "OFFSETS_TOPIC",
    "CoordinatorService",
    "GroupCoordinator",
    "GroupMetadata",
    "GroupMetadataManager",
    "GroupState",
    "MemberMetadata",
    "partition_for",
]
