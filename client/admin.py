"""The admin client: create, delete, list and describe topics, elect leaders, read a broker's
stats."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from minibroker.client import broker_admin, config_admin, group_admin, quota_admin, txn_admin
from minibroker.client.background import ClusterClient
from minibroker.client.cluster import BrokerInfo, Cluster, PartitionInfo
from minibroker.client.config_admin import AlterConfigOp, ConfigEntry, ConfigResource
from minibroker.client.coordinator import GROUP, CoordinatorRoute
from minibroker.client.group_admin import GroupDescription, GroupListing
from minibroker.client.offsets import (
    OffsetAndTimestamp,
    delete_records,
    list_offsets,
    lookup_retries,
)
from minibroker.client.records import TopicPartition
from minibroker.client.txn_admin import TransactionDescription, TransactionListing
from minibroker.protocol import ApiKey
from minibroker.protocol.api import ELECTION_PREFERRED, ELECTION_UNCLEAN
from minibroker.protocol.errors import (
    BrokerNotAvailable,
    KafkaError,
    NotController,
    ThrottlingQuotaExceeded,
    error_class,
    raise_for,
)

__all__ = [
    "Admin",
    "AlterConfigOp",
    "BrokerInfo",
    "ConfigEntry",
    "ConfigResource",
    "NewPartitions",
    "NewTopic",
    "PartitionInfo",
    "TopicDescription",
    "TransactionDescription",
    "TransactionListing",
]


@dataclass
class NewTopic:
    name: str
    num_partitions: int = -1  # -1: the broker's num.partitions
    replication_factor: int = -1  # -1: the broker's default.replication.factor
    configs: dict[str, str] = field(default_factory=dict)
    # One replica list per partition (the first live one leads); the counts stay -1.
    replica_assignments: list[list[int]] | None = None


@dataclass
class NewPartitions:
    """Kafka's NewPartitions.increaseTo: the topic's new partition count and, optionally,
    one replica list per new partition (None: the controller places them)."""

    total_count: int
    assignments: list[list[int]] | None = None


@dataclass(frozen=True)
class TopicDescription:
    name: str
    partitions: list[PartitionInfo]


def _outcome(results: list[dict]) -> dict[str, KafkaError | None]:
    """Per topic: None, or the error the controller named."""
    return {
        t["name"]: error_class(t["error_code"])(t.get("error_message") or t["name"])
        if t["error_code"]
        else None
        for t in results
    }


def _raise_first(outcome: dict[str, KafkaError | None], raise_errors: bool) -> None:
    if raise_errors:
        for error in outcome.values():
            if error is not None:
                raise error


class Admin(ClusterClient):
    """``async with Admin("127.0.0.1:9092") as a: await a.create_topics([NewTopic("t", 3, 1)])``."""

    ROLE = "admin"

    def _open(self) -> Cluster:
        if self._cluster is None:
            raise RuntimeError("the admin client is not open: use 'async with Admin(...) as a'")
        return self._cluster

    # --- topics ---------------------------------------------------------------------------

    async def create_topics(
        self,
        topics: Iterable[NewTopic],
        *,
        timeout_ms: int = 30000,
        validate_only: bool = False,
        wait_for_leaders: bool = True,
        raise_errors: bool = True,
        retry_on_quota_violation: bool = True,
    ) -> dict[str, KafkaError | None]:
        """Create topics through the controller; per-topic outcome (None: created).

        With ``raise_errors`` the first failure is raised (e.g. TopicAlreadyExists). With
        ``wait_for_leaders`` it returns once every new partition has a leader in the
        metadata, so producing right after does not race the metadata propagation.
        ``retry_on_quota_violation``: see ``_mutate``.
        """
        specs = {
            t.name: {
                "name": t.name,
                "num_partitions": t.num_partitions,
                "replication_factor": t.replication_factor,
                "configs": {k: str(v) for k, v in t.configs.items()},
                "assignments": t.replica_assignments,
            }
            for t in topics
        }
        outcome = await self._mutate(
            ApiKey.CREATE_TOPICS,
            lambda names, ms: {
                "topics": [specs[n] for n in names],
                "timeout_ms": ms,
                "validate_only": validate_only,
            },
            "topics",
            list(specs),
            timeout_ms,
            retry_on_quota_violation,
        )
        _raise_first(outcome, raise_errors)
        created = [name for name, error in outcome.items() if error is None]
        if wait_for_leaders and created and not validate_only:
            await self._wait_for_leaders(created, timeout_ms / 1000)
        return outcome

    async def delete_topics(
        self,
        names: Iterable[str],
        *,
        timeout_ms: int = 30000,
        wait_for_removal: bool = True,
        raise_errors: bool = True,
        retry_on_quota_violation: bool = True,
    ) -> dict[str, KafkaError | None]:
        """Delete topics through the controller (Kafka's DeleteTopics); per-topic outcome
        (None: deleted). A missing topic is UnknownTopicOrPartition; a cluster with
        ``delete.topic.enable=false`` answers TopicDeletionDisabled.

        With ``wait_for_removal`` it returns once every broker it can reach has dropped the
        topics (their replicas and files), so the name can be created again at once.
        """
        outcome = await self._mutate(
            ApiKey.DELETE_TOPICS,
            lambda names, ms: {"topic_names": names, "timeout_ms": ms},
            "responses",
            list(dict.fromkeys(names)),
            timeout_ms,
            retry_on_quota_violation,
        )
        _raise_first(outcome, raise_errors)
        deleted = [name for name, error in outcome.items() if error is None]
        if wait_for_removal and deleted:
            await self._wait_for_removal(deleted, timeout_ms / 1000)
        return outcome

    async def create_partitions(
        self,
        new_partitions: Mapping[str, int | NewPartitions],
        *,
        timeout_ms: int = 30000,
        validate_only: bool = False,
        wait_for_leaders: bool = True,
        raise_errors: bool = True,
        retry_on_quota_violation: bool = True,
    ) -> dict[str, KafkaError | None]:
        """Grow topics to a new partition count (Kafka's createPartitions); per topic None
        when grown, else its error: InvalidPartitions for a count that is not an increase,
        InvalidReplicaAssignment for assignments that do not fit, UnknownTopicOrPartition.

        Producers and consumers see the new partitions on their next metadata refresh
        (``metadata.max.age.ms``); a group subscribed to the topic rebalances then.
        """
        wanted = {
            name: spec if isinstance(spec, NewPartitions) else NewPartitions(spec)
            for name, spec in new_partitions.items()
        }
        outcome = await self._mutate(
            ApiKey.CREATE_PARTITIONS,
            lambda names, ms: {
                "topics": [
                    {
                        "name": n,
                        "count": wanted[n].total_count,
                        "assignments": wanted[n].assignments,
                    }
                    for n in names
                ],
                "timeout_ms": ms,
                "validate_only": validate_only,
            },
            "results",
            list(wanted),
            timeout_ms,
            retry_on_quota_violation,
        )
        _raise_first(outcome, raise_errors)
        grown = {n: wanted[n].total_count for n, error in outcome.items() if error is None}
        if wait_for_leaders and grown and not validate_only:
            await self._wait_for_leaders(list(grown), timeout_ms / 1000, grown)
        return outcome

    async def _mutate(
        self,
        api_key: int,
        body: Callable[[list[str], int], dict],
        results_key: str,
        names: list[str],
        timeout_ms: int,
        retry_on_quota_violation: bool,
    ) -> dict[str, KafkaError | None]:
        """Send a topic mutation to the controller; per topic its outcome.

        Topics refused THROTTLING_QUOTA_EXCEEDED (``controller_mutation_rate``, KIP-599)
        are sent again, alone, once the answer's throttle has passed, as long as that is
        within ``timeout_ms`` of the call: Kafka's Admin does so by default
        (``retryOnQuotaViolation``), so an application creating many topics is paced
        rather than failed. Past the deadline they keep the refusal. The CLI asks for it
        at once (kafka-topics.sh's choice), so a user sees what stopped them.
        """
        outcome: dict[str, KafkaError | None] = {}
        deadline = trio.current_time() + timeout_ms / 1000
        while names:
            left_ms = max(int((deadline - trio.current_time()) * 1000), 0)
            response = await self._controller_request(
                api_key, body(names, left_ms), left_ms / 1000 + 5
            )
            answered = _outcome(response[results_key])
            outcome.update(answered)
            names = [n for n, e in answered.items() if isinstance(e, ThrottlingQuotaExceeded)]
            # The connection holds the next request until the throttle has passed
            # (client/connection.py): only whether that is before the deadline is ours.
            throttle_s = response.get("throttle_time_ms", 0) / 1000
            if not retry_on_quota_violation or trio.current_time() + throttle_s >= deadline:
                break
        return outcome

    async def _wait_for_removal(self, names: list[str], timeout: float) -> None:
        """Until no reachable broker's metadata names the topics: each applies the removal
        (and deletes the files) on its own, as it reads the committed metadata log."""
        cluster = self._open()
        await cluster.refresh(())
        pending = set(cluster.brokers)
        with trio.move_on_after(timeout):
            while pending:
                for broker in sorted(pending):
                    try:
                        body = await cluster.request(broker, ApiKey.METADATA, {"topics": names})
                    except KafkaError:
                        pending.discard(broker)  # down: it drops them when it catches up
                        continue
                    if all(t["error_code"] for t in body["topics"]):
                        pending.discard(broker)
                if pending:
                    await trio.sleep(0.01)

    async def _controller_request(self, api_key: int, body: dict, timeout: float) -> dict:
        cluster = self._open()
        for attempt in range(5):
            if attempt:
                await trio.sleep(0.1 * attempt)
                await cluster.refresh(())
            controller = cluster.controller_id
            try:
                if controller in cluster.brokers:
                    try:
                        return await cluster.request(controller, api_key, body, timeout=timeout)
                    except BrokerNotAvailable:
                        pass  # the controller is down: any broker forwards to whoever took over
                # Not hedged: a create must not be sent twice while the first may still land.
                return await cluster.any_request(api_key, body, timeout=timeout, hedge=False)
            except NotController:
                continue
        raise NotController("could not find the controller (is the cluster still starting?)")

    async def _wait_for_leaders(
        self, names: list[str], timeout: float, counts: Mapping[str, int] | None = None
    ) -> None:
        """Until every new partition has a leader that itself knows it leads (or cannot be
        reached): each broker applies committed metadata on its own, so the broker that
        answers the metadata may be ahead of the leader a first produce goes to.
        ``counts``: the partition count a grown topic must show first."""
        cluster = self._open()
        with trio.move_on_after(timeout):
            while True:
                await cluster.refresh(names)
                if all(
                    (cluster.partition_count(n) or 0) >= (counts or {}).get(n, 1)
                    and all(p.leader >= 0 for p in cluster.topics[n])
                    for n in names
                ) and await self._leaders_know(names):
                    return
                await trio.sleep(0.05)

    async def _leaders_know(self, names: list[str]) -> bool:
        cluster = self._open()
        leaders: dict[int, set[tuple[str, int]]] = {}
        for n in names:
            for p in cluster.topics[n]:
                leaders.setdefault(p.leader, set()).add((n, p.partition))
        for broker, owned in leaders.items():
            try:
                body = await cluster.request(broker, ApiKey.METADATA, {"topics": names})
            except KafkaError:
                # A leader we cannot reach (a broker that died and is not fenced yet) is
                # not worth waiting for: its partitions move once the controller fences it.
                continue
            seen = {
                (t["name"], p["partition"])
                for t in body["topics"]
                for p in t.get("partitions", ())
                if p["leader"] == broker
            }
            if not owned <= seen:
                return False
        return True

    # --- leaders --------------------------------------------------------------------------

    async def elect_leaders(
        self,
        election_type: str = "preferred",
        partitions: Iterable[tuple[str, int]] | None = None,
        *,
        timeout_ms: int = 60000,
    ) -> dict[tuple[str, int], KafkaError | None]:
        """Kafka's electLeaders: per ``(topic, partition)``, None if a leader was elected, else
        the reason (ElectionNotNeeded, PreferredLeaderNotAvailable, UnknownTopicOrPartition,
        EligibleLeadersNotAvailable). Never raises for a partition: several outcomes are routine.

        ``"preferred"`` moves leadership to each partition's first replica when it is alive
        and in the ISR; ``"unclean"`` elects a leader for partitions that have none.
        ``partitions`` None: every partition; those already led as wanted are left out.
        The controller answers once the leader changes are committed.
        """
        types = {"preferred": ELECTION_PREFERRED, "unclean": ELECTION_UNCLEAN}
        if election_type.lower() not in types:
            raise ValueError(
                f"election_type must be 'preferred' or 'unclean', got {election_type!r}"
            )
        asked: dict[str, list[int]] | None = None
        if partitions is not None:
            asked = {}
            for topic, partition in partitions:
                asked.setdefault(topic, []).append(partition)
        body = {
            "election_type": types[election_type.lower()],
            "topic_partitions": None
            if asked is None
            else [{"topic": t, "partitions": ps} for t, ps in asked.items()],
            "timeout_ms": timeout_ms,
        }
        response = await self._controller_request(ApiKey.ELECT_LEADERS, body, timeout_ms / 1000 + 5)
        return {
            (t["topic"], r["partition_id"]): error_class(r["error_code"])(
                r.get("error_message") or ""
            )
            if r["error_code"]
            else None
            for t in response["replica_election_results"]
            for r in t["partition_result"]
        }

    # --- client quotas (client/quota_admin.py) ------------------------------------------------

    async def alter_client_quotas(
        self,
        entity: Mapping[str, str | None],
        add: Mapping[str, float] | None = None,
        delete: Iterable[str] = (),
        *,
        validate_only: bool = False,
    ) -> None:
        """Kafka's alterClientQuotas for one entity (``{"client-id": "app"}``; a None name
        is the default entity). Every broker applies it once the controller commits it."""
        await quota_admin.alter_client_quotas(
            self._controller_request, entity, add, delete, validate_only=validate_only
        )

    async def describe_client_quotas(
        self, components: Mapping[str, object], *, strict: bool = False
    ) -> list[tuple[dict[str, str | None], dict[str, float]]]:
        """Kafka's describeClientQuotas (``quota_admin.ANY`` matches every name)."""
        return await quota_admin.describe_client_quotas(
            self._controller_request, components, strict=strict
        )

    async def list_topics(self) -> list[str]:
        body = await self._open().refresh(None)
        return sorted(t["name"] for t in body["topics"] if not t["error_code"])

    async def describe_topics(
        self, names: Iterable[str] | None = None
    ) -> dict[str, TopicDescription]:
        """Partitions (leader, epoch, replicas, ISR) per topic; a missing topic raises."""
        cluster = self._open()
        names = None if names is None else list(names)
        await cluster.refresh(names)
        wanted = sorted(cluster.topics) if names is None else names
        out = {}
        for name in wanted:
            if name not in cluster.topics:
                raise cluster.topic_error(name, f"topic '{name}' does not exist")
            out[name] = TopicDescription(name, list(cluster.topics[name]))
        return out

    async def describe_cluster(self) -> tuple[list[BrokerInfo], int]:
        """(brokers, controller id)."""
        cluster = self._open()
        await cluster.refresh(())
        return sorted(cluster.brokers.values(), key=lambda b: b.node_id), cluster.controller_id

    async def broker_stats(self, node_id: int | None = None) -> dict[str, Any]:
        """A broker's own figures (BROKER_STATS): ``{"broker_id": .., "stats": {...}}``."""
        cluster = self._open()
        if node_id is None:
            body = await cluster.any_request(ApiKey.BROKER_STATS, {})
        else:
            if node_id not in cluster.brokers:
                await cluster.refresh(())
            if node_id not in cluster.brokers:
                raise BrokerNotAvailable(f"broker {node_id} is not in the cluster metadata")
            body = await cluster.request(node_id, ApiKey.BROKER_STATS, {})
        return {"broker_id": body["broker_id"], "stats": body["stats"]}

    async def faults(self, node_id: int, action: str, **spec: Any) -> list[dict[str, Any]]:
        """Inject or clear a fault on one broker (it must run with ``faults.enable=true``).

        ``action``: ``delay-replication`` (``delay_ms``, optional ``topic``/``partition``),
        ``drop-replication`` (optional ``topic``/``partition``), ``delay-api`` (``api_key``,
        ``delay_ms``), ``fail-api`` (``api_key``, ``error_code``, ``count``; -1 = until
        cleared) or ``clear``. Returns the broker's active faults.
        """
        cluster = self._open()
        if node_id not in cluster.brokers:
            await cluster.refresh(())
        if node_id not in cluster.brokers:
            raise BrokerNotAvailable(f"broker {node_id} is not in the cluster metadata")
        body = await cluster.request(node_id, ApiKey.FAULTS, {"action": action, **spec})
        raise_for(body["error_code"], body.get("error_message") or "")
        return body["faults"]

    # --- offsets ----------------------------------------------------------------------------

    async def list_offsets(
        self, timestamps: Mapping[tuple[str, int], int]
    ) -> dict[TopicPartition, OffsetAndTimestamp]:
        """Kafka's Admin.listOffsets: ``{tp: timestamp}`` (-2 earliest, -1 latest, else the
        first offset at or after it) -> ``{tp: (offset, timestamp)}``, from each leader."""
        wanted = {TopicPartition(*tp): ts for tp, ts in timestamps.items()}
        return await list_offsets(self._open(), wanted, **lookup_retries(self.config))

    async def delete_records(
        self, before: Mapping[tuple[str, int], int]
    ) -> dict[TopicPartition, int]:
        """Kafka's Admin.deleteRecords: ``{(topic, partition): offset}`` (-1: the high
        watermark) -> each partition's new low watermark (log start offset). Records below
        it are gone for every consumer; an offset past the high watermark raises
        OffsetOutOfRange."""
        wanted = {TopicPartition(*tp): offset for tp, offset in before.items()}
        return await delete_records(self._open(), wanted)

    async def describe_log_dirs(
        self, brokers: Iterable[int] | None = None
    ) -> dict[int, dict[str, broker_admin.LogDirDescription]]:
        """Per broker (default: all), its log directory and each replica's size on disk."""
        cluster = self._open()
        if brokers is None:
            await cluster.refresh(())
            brokers = sorted(cluster.brokers)
        return await broker_admin.describe_log_dirs(cluster, brokers)

    async def describe_producers(
        self, partitions: Iterable[tuple[str, int]]
    ) -> dict[TopicPartition, list[broker_admin.ProducerState]]:
        """Each partition's active idempotent producers (id, epoch, last sequence and
        timestamp), from its leader."""
        return await broker_admin.describe_producers(self._open(), partitions)

    # --- configs (client/config_admin.py) ----------------------------------------------------

    async def describe_configs(
        self, resources: Iterable[ConfigResource]
    ) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        """Each resource's configs by name, with each value's source (DYNAMIC_TOPIC_CONFIG,
        DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG,
        DEFAULT_CONFIG); a broker is asked about itself."""
        return await config_admin.describe(self._open(), resources)

    async def incremental_alter_configs(
        self,
        changes: Mapping[ConfigResource, Iterable[AlterConfigOp]],
        *,
        validate_only: bool = False,
        timeout_ms: int = 30000,
        raise_errors: bool = True,
    ) -> dict[ConfigResource, KafkaError | None]:
        """Kafka's incrementalAlterConfigs: set, delete, append or subtract single configs of
        topics and brokers (a bad key or value: InvalidConfig naming it). Applied live on
        every broker once committed."""
        return await config_admin.alter(
            self._controller_request, changes, validate_only=validate_only, replace=False,
            timeout_ms=timeout_ms, raise_errors=raise_errors,
        )  # fmt: skip

    async def alter_configs(
        self,
        configs: Mapping[ConfigResource, Mapping[str, str]],
        *,
        validate_only: bool = False,
        timeout_ms: int = 30000,
        raise_errors: bool = True,
    ) -> dict[ConfigResource, KafkaError | None]:
        """Kafka's (legacy) alterConfigs: each resource's whole dynamic config becomes the
        given map (configs left out return to their defaults)."""
        changes = {r: [AlterConfigOp(k, str(v)) for k, v in c.items()] for r, c in configs.items()}
        return await config_admin.alter(
            self._controller_request, changes, validate_only=validate_only, replace=True,
            timeout_ms=timeout_ms, raise_errors=raise_errors,
        )  # fmt: skip

    # --- consumer groups (client/group_admin.py) ----------------------------------------------

    async def list_consumer_groups(self) -> list[GroupListing]:
        return await group_admin.list_groups(self._open())

    async def find_coordinator(self, key: str, key_type: int = GROUP) -> int:
        """The broker that coordinates a group (key_type 0) or a transactional id (1) now:
        FindCoordinator, retried while none is available (as a client looking it up)."""
        return await CoordinatorRoute(self._open(), key, key_type, self.config).find_coordinator()

    async def describe_consumer_group(self, group_id: str) -> GroupDescription:
        """State, protocol and members with their assignments (settled only when Stable)."""
        return await group_admin.describe_group(self._open(), group_id, self.config)

    async def delete_consumer_groups(
        self, group_ids: Iterable[str]
    ) -> dict[str, KafkaError | None]:
        """Per group: None when deleted, else its error (NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND)."""
        return await group_admin.delete_groups(self._open(), group_ids, self.config)

    async def list_consumer_group_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        return await group_admin.group_offsets(self._open(), group_id, self.config)

    async def delete_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[tuple[str, int]]
    ) -> dict[TopicPartition, KafkaError | None]:
        """Kafka's deleteConsumerGroupOffsets: per partition None when its committed offset
        is gone, else GroupSubscribedToTopic (a member of the group consumes that topic)."""
        wanted = [TopicPartition(*tp) for tp in partitions]
        return await group_admin.delete_group_offsets(self._open(), group_id, wanted, self.config)

    async def alter_consumer_group_offsets(
        self, group_id: str, offsets: dict[tuple[str, int], int]
    ) -> None:
        """Set committed offsets of an empty group (the group must have no members)."""
        wanted = {TopicPartition(*tp): o for tp, o in offsets.items()}
        await group_admin.alter_group_offsets(self._open(), group_id, wanted, self.config)

    # --- transactions (client/txn_admin.py) -------------------------------------------------

    async def list_transactions(
        self,
        state_filters: Iterable[str] = (),
        producer_id_filters: Iterable[int] = (),
        duration_filter_ms: int = -1,
    ) -> list[TransactionListing]:
        """Kafka's listTransactions: every broker's transactional ids, filtered by state
        (``txn_admin.TRANSACTION_STATES``), producer id and time open (-1: any)."""
        return await txn_admin.list_transactions(
            self._open(), self.config, state_filters, producer_id_filters, duration_filter_ms
        )

    async def describe_transactions(
        self, transactional_ids: Iterable[str]
    ) -> dict[str, TransactionDescription]:
        """Kafka's describeTransactions, from each id's coordinator (an unknown id raises
        TransactionalIdNotFound)."""
        return await txn_admin.describe_transactions(self._open(), self.config, transactional_ids)
