"""The chaos checker's rules for transactions (``minibroker chaos --workload
transactions``), after Jepsen's Kafka checks: pure functions over the transactions the
producers logged and what read_committed readers saw, so each rule can be tested on a
doctored history.

A transaction's outcome is what its producer learnt: ``committed`` (commit_transaction
returned), ``aborted`` (it was never asked to commit: aborted on purpose, or given up
after an error before the commit), ``unknown`` (commit_transaction raised: the
coordinator may or may not have decided it), or, never answered, ``pending``.

- txn_aborted_read: a read_committed reader (live or the final read) saw a record of an
  aborted transaction;
- txn_partial: after the final read, some of a transaction's records are visible and
  others not (whatever its outcome: an unknown one too must be all or nothing);
- txn_lost: a committed transaction with none of its records visible;
- txn_duplicate / txn_order: a value visible twice; one producer's values in a partition
  out of the order it sent them (the producers' rules, deploy/chaos_order.py);
- txn_reader: the live read_committed reader saw each partition in offset order and
  only what the final read holds at that offset;
- txn_unresolved: a transaction whose commit or abort never returned;
- txn_undecided: the final read_committed read could not reach the high watermark (a
  transaction left open holds the last stable offset back).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from minibroker.deploy.chaos_order import duplicates, nonmonotonic_sends

Log = dict[tuple[int, int], bytes]  # (partition, offset) -> value
OUTCOMES = ("committed", "aborted", "unknown", "pending")


@dataclass
class Txn:
    name: str  # "{producer}.{n}": the producer's n-th transaction
    records: list[tuple[int, bytes]]  # (partition, value) in the order sent
    outcome: str = "pending"
    error: str = ""  # the error that ended it, if any
    producer: str = ""  # the transactional id that ran it


@dataclass
class TxnHistory:
    topic: str
    txns: list[Txn] = field(default_factory=list)
    # (partition, offset, value) in the order the live read_committed consumer saw them
    live: list[tuple[int, int, bytes]] = field(default_factory=list)
    committed: Log = field(default_factory=dict)  # the final read, read_committed
    uncommitted: Log = field(default_factory=dict)  # the final read, read_uncommitted
    complete: bool = True  # the read_committed final read reached every high watermark
    clients: dict[str, str] = field(default_factory=dict)  # transactional id -> its client

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "txns": [
                [t.name, [[p, v.decode()] for p, v in t.records], t.outcome, t.error, t.producer]
                for t in self.txns
            ],
            "live": [[p, o, v.decode()] for p, o, v in self.live],
            "committed": [[p, o, v.decode()] for (p, o), v in self.committed.items()],
            "uncommitted": [[p, o, v.decode()] for (p, o), v in self.uncommitted.items()],
            "complete": self.complete,
            "clients": self.clients,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TxnHistory:
        h = cls(doc["topic"], complete=doc["complete"], clients=doc["clients"])
        h.txns = [
            Txn(name, [(p, v.encode()) for p, v in records], outcome, error, producer)
            for name, records, outcome, error, producer in doc["txns"]
        ]
        h.live = [(p, o, v.encode()) for p, o, v in doc["live"]]
        h.committed = {(p, o): v.encode() for p, o, v in doc["committed"]}
        h.uncommitted = {(p, o): v.encode() for p, o, v in doc["uncommitted"]}
        return h


RULES = (
    "txn_aborted_read",
    "txn_partial",
    "txn_lost",
    "txn_duplicate",
    "txn_order",
    "txn_reader",
    "txn_unresolved",
    "txn_undecided",
)


def check_txns(h: TxnHistory) -> dict[str, list[str]]:
    return {
        "txn_aborted_read": aborted_reads(h),
        "txn_partial": partial(h) if h.complete else [],
        "txn_lost": lost(h) if h.complete else [],
        "txn_duplicate": duplicates(h.committed),
        "txn_order": nonmonotonic_sends(h.committed),
        "txn_reader": reader_violations(h),
        "txn_unresolved": [
            f"transaction {t.name} was never answered" for t in h.txns if t.outcome == "pending"
        ],
        "txn_undecided": []
        if h.complete
        else ["the final read_committed read never reached the high watermark: a "
              "transaction was left undecided"],
    }  # fmt: skip


def counts(h: TxnHistory) -> dict[str, Any]:
    outcomes = Counter(t.outcome for t in h.txns)
    visible = set(h.committed.values())
    written = set(h.uncommitted.values())
    aborted = [v for t in h.txns if t.outcome == "aborted" for _, v in t.records]
    unknown = [t for t in h.txns if t.outcome == "unknown"]
    return {
        "txns": len(h.txns),
        **{f"txn_{o}": outcomes[o] for o in OUTCOMES},
        # an unknown outcome, settled by the final read: all of it visible
        "txn_unknown_committed": sum(1 for t in unknown if all(v in visible for _, v in t.records)),
        "txn_records_visible": len(h.committed),
        # aborted records that reached the log (read_uncommitted): aborts really wrote
        "txn_aborted_records_written": sum(1 for v in aborted if v in written),
        "txn_live_read": len(h.live),
        "txn_partitions_per_txn": round(
            sum(len({p for p, _ in t.records}) for t in h.txns) / len(h.txns), 2
        )
        if h.txns
        else 0,
        # committed transactions per client kind: every kind took part
        "txn_by_client": dict(
            sorted(
                Counter(
                    h.clients.get(t.producer, "") for t in h.txns if t.outcome == "committed"
                ).items()
            )
        ),
    }


def _owners(h: TxnHistory) -> dict[bytes, Txn]:
    return {v: t for t in h.txns for _, v in t.records}


def aborted_reads(h: TxnHistory) -> list[str]:
    owner = _owners(h)
    out = []
    for where, reads in (("the live reader", h.live), ("the final read", _triples(h.committed))):
        for p, o, v in reads:
            t = owner.get(v)
            if t is not None and t.outcome == "aborted":
                out.append(
                    f"{where} saw {v.decode()} at partition {p} offset {o}, a record of "
                    f"aborted transaction {t.name}"
                )
    return out


def partial(h: TxnHistory) -> list[str]:
    visible = set(h.committed.values())
    out = []
    for t in h.txns:
        seen = [v for _, v in t.records if v in visible]
        if 0 < len(seen) < len(t.records):
            missing = [v.decode() for _, v in t.records if v not in visible]
            out.append(
                f"{t.outcome} transaction {t.name}: {len(seen)} of its {len(t.records)} "
                f"records visible, missing {', '.join(missing)}"
            )
    return out


def lost(h: TxnHistory) -> list[str]:
    visible = set(h.committed.values())
    return [
        f"committed transaction {t.name} ({len(t.records)} records) is not visible at all"
        for t in h.txns
        if t.outcome == "committed" and t.records and not any(v in visible for _, v in t.records)
    ]


def reader_violations(h: TxnHistory) -> list[str]:
    """Offsets rise within a partition (control records and aborted data are skipped, so
    not one by one); what was seen is what the final read holds there. A record absent
    from the final read that belongs to an aborted transaction is txn_aborted_read's."""
    owner = _owners(h)
    last: dict[int, int] = {}
    out = []
    for p, o, v in h.live:
        if o <= last.get(p, -1):
            out.append(f"partition {p}: the live reader saw offset {o} after {last[p]}")
        last[p] = max(o, last.get(p, -1))
        there = h.committed.get((p, o))
        if there is None and getattr(owner.get(v), "outcome", "") == "aborted":
            continue
        if there != v:
            now = "nothing" if there is None else there.decode()
            out.append(
                f"partition {p} offset {o}: the live reader saw {v.decode()}, the final "
                f"read_committed read holds {now}"
            )
    return out


