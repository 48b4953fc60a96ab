"""Fixed-bucket histograms of plain ints, recorded by the store and read by whoever reports them.

The store records one value per written batch (how many operations it held,
how long the synced write took), never per message, and knows nothing of the
format they are reported in: the admin listener turns them into Prometheus
histograms at scrape time (gateway/admin/metrics.py).
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

# Operations in one group-commit batch: from a lone ack to max_batch (2000 by default) and beyond.
BATCH_OPS_BOUNDS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)
# Seconds one synced batch write takes: 0.3 ms for 100 puts on this machine's disk, far more on a busy one.
WRITE_SECONDS_BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Buckets:
    """Counts of observed values per upper bound (not cumulative), their sum and their number."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), ending with (inf, all), as Prometheus wants them."""
        out: list[tuple[float, int]] = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            total += n
            out.append((bound, total))
        return out
