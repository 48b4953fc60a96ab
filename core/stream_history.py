"""A short history of each stream: where its partitions end and how far behind each reader is.

An operator looking at a stream asks two things the current offsets do not
answer: how fast is it growing, and is a reader (a Spark query) keeping up or
falling behind.  Both need the recent past, so the broker samples them in the
job that samples its message totals (``Broker._sample_traffic``, every
``traffic_history_interval`` seconds, core/history.py), over the same five
minutes:

- per stream, each partition's end (``latest``): the append rate, records per
  second per partition, is the difference of the last two samples over the
  real time between them (as the console's message rates);
- per registered reader, its total lag (records it has yet to read, summed
  over the partitions it named) at each sample: what the lag-over-time chart draws.

Memory is bounded and does not grow: every ring is one preallocated array of
``window / interval + 1`` rows (61 by default): ``partitions + 1`` integers a row
for a stream (its count is fixed by the configuration), two for a reader.  A
reader's ring goes at the first sample after the reader is forgotten or its
lease runs out; a stream's when it is no longer configured.  A reader is a
handful of integers per sample, not its offsets: the lag per partition is
answered live, from the reader's offsets as they are now.

Only core objects are read (``Stream``, ``Partition``, ``Reader``); pyarrow is
not imported here, so a broker without streams pays an empty dict.
"""
from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from core.history import WINDOW_SECONDS

if TYPE_CHECKING:
    from core.stream import Reader, Stream

# A reader whose lease has less than this share of ``reader_lease_seconds`` left is
# flagged ``lease_expiring``.  The Spark connector refreshes its lease whenever its
# offsets move and at least every quarter of the lease while the query runs
# (spark/reader.py ``_register``), so a healthy query always has three quarters or
# more; below a quarter it has missed three refreshes in a row: it is stopped or
# stuck, and age retention stops keeping its records when the rest runs out.
# A share rather than a number of seconds, so one rule fits a 30 s and a 1 h lease.
LEASE_WARNING_SHARE = 0.25


class Ring:
    """The last ``size`` rows of ``width`` integers, in one preallocated array; oldest first when read."""

    __slots__ = ("width", "size", "data", "count", "next")

    def __init__(self, size: int, width: int) -> None:
        self.width = width
        self.size = max(1, size)
        self.data = array("q", bytes(8 * self.size * width))
        self.count = 0  # rows held
        self.next = 0   # the row the next add overwrites

    def add(self, row: Sequence[int]) -> None:
        if len(row) != self.width:
            raise ValueError(f"a row of {len(row)} integers in a ring of {self.width}")
        start = self.next * self.width
        self.data[start:start + self.width] = array("q", row)
        self.next = (self.next + 1) % self.size
        if self.count < self.size:
            self.count += 1

    def rows(self) -> list[tuple[int, ...]]:
        """Every row held, oldest first."""
        first = (self.next - self.count) % self.size
        width = self.width
        out = []
        for i in range(self.count):
            start = ((first + i) % self.size) * width
            out.append(tuple(self.data[start:start + width]))
        return out

    def last(self, back: int = 0) -> tuple[int, ...] | None:
        """The newest row (``back`` = 0), the one before it (1)...; None when not held."""
        if back >= self.count:
            return None
        start = ((self.next - 1 - back) % self.size) * self.width
        return tuple(self.data[start:start + self.width])

    def __len__(self) -> int:
        return self.count


def partition_lag(stream: Stream, reader: Reader) -> dict[int, int]:
    """Records the reader has yet to read, per partition it named (what Kafka calls consumer lag)."""
    partitions = stream.partitions
    return {k: max(0, partitions[k].end - v) for k, v in sorted(reader.offsets.items()) if 0 <= k < len(partitions)}


def lease_warning_seconds(lease_seconds: float) -> float:
    """Below this many seconds left, a reader's lease is about to expire (``LEASE_WARNING_SHARE``)."""
    return lease_seconds * LEASE_WARNING_SHARE