def _triples(log: Log) -> list[tuple[int, int, bytes]]:
    return [(p, o, v) for (p, o), v in sorted(log.items())]


# --- planted violations -------------------------------------------------------------------

PLANTS = ("txn-aborted-read", "txn-partial", "txn-lost", "txn-duplicate")


def plant(h: TxnHistory, kind: str) -> None:
    """Doctor a transactional history so that exactly its rule fires."""
    if kind == "txn-aborted-read":
        # An aborted record the log holds, shown to the live reader where it lies.
        where = {v: key for key, v in h.uncommitted.items()}
        v = next(v for t in h.txns if t.outcome == "aborted" for _, v in t.records if v in where)
        p, o = where[v]
        i = next((i for i, r in enumerate(h.live) if r[0] == p and r[1] > o), len(h.live))
        h.live.insert(i, (p, o, v))
    elif kind in ("txn-partial", "txn-lost"):
        t = next(t for t in h.txns if t.outcome == "committed" and len(t.records) > 1)
        gone = {t.records[0][1]} if kind == "txn-partial" else {v for _, v in t.records}
        h.committed = {key: v for key, v in h.committed.items() if v not in gone}
        h.live = [r for r in h.live if r[2] not in gone]
    elif kind == "txn-duplicate":
        # A partition's newest visible record stored again right after it.
        p, o = max(h.committed)
        h.committed[(p, o + 1)] = h.committed[(p, o)]
    else:
        raise ValueError(f"unknown plant {kind!r}; one of {', '.join(PLANTS)}")
