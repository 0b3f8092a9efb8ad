"""The isolate fault's bookkeeping on one broker, and the plan that makes it two-sided."""

from __future__ import annotations

import pytest

from minibroker.broker.network.faults import FaultError, FaultInjector
from minibroker.broker.network.session import ConnectionSession
from minibroker.deploy.isolation import IsolationError, peers_for
from minibroker.protocol.errors import ErrorCode


def isolate(injector: FaultInjector, *peers: int) -> list[dict]:
    return injector.apply({"action": "isolate", "brokers": list(peers)}, self_id=0)


def test_isolate_drops_only_the_named_peers_and_never_clients():
    faults = FaultInjector()
    active = isolate(faults, 2, 1, 2)
    assert active == [
        {
            "action": "isolate",
            "topic": None,
            "partition": -1,
            "delay_ms": 0,
            "api_key": -1,
            "error_code": 0,
            "count": -1,
            "brokers": [1, 2],
        }
    ]
    assert faults.drops(1) and faults.drops(2)
    assert not faults.drops(3) and not faults.drops(None)  # None: a client, not a broker


def test_clear_lifts_everything_or_only_the_isolation_from_given_peers():
    faults = FaultInjector()
    isolate(faults, 1, 2)
    faults.apply({"action": "delay-api", "api_key": 0, "delay_ms": 5})
    remaining = faults.apply({"action": "clear", "brokers": [1]})
    assert [f["action"] for f in remaining] == ["isolate", "delay-api"]
    assert remaining[0]["brokers"] == [2]
    assert not faults.drops(1) and faults.drops(2)
    remaining = faults.apply({"action": "clear", "brokers": [2]})
    assert [f["action"] for f in remaining] == ["delay-api"]  # an emptied isolate goes away
    assert not faults.drops(2)
    isolate(faults, 1)
    assert faults.apply({"action": "clear"}) == [] and not faults.drops(1)


def test_a_dropped_request_is_answered_only_when_its_peer_is_reachable_again():
    faults = FaultInjector()
    isolate(faults, 1, 2)
    from_1, from_2 = ConnectionSession("p1"), ConnectionSession("p2")
    held_1, held_2 = faults.hold(1, from_1), faults.hold(2, from_2)
    assert held_1.body is None and held_2.body is None
    faults.apply({"action": "clear", "brokers": [1]})
    assert held_1.body["error_code"] == ErrorCode.NETWORK_EXCEPTION
    assert "broker 1" in held_1.body["error_message"]
    assert held_2.body is None  # still cut off
    faults.apply({"action": "clear"})
    assert held_2.body["error_code"] == ErrorCode.NETWORK_EXCEPTION


def test_a_held_request_is_forgotten_when_its_connection_closes():
    faults = FaultInjector()
    isolate(faults, 1)
    session = ConnectionSession("p1")
    held = faults.hold(1, session)
    session.close()
    faults.apply({"action": "clear"})
    assert held.body is None and not faults._held


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"action": "isolate", "brokers": []}, "isolate needs the ids"),
        ({"action": "isolate", "brokers": [0, 1]}, "broker 0 cannot be isolated from itself"),
    ],
)
def test_a_senseless_isolate_is_refused(request_, message):
    faults = FaultInjector()
    with pytest.raises(FaultError, match=message):
        faults.apply(request_, self_id=0)
    assert faults.faults == [] and not faults.isolated


def test_the_two_sided_plan_defaults_to_every_other_broker_and_checks_ids():
    assert peers_for(1, [0, 1, 2], None) == [0, 2]
    assert peers_for(1, [0, 1, 2], [2]) == [2]
    with pytest.raises(IsolationError, match="from itself"):
        peers_for(1, [0, 1, 2], [1, 2])
    with pytest.raises(IsolationError, match=r"unknown broker\(s\) \[7\]"):
        peers_for(1, [0, 1, 2], [7])
    with pytest.raises(IsolationError, match="broker 5 is not in the cluster"):
        peers_for(5, [0, 1, 2], None)
    with pytest.raises(IsolationError, match="nothing to isolate"):
        peers_for(0, [0], None)