def lease_expiring(reader: Reader, lease_seconds: float, now_ms: int) -> bool:
    """Whether a live reader's lease is about to run out (its last refresh was long ago)."""
    return reader.expires_ms - now_ms < lease_warning_seconds(lease_seconds) * 1000


def _rate(newer: tuple[int, ...], older: tuple[int, ...], column: int) -> float | None:
    """Per second between two rows (column 0 is the time in ms); None without time between them."""
    if newer[0] <= older[0] or newer[column] < older[column]:
        return None
    return round((newer[column] - older[column]) * 1000 / (newer[0] - older[0]), 3)


class StreamHistory:
    """Sampled partition ends per stream and total lag per live reader, the last ``window`` seconds of them."""

    def __init__(self, interval: float, window: float = WINDOW_SECONDS) -> None:
        self.interval = interval if interval > 0 else 0.0
        self.window = window
        # One more than fit in the window: the first sample of it is the base of the first rate.
        self.size = int(window / self.interval) + 1 if self.interval else 1
        self._ends: dict[str, Ring] = {}             # stream -> rows (time ms, end of partition 0, 1, ...)
        self._lags: dict[str, dict[str, Ring]] = {}  # stream -> reader -> rows (time ms, total lag)

    def sample(self, streams: Mapping[str, Stream], now_ms: int) -> None:
        """One sample of every stream and every reader whose lease has not run out; forgotten ones are dropped."""
        for gone in [name for name in self._ends if name not in streams]:
            del self._ends[gone]
            self._lags.pop(gone, None)
        for name, stream in streams.items():
            partitions = stream.partitions
            ring = self._ends.get(name)
            if ring is None or ring.width != len(partitions) + 1:
                ring = self._ends[name] = Ring(self.size, len(partitions) + 1)
            ring.add([now_ms, *(p.end for p in partitions)])
            lags = self._lags.setdefault(name, {})
            live = {r.name: r for r in stream.readers.values() if r.expires_ms > now_ms}
            for gone in [reader for reader in lags if reader not in live]:
                del lags[gone]
            for reader_name, reader in live.items():
                lag = lags.get(reader_name)
                if lag is None:
                    lag = lags[reader_name] = Ring(self.size, 2)
                lag.add((now_ms, sum(partition_lag(stream, reader).values())))

    # -- what the admin API answers -------------------------------------------------------

    def rates(self, stream: str, partitions: int) -> list[float | None]:
        """Records appended per second to each partition between the last two samples (None: not two yet)."""
        ring = self._ends.get(stream)
        if ring is None or ring.width != partitions + 1:
            return [None] * partitions
        newer, older = ring.last(0), ring.last(1)
        if newer is None or older is None:
            return [None] * partitions
        return [_rate(newer, older, i + 1) for i in range(partitions)]

    def stream_samples(self, stream: str) -> list[dict[str, Any]]:
        """The stream's samples, oldest first: records in all its partitions and appended per second since the one before."""
        ring = self._ends.get(stream)
        if ring is None:
            return []
        out: list[dict[str, Any]] = []
        before: tuple[int, int] | None = None
        for row in ring.rows():
            sample = (row[0], sum(row[1:]))  # the sum of the ends: records ever appended
            out.append({"time_ms": sample[0], "appended": sample[1],
                        "records_per_second": _rate(sample, before, 1) if before is not None else None})
            before = sample
        return out

    def reader_samples(self, stream: str, reader: str) -> list[dict[str, Any]]:
        """A reader's total lag at each sample since it registered (within the window), oldest first."""
        ring = self._lags.get(stream, {}).get(reader)
        return [] if ring is None else [{"time_ms": t, "lag": lag} for t, lag in ring.rows()]

    def tracked(self) -> dict[str, list[str]]:
        """The streams sampled and, for each, the readers that have a ring (what memory holds)."""
        return {name: sorted(self._lags.get(name, {})) for name in self._ends}
