"""WriteTxnMarkers over the authenticated inter-broker links (broker/network/peer.py): one
connection per partition leader, opened on first use and kept."""

from __future__ import annotations

from typing import Any

from minibroker.broker.network.cluster_auth import ClusterCredentials
from minibroker.broker.network.peer import PeerConnection
from minibroker.protocol import ApiKey
from minibroker.protocol.errors import NetworkException

# How long one WriteTxnMarkers may take: the leader answers once its in-sync replicas have
# the markers, within its produce timeout (Kafka's request.timeout.ms for the channel).
REQUEST_TIMEOUT_S = 30.0


class PeerMarkerSender:
    """``await sender(broker_id, body)``: the leader's answer, or a KafkaError."""

    def __init__(self, broker_id: int, credentials: ClusterCredentials | None, cache: Any) -> None:
        self.broker_id = broker_id
        self.credentials = credentials
        self.cache = cache
        self.links: dict[tuple[int, str, int], PeerConnection] = {}

    async def __call__(self, broker_id: int, body: dict) -> dict:
        broker = self.cache.metadata.brokers.get(broker_id)
        if broker is None:
            raise NetworkException(f"broker {broker_id} is not registered")
        key = (broker_id, broker.host, broker.port)
        link = self.links.get(key)
        if link is None:
            link = self.links[key] = PeerConnection(
                broker.host,
                broker.port,
                f"txn-markers-{self.broker_id}",
                credentials=self.credentials,
                peer_id=broker_id,
            )
        return await link.request(
            ApiKey.WRITE_TXN_MARKERS, body, timeout=REQUEST_TIMEOUT_S, version=1
        )
