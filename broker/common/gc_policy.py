"""How often the broker runs CPython's cyclic garbage collector, and over what."""

from __future__ import annotations

import gc

# Allocations between young collections; young collections per middle one; middle per full.
GC_THRESHOLDS = (10_000, 20, 100)


def collect_garbage_rarely() -> None:
    """Start-up's objects are never scanned again, and young objects are collected in
    larger, rarer passes.

    With CPython's default thresholds (700, 10, 10) a broker holding 5,000 long polls
    spent ~2 s of every 15 s in the cyclic collector, in pauses of up to 214 ms (full
    collections walking every connection and parked request): that was the expiry
    lateness p99 (bench longpoll, gc.callbacks). Requests free their objects by
    reference count; the collector only has to find the rare cycle (an exception's
    traceback, say), so collecting it less often costs memory only briefly. A frozen
    object in a cycle would never be reclaimed, but what start-up loads (config, the
    metadata image, the partitions, which are never removed) lives as long as the broker.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
