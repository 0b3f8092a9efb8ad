"""The quorum's timing knobs, under Kafka's ``controller.quorum.*`` names and defaults."""

from __future__ import annotations

from dataclasses import dataclass

from minibroker.broker.common.config import BrokerConfig

# LeaderState.CHECK_QUORUM_TIMEOUT_FACTOR: a leader resigns when a majority has not fetched
# for 1.5 fetch timeouts, later than the followers' own timeout, so a healthy quorum never
# sees its leader resign before a follower would have started an election anyway.
CHECK_QUORUM_TIMEOUT_FACTOR = 1.5


@dataclass(slots=True, frozen=True)
class QuorumConfig:
    election_timeout_ms: int = 1000  # controller.quorum.election.timeout.ms
    fetch_timeout_ms: int = 1000  # controller.quorum.fetch.timeout.ms (Kafka: 2000)
    election_backoff_max_ms: int = 1000  # controller.quorum.election.backoff.max.ms
    request_timeout_ms: int = 2000  # controller.quorum.request.timeout.ms
    retry_backoff_ms: int = 20  # controller.quorum.retry.backoff.ms
    fetch_max_wait_ms: int = 500  # KafkaRaftClient's fetchMaxWaitMs
    # A Fetch answer stops at whichever limit comes first, but always carries at least one
    # whole entry (Kafka returns the first batch even when it is over max_bytes): an entry is
    # one controller change, applied whole, so it is never split to fit and never stuck.
    fetch_max_entries: int = 500
    fetch_max_bytes: int = 8 * 1024 * 1024  # KafkaRaftClient's MAX_FETCH_SIZE_BYTES

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            if getattr(self, name) < 0 or (name != "retry_backoff_ms" and getattr(self, name) == 0):
                raise ValueError(
                    f"quorum config {name} must be positive, got {getattr(self, name)}"
                )

    @property
    def check_quorum_timeout_ms(self) -> int:
        return int(self.fetch_timeout_ms * CHECK_QUORUM_TIMEOUT_FACTOR)


def quorum_config(config: BrokerConfig) -> QuorumConfig:
    """The broker's ``controller.quorum.*`` settings."""
    return QuorumConfig(
        election_timeout_ms=config["controller.quorum.election.timeout.ms"],
        fetch_timeout_ms=config["controller.quorum.fetch.timeout.ms"],
        election_backoff_max_ms=config["controller.quorum.election.backoff.max.ms"],
        request_timeout_ms=config["controller.quorum.request.timeout.ms"],
        retry_backoff_ms=config["controller.quorum.retry.backoff.ms"],
    )
