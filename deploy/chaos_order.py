"""Rules over a final log of unique values ``{producer}-{seq}`` (every chaos producer
writes them so): no value stored twice, and each producer's values in a partition in the
order it sent them. Shared by the producers' checks (deploy/chaos_check.py) and the
transactional workload's (deploy/chaos_txn_check.py)."""

from __future__ import annotations

from collections import defaultdict


def duplicates(final: dict[tuple[int, int], bytes]) -> list[str]:
    """Values stored at more than one offset (every value is unique as sent)."""
    where: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for key, value in sorted(final.items()):
        where[value].append(key)
    return [
        f"{value.decode()} is stored {len(keys)} times: "
        + ", ".join(f"partition {p} offset {o}" for p, o in keys)
        for value, keys in where.items()
        if len(keys) > 1
    ]


def nonmonotonic_sends(final: dict[tuple[int, int], bytes]) -> list[str]:
    """One producer's records (``p{producer}-{seq}``) in a partition, read in offset order,
    must have rising sequence numbers: idempotence never reorders a producer's sends."""
    last: dict[tuple[int, str], tuple[int, int]] = {}
    out = []
    for (partition, offset), value in sorted(final.items()):
        producer, _, seq_text = value.decode().rpartition("-")
        if not seq_text.isdigit():
            continue
        seq = int(seq_text)
        before = last.get((partition, producer))
        if before is not None and seq < before[0]:
            out.append(
                f"partition {partition}: {value.decode()} at offset {offset} after "
                f"{producer}-{before[0]} at offset {before[1]}"
            )
        if before is None or seq >= before[0]:
            last[(partition, producer)] = (seq, offset)
    return out
