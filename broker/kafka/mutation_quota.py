"""``controller_mutation_rate`` on the Kafka listener's CreateTopics, CreatePartitions and
DeleteTopics: which versions are strict (the counting itself, shared with the native
listener: broker/quota/topic_mutations.py)."""

from __future__ import annotations

from minibroker.broker.network.session import ConnectionSession
from minibroker.broker.quota import ClientQuotas
from minibroker.broker.quota.topic_mutations import Mutations
from minibroker.protocol.kafka import KafkaApi, KafkaRequestHeader

# Kafka's ControllerApis: the first version of each API that answers THROTTLING_QUOTA_EXCEEDED
# (older ones are throttled permissively: accepted, then the answer delayed).
STRICT_SINCE = {KafkaApi.CREATE_TOPICS: 6, KafkaApi.CREATE_PARTITIONS: 3, KafkaApi.DELETE_TOPICS: 5}


def kafka_mutations(
    quotas: ClientQuotas | None, header: KafkaRequestHeader, session: ConnectionSession
) -> Mutations:
    strict = header.api_version >= STRICT_SINCE[header.api_key]
    return Mutations(quotas, header.client_id, strict, session)
