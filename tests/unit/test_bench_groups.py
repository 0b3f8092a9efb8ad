"""The heartbeat bench's load shape (deploy/bench/groups*.py): each member once an
interval, a tenth falling silent, and over sockets no read carrying two of one slot's
heartbeats (a read per heartbeat, as members on connections of their own would cost)."""

from __future__ import annotations

from collections import Counter

from minibroker.deploy.bench.groups import _slots
from minibroker.deploy.bench.groups_sockets import SLOTS, _link_of


def test_every_member_has_one_slot_and_a_tenth_fall_silent():
    bodies = [{"member_id": f"m{i}"} for i in range(1000)]
    every, live, quiet = _slots(bodies, 100)
    sent = [b["member_id"] for slot in every for b in slot]
    assert sorted(sent) == sorted(b["member_id"] for b in bodies)
    silent = {m for slot in quiet for m in slot}
    assert len(silent) == 100
    still = {b["member_id"] for slot in live for b in slot}
    assert still.isdisjoint(silent) and len(still) == 900


def test_a_slots_members_are_on_different_connections_each_as_loaded():
    members, links = 10_000, 1000
    load = Counter(_link_of(i, links, SLOTS) for i in range(members))
    assert set(load) == set(range(links)) and set(load.values()) == {10}
    for s in range(SLOTS):
        used = [_link_of(i, links, SLOTS) for i in range(s, members, SLOTS)]
        assert len(set(used)) == len(used)
