"""Preferred-leader election on a real Controller: which partitions an imbalance moves,
the ElectLeaders outcomes and error codes, the records a move appends, and the automatic
check's interval on the manual clock."""

from __future__ import annotations

import structlog

from minibroker.broker.common.clock import ManualClock
from minibroker.broker.common.config import BrokerConfig
from minibroker.broker.controller.controller import Controller
from minibroker.broker.controller.rebalance import (
    ELECTION_PREFERRED,
    ELECTION_UNCLEAN,
    LeaderRebalancer,
    elect_leaders,
    imbalance,
    partitions_to_rebalance,
)
from minibroker.broker.metadata.image import (
    BrokerInfo,
    ClusterMetadata,
    PartitionState,
    TopicState,
)
from minibroker.broker.metadata.records import MetadataImage, decode_change, encode_change
from minibroker.broker.raft import Entry
from minibroker.protocol.errors import ErrorCode

LOG = structlog.get_logger("test")


def metadata(partitions: list[tuple[int, list[int], list[int]]], live=(0, 1, 2)) -> ClusterMetadata:
    """One topic 't' with (leader, replicas, isr) per partition."""
    md = ClusterMetadata()
    for b in (0, 1, 2):
        md.brokers[b] = BrokerInfo(b, "127.0.0.1", 9092 + b)
    md.live = set(live)
    md.topics["t"] = TopicState(
        "t", [PartitionState(leader, 0, replicas, isr) for leader, replicas, isr in partitions]
    )
    return md


class Recorder:
    """The controller's quorum: every appended batch of records, answered at once."""

    def __init__(self) -> None:
        self.batches: list[list[dict]] = []

    def __call__(self, records: list[bytes], answer: dict, lost: object = None) -> dict:
        # Each appended entry is one change: its records together.
        self.batches.append([record for entry in records for record in decode_change(entry)])
        return answer


def controller(md: ClusterMetadata, **config: object) -> tuple[Controller, Recorder]:
    quorum = Recorder()
    return Controller(0, BrokerConfig(config), LOG, md, quorum), quorum


def outcome(answer: dict) -> dict[tuple[str, int], int]:
    return {
        (t["topic"], r["partition_id"]): r["error_code"]
        for t in answer["replica_election_results"]
        for r in t["partition_result"]
    }


# --- the imbalance and the choice of partitions -----------------------------------------------


def test_imbalance_counts_each_brokers_preferred_partitions_led_elsewhere():
    md = metadata(
        [
            (0, [0, 1, 2], [0, 1, 2]),  # led by its preferred replica
            (0, [1, 2, 0], [0, 1, 2]),  # preferred 1, led by 0
            (2, [1, 0, 2], [0, 1, 2]),  # preferred 1, led by 2
            (2, [2, 0, 1], [0, 1, 2]),
            (-1, [1, 2, 0], [1]),  # offline: counts as not led by its preferred replica
        ]
    )
    assert imbalance(md) == {0: (0, 1), 1: (3, 3), 2: (0, 1)}


def test_only_brokers_above_the_percentage_get_their_partitions_back():
    # Broker 1 is preferred for 10 partitions, broker 2 for 10; 1 of broker 1's is led by
    # 0 (10 %: not above the default 10), 2 of broker 2's (20 %: above).
    rows = [(1, [1, 0, 2], [0, 1, 2])] * 9 + [(0, [1, 0, 2], [0, 1, 2])]
    rows += [(2, [2, 0, 1], [0, 1, 2])] * 8 + [(0, [2, 0, 1], [0, 1, 2])] * 2
    md = metadata(rows)
    assert partitions_to_rebalance(md, 10) == [("t", 18), ("t", 19)]
    assert partitions_to_rebalance(md, 20) == []
    assert partitions_to_rebalance(md, 0) == [("t", 9), ("t", 18), ("t", 19)]


def test_a_preferred_replica_that_cannot_lead_is_not_chosen():
    md = metadata(
        [
            (0, [1, 0, 2], [0, 2]),  # broker 1 alive but not in the ISR yet
            (0, [2, 0, 1], [0, 1, 2]),  # broker 2 in the ISR but fenced
            (0, [1, 0, 2], [0, 1, 2]),  # broker 1 alive and in sync: this one moves
        ],
        live=(0, 1),
    )
    assert partitions_to_rebalance(md, 10) == [("t", 2)]


