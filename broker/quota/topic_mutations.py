"""One CreateTopics, CreatePartitions or DeleteTopics request under ``controller_mutation_rate``
(KIP-599; the bucket and its strict/permissive rules: mutation.py), for both listeners.

Each topic spends the partitions it would create or delete, in request order, before the
request goes to the controller: a topic the strict quota refuses is answered
THROTTLING_QUOTA_EXCEEDED and never sent, the others are. Kafka counts at the controller
after validation; here the broker the client asked counts (stock admin clients send
these requests to the controller Metadata names) and leaves out what its metadata
already shows will fail (a topic that exists, or does not, or would not grow), so the
partitions counted are those the controller would create or delete.

The native listener counts its own clients' requests here (:func:`count_native`); the
Kafka listener counts in its handlers (broker/kafka/), where each topic is translated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minibroker.broker.metadata.image import ClusterMetadata
from minibroker.broker.network.pending import then
from minibroker.broker.network.session import ConnectionSession
from minibroker.broker.quota.mutation import MutationQuota
from minibroker.broker.quota.service import ClientQuotas, with_throttle
from minibroker.protocol import ApiKey, RequestHeader
from minibroker.protocol.errors import ErrorCode

THROTTLED = int(ErrorCode.THROTTLING_QUOTA_EXCEEDED)
THROTTLED_MESSAGE = "The throttling quota has been exceeded."  # Kafka's Errors message
# The native versions that know the refusal (older ones are throttled permissively).
NATIVE_STRICT_SINCE = {
    ApiKey.CREATE_TOPICS: 1,
    ApiKey.CREATE_PARTITIONS: 1,
    ApiKey.DELETE_TOPICS: 1,
}
MUTATING_APIS = frozenset(NATIVE_STRICT_SINCE)


class Mutations:
    """One request's controller mutation quota (none: nothing to count or throttle)."""

    __slots__ = ("quota", "quotas", "session")

    def __init__(
        self,
        quotas: ClientQuotas | None,
        client_id: str | None,
        strict: bool,
        session: ConnectionSession,
    ) -> None:
        self.quotas = quotas
        self.session = session
        self.quota: MutationQuota | None = (
            None if quotas is None else quotas.mutation_quota(session, client_id, strict)
        )

    def admit(self, permits: int) -> bool:
        """Spend one topic's ``permits`` partitions; False: refuse it (strict, in debt)."""
        quota = self.quota
        if quota is None or permits <= 0:
            return True
        return quota.record(permits, self.quotas.clock.now_ms())  # type: ignore[union-attr]

    def answer(self, out: dict) -> dict:
        """``out`` with the throttle the quota gives now; the connection muted for it."""
        if self.quota is None:
            return out
        throttle = self.quotas.mutation_throttle(self.session, self.quota)  # type: ignore[union-attr]
        return with_throttle(out, throttle) if throttle else out


def created(topic: dict, md: ClusterMetadata, default_partitions: int) -> int:
    """The partitions a CreateTopics topic (the native request's shape) would create."""
    if topic["name"] in md.topics:
        return 0
    if topic.get("assignments"):
        return len(topic["assignments"])
    count = topic["num_partitions"]
    return default_partitions if count == -1 else count


def added(name: str, count: int, md: ClusterMetadata) -> int:
    """The partitions a CreatePartitions topic growing to ``count`` would add."""
    known = md.topics.get(name)
    return 0 if known is None else count - len(known.partitions)


def deleted(name: str, md: ClusterMetadata) -> int:
    """The partitions a DeleteTopics topic would delete."""
    known = md.topics.get(name)
    return 0 if known is None else len(known.partitions)


def refusal(name: str) -> dict:
    return {"name": name, "error_code": THROTTLED, "error_message": THROTTLED_MESSAGE}


# api key -> (the request's list of topics, the answer's list of results)
_LISTS = {
    ApiKey.CREATE_TOPICS: ("topics", "topics"),
    ApiKey.CREATE_PARTITIONS: ("topics", "results"),
    ApiKey.DELETE_TOPICS: ("topic_names", "responses"),
}


def _permits(api_key: int, topic: Any, md: ClusterMetadata, default_partitions: int) -> int:
    if api_key == ApiKey.CREATE_TOPICS:
        return created(topic, md, default_partitions)
    if api_key == ApiKey.CREATE_PARTITIONS:
        return added(topic["name"], topic["count"], md)
    return deleted(topic, md)  # DeleteTopics names its topics


def count_native(
    quotas: ClientQuotas,
    md: ClusterMetadata,
    default_partitions: int,
    header: RequestHeader,
    body: dict,
    session: ConnectionSession,
    dispatch: Callable[[dict], Any],
) -> Any:
    """A native topic-changing request counted against its client's quota: the topics
    admitted go to ``dispatch``, the refused ones join its answer, which carries the
    throttle (from v1; v0 is throttled by the mute alone)."""
    asked, answered = _LISTS[header.api_key]
    strict = header.api_version >= NATIVE_STRICT_SINCE[header.api_key]
    mutations = Mutations(quotas, header.client_id, strict, session)
    if mutations.quota is None:
        return dispatch(body)
    admitted, refused = [], []
    for topic in body[asked]:
        if mutations.admit(_permits(header.api_key, topic, md, default_partitions)):
            admitted.append(topic)
        else:
            refused.append(refusal(topic if type(topic) is str else topic["name"]))
    result = dispatch({**body, asked: admitted}) if admitted else {answered: []}

    def answer(out: dict) -> dict:
        if answered in out:
            out = {**out, answered: out[answered] + refused}
        return mutations.answer(out)

    return then(result, answer)
