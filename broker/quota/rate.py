"""A rate over sampled windows: Kafka's Rate on a SampledStat of sums (metrics/stats).

Quotas compare an entity's observed rate with its bound. The rate is the sum recorded in
the last ``samples`` windows of ``window_ms`` each, divided by the time those windows
cover, as Kafka measures it: from the oldest sample kept, but never less than
``samples - 1`` whole windows, so a client's first burst is not read as a huge rate
because only a few milliseconds have passed. A window is kept while its last event is
younger than ``samples * window_ms``.

One object per entity, updated on every produce or fetch of that entity: the windows are
three parallel lists (start, last event, value), no object per sample.
"""

from __future__ import annotations


class SampledRate:
    __slots__ = ("_current", "_last", "_starts", "_values", "samples", "window_ms")

    def __init__(self, samples: int, window_ms: int, now_ms: int) -> None:
        if samples < 2 or window_ms < 1:
            raise ValueError("a rate needs at least 2 samples of at least 1 ms")
        self.samples = samples
        self.window_ms = window_ms
        # One extra slot: the sample overlapping the window's far edge (Kafka keeps it too).
        slots = samples + 1
        self._starts = [now_ms] * slots
        self._last = [now_ms] * slots
        self._values = [0.0] * slots
        self._current = 0

    def record(self, value: float, now_ms: int) -> None:
        """Add ``value`` at ``now_ms`` (a new window begins once the current one is full)."""
        i = self._current
        if now_ms - self._starts[i] >= self.window_ms:
            i = self._current = (i + 1) % len(self._starts)
            self._starts[i] = now_ms
            self._values[i] = 0.0
        self._values[i] += value
        self._last[i] = now_ms

    def _purge(self, now_ms: int) -> None:
        expire = self.samples * self.window_ms
        last = self._last
        for i in range(len(last)):
            if now_ms - last[i] >= expire:
                self._starts[i] = last[i] = now_ms
                self._values[i] = 0.0

    def window_size_ms(self, now_ms: int) -> int:
        """The time the kept samples cover (Kafka's Rate.windowSize), at least 1 ms."""
        self._purge(now_ms)
        elapsed = now_ms - min(self._starts)
        full = elapsed // self.window_ms
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return max(elapsed, 1)

    def total(self, now_ms: int) -> float:
        self._purge(now_ms)
        return sum(self._values)

    def rate(self, now_ms: int) -> float:
        """Units per second over the kept windows."""
        return self.measure(now_ms)[0]

    def peek(self, now_ms: int) -> float:
        """``rate`` without purging: for readers on another thread (a metrics scrape),
        which must not write the windows the broker's thread is writing."""
        expire = self.samples * self.window_ms
        starts, last, values = list(self._starts), list(self._last), list(self._values)
        live = [i for i in range(len(last)) if now_ms - last[i] < expire]
        if not live:
            return 0.0
        elapsed = now_ms - min(starts[i] for i in live)
        full = elapsed // self.window_ms
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return sum(values[i] for i in live) * 1000.0 / max(elapsed, 1)

    def measure(self, now_ms: int) -> tuple[float, int]:
        """(units per second, the window it was measured over in ms)."""
        window = self.window_size_ms(now_ms)
        return sum(self._values) * 1000.0 / window, window


def throttle_time_ms(observed: float, bound: float, window_ms: int) -> int:
    """How long to hold a client so its rate falls back to ``bound`` if it records
    nothing meanwhile (Kafka's QuotaUtils.throttleTime): with O observed over W, a delay X
    gives O * W / (W + X) = T, so X = (O - T) / T * W."""
    if observed <= bound or bound <= 0:  # a bound is > 0 (validate_quota)
        return 0
    return round((observed - bound) / bound * window_ms)