# --- ElectLeaders on the controller's election path -----------------------------------------


def test_preferred_election_moves_leadership_with_a_bumped_epoch_in_one_record_each():
    md = metadata(
        [
            (0, [1, 0, 2], [0, 1, 2]),
            (0, [0, 1, 2], [0, 1, 2]),
            (0, [1, 0, 2], [0, 2]),
            (2, [2, 0, 1], [0, 1, 2]),
        ]
    )
    image = MetadataImage()
    image.metadata = md.copy()
    ctl, quorum = controller(md)
    answer = elect_leaders(
        ctl, ELECTION_PREFERRED, [("t", 0), ("t", 1), ("t", 2), ("t", 9), ("nope", 0)], "test"
    )
    assert answer["error_code"] == 0
    assert outcome(answer) == {
        ("t", 0): 0,
        ("t", 1): ErrorCode.ELECTION_NOT_NEEDED,
        ("t", 2): ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
        ("t", 9): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
    [records] = quorum.batches
    assert records == [
        {
            "type": "Partition",
            "topic": "t",
            "partition": 0,
            "leader": 1,
            "leader_epoch": 1,
            "partition_epoch": 1,
            "replicas": [1, 0, 2],
            "isr": [0, 1, 2],
        }
    ]
    for offset, record in enumerate(records):  # every voter applies the same change
        image.apply(Entry(offset, 1, encode_change([record])))
    assert image.metadata.topics["t"].partitions[0].leader == 1
    assert ctl.metadata.topics["t"].partitions[0].leader == 1


def test_electing_every_partition_answers_only_for_those_not_led_as_wanted():
    md = metadata([(0, [1, 0, 2], [0, 1, 2]), (0, [0, 1, 2], [0, 1, 2]), (0, [2, 0, 1], [0, 1])])
    ctl, quorum = controller(md)
    answer = elect_leaders(ctl, ELECTION_PREFERRED, None, "test")
    assert outcome(answer) == {("t", 0): 0, ("t", 2): ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE}
    again = elect_leaders(ctl, ELECTION_PREFERRED, None, "test")
    assert outcome(again) == {("t", 2): ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE}
    assert len(quorum.batches) == 1  # nothing changed the second time: nothing appended


def test_unclean_election_needs_a_leaderless_partition_and_the_setting():
    rows = [(0, [0, 1, 2], [0, 1, 2]), (-1, [1, 2, 0], [1])]  # partition 1: its ISR is fenced
    md = metadata(rows, live=(0, 2))
    ctl, quorum = controller(md)
    answer = elect_leaders(ctl, ELECTION_UNCLEAN, [("t", 0), ("t", 1)], "test")
    assert outcome(answer) == {
        ("t", 0): ErrorCode.ELECTION_NOT_NEEDED,
        ("t", 1): ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
    }
    assert (
        "unclean.leader.election.enable"
        in (answer["replica_election_results"][0]["partition_result"][1]["error_message"])
    )
    assert quorum.batches == []

    ctl, quorum = controller(
        metadata(rows, live=(0, 2)), **{"unclean.leader.election.enable": True}
    )
    assert outcome(elect_leaders(ctl, ELECTION_UNCLEAN, [("t", 1)], "test")) == {("t", 1): 0}
    state = ctl.metadata.topics["t"].partitions[1]
    assert (state.leader, state.isr, state.leader_epoch) == (2, [2], 1)


def test_a_restarted_broker_gets_its_leadership_back_once_in_sync():
    """Through the controller's own changes: fence (failover), unfence, ISR join, rebalance."""
    ctl, _ = controller(ClusterMetadata())
    for b in (0, 1, 2):
        ctl.register_broker(BrokerInfo(b, "127.0.0.1", 9092 + b), {})
    ctl.create_topics([{"name": "t", "num_partitions": 6, "replication_factor": 3, "configs": {}}])
    preferred_by_1 = [
        i for i, p in enumerate(ctl.metadata.topics["t"].partitions) if p.replicas[0] == 1
    ]
    assert len(preferred_by_1) == 2  # placement spreads preferred replicas evenly
    ctl.fence(1, reason="test")
    ctl.broker_alive(1, {})
    # Alive again but out of the ISR: nothing can move yet.
    assert partitions_to_rebalance(ctl.metadata, 10) == []
    for index in range(6):
        state = ctl.metadata.topics["t"].partitions[index]
        if 1 not in state.isr:
            ctl.alter_partition(
                {
                    "broker_id": state.leader,
                    "topic": "t",
                    "partition": index,
                    "leader_epoch": state.leader_epoch,
                    "partition_epoch": state.partition_epoch,
                    "new_isr": [*state.isr, 1],
                }
            )
    assert partitions_to_rebalance(ctl.metadata, 10) == [("t", i) for i in preferred_by_1]
    epochs = [ctl.metadata.topics["t"].partitions[i].leader_epoch for i in preferred_by_1]
    elect_leaders(ctl, ELECTION_PREFERRED, None, "test")
    for i, epoch in zip(preferred_by_1, epochs, strict=True):
        state = ctl.metadata.topics["t"].partitions[i]
        assert (state.leader, state.leader_epoch) == (1, epoch + 1)
    assert imbalance(ctl.metadata)[1] == (0, 2)


# --- the automatic check, on the manual clock --------------------------------------------------


def _imbalanced() -> ClusterMetadata:
    return metadata([(0, [1, 0, 2], [0, 1, 2]), (0, [0, 1, 2], [0, 1, 2])])


def test_the_check_runs_once_per_interval_starting_an_interval_after_activation():
    clock = ManualClock(1000)
    config = BrokerConfig({"leader.imbalance.check.interval.seconds": 5})
    rebalancer = LeaderRebalancer(config, clock)
    ctl, quorum = controller(_imbalanced())
    assert rebalancer.poll(ctl) == []  # activation: the interval starts now
    clock.advance(4999)
    assert rebalancer.poll(ctl) == []
    assert ctl.metadata.topics["t"].partitions[0].leader == 0
    clock.advance(1)
    assert rebalancer.poll(ctl) == [("t", 0)]
    assert ctl.metadata.topics["t"].partitions[0].leader == 1
    assert len(quorum.batches) == 1

    # Imbalanced again (another failover): the next check is a full interval later.
    ctl.metadata.topics["t"].partitions[0].leader = 0
    clock.advance(4999)
    assert rebalancer.poll(ctl) == []
    clock.advance(1)
    assert rebalancer.poll(ctl) == [("t", 0)]


def test_a_new_controller_term_restarts_the_interval_and_no_controller_checks_nothing():
    clock = ManualClock()
    rebalancer = LeaderRebalancer(
        BrokerConfig({"leader.imbalance.check.interval.seconds": 1}), clock
    )
    first, _ = controller(_imbalanced())
    rebalancer.poll(first)
    clock.advance(900)
    assert rebalancer.poll(None) == []  # lost the controller role
    second, _ = controller(_imbalanced())
    assert rebalancer.poll(second) == []
    clock.advance(999)
    assert rebalancer.poll(second) == []
    clock.advance(1)
    assert rebalancer.poll(second) == [("t", 0)]


def test_auto_rebalance_off_never_moves_a_leader():
    clock = ManualClock()
    rebalancer = LeaderRebalancer(
        BrokerConfig(
            {"auto.leader.rebalance.enable": False, "leader.imbalance.check.interval.seconds": 1}
        ),
        clock,
    )
    ctl, quorum = controller(_imbalanced())
    for _ in range(5):
        assert rebalancer.poll(ctl) == []
        clock.advance(1000)
    assert quorum.batches == []


def test_the_loop_waits_for_the_next_check_and_never_spins_without_a_term():
    """A voter that is not the controller must not poll in a tight loop (it once slept
    1 ms at a time: 7 % of a core on every idle follower)."""
    clock = ManualClock(50_000)
    rebalancer = LeaderRebalancer(
        BrokerConfig({"leader.imbalance.check.interval.seconds": 1}), clock
    )
    for _ in range(3):
        assert rebalancer.sleep_ms(None) == 250
        clock.advance(250)
    ctl, _ = controller(_imbalanced())
    assert rebalancer.sleep_ms(ctl) == 250  # activation: the check is 1000 ms away
    clock.advance(900)
    assert rebalancer.sleep_ms(ctl) == 100
    clock.advance(100)
    assert rebalancer.sleep_ms(ctl) == 250  # checked (and rebalanced) just now
    assert ctl.metadata.topics["t"].partitions[0].leader == 1
