"""A fixed-bucket histogram cheap enough for the request path (one bisect, two adds).

Kept as plain counters that the trio thread updates; readers (``minibroker stats``, the
Prometheus collector on its own thread) take copies. Buckets are upper bounds in
seconds, as Prometheus wants them.
"""

from __future__ import annotations

from bisect import bisect_left

# 50 us .. 60 s: a local request takes tens of microseconds, a long poll up to max.wait.
BUCKETS_S = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


class Histogram:
    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS_S) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, seconds: float, times: int = 1) -> None:
        """Count ``times`` observations of ``seconds`` (a batch that shares one value, such
        as a timer bucket's expiries, is counted in one call)."""
        self.counts[bisect_left(BUCKETS_S, seconds)] += times
        self.sum += seconds * times

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """``[(upper bound, observations <= it), ..., ("+Inf", all)]`` for Prometheus."""
        out = []
        running = 0
        for bound, n in zip((*map(str, BUCKETS_S), "+Inf"), list(self.counts), strict=True):
            running += n
            out.append((bound, running))
        return out

    def quantile_ms(self, q: float) -> float | None:
        """The upper bound of the bucket holding quantile ``q``, in ms (None: empty)."""
        counts = list(self.counts)
        total = sum(counts)
        if not total:
            return None
        rank = q * total
        running = 0
        for i, n in enumerate(counts):
            running += n
            if running >= rank:
                return BUCKETS_S[i] * 1000 if i < len(BUCKETS_S) else float("inf")
        return float("inf")

    def summary(self) -> dict:
        """Count, mean and bucket-bound p50/p99 (ms) for stats output."""
        count = self.count
        return {
            "count": count,
            "mean_ms": round(self.sum / count * 1000, 3) if count else None,
            "p50_ms_le": self.quantile_ms(0.50),
            "p99_ms_le": self.quantile_ms(0.99),
        }
