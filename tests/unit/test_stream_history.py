"""The sampled history of streams (core/stream_history.py): append rates, reader lag over time, bounded rings.

A real broker on a virtual clock and a memory store: records are appended by
sending messages to a destination the stream captures, and the samples are the
ones the broker's own periodic job takes (the traffic history's).
"""
from __future__ import annotations

from twisted.internet.task import Clock

from core.broker import Broker
from core.message import Message
from core.policy import Policy
from core.stream_config import StreamSpec
from core.stream_history import LEASE_WARNING_SHARE, Ring, StreamHistory, lease_expiring
from persistence.memory import MemoryStore

T0 = 1_000.0  # seconds on the virtual clock when the broker starts


class World:
    def __init__(self, interval: float = 5.0, lease: float = 600.0) -> None:
        self.clock = Clock()
        self.clock.advance(T0)
        self.store = MemoryStore()
        spec = StreamSpec("s", ["topic://s.>"], partitions=2, reader_lease_seconds=lease)
        self.broker = Broker(self.store, self.clock, Policy(traffic_history_interval=interval, stream_retention_interval=0),
                             streams=[spec])
        self.broker.start()
        self.conn = self.broker.connect("producer")
        self.stream = self.broker.streams.get("s")
        # One destination per partition (partitioning is by destination).
        self.to: dict[int, str] = {}
        for i in range(100):
            name = f"topic://s.d{i}"
            self.to.setdefault(self.stream.partition_for(name).index, name)
            if len(self.to) == 2:
                break

    def append(self, partition: int, count: int) -> None:
        for _ in range(count):
            self.conn.send(Message(self.broker.new_message_id(), self.to[partition], b"x", timestamp=self.broker.now_ms()))
        self.store.flush()  # the turn's end: the records are on disk, readers may see them

    @property
    def history(self) -> StreamHistory:
        return self.broker.stream_history


def test_a_ring_keeps_the_last_rows_oldest_first_in_fixed_memory():
    ring = Ring(3, 2)
    size = len(ring.data)
    assert ring.rows() == [] and ring.last() is None
    for i in range(5):
        ring.add((i, 10 * i))
    assert ring.rows() == [(2, 20), (3, 30), (4, 40)] and len(ring) == 3
    assert ring.last() == (4, 40) and ring.last(2) == (2, 20) and ring.last(3) is None
    assert len(ring.data) == size == 6  # never grows


def test_append_rates_per_partition_come_from_the_last_two_samples():
    w = World(interval=5.0)
    stream = w.history.stream_samples("s")
    assert len(stream) == 1 and stream[0]["records_per_second"] is None  # the sample taken at start
    assert w.history.rates("s", 2) == [None, None]  # one sample: no rate yet
    w.append(0, 50)
    w.append(1, 10)
    w.clock.advance(5)
    assert w.history.rates("s", 2) == [10.0, 2.0]
    w.clock.advance(5)  # nothing appended since
    assert w.history.rates("s", 2) == [0.0, 0.0]
    samples = w.history.stream_samples("s")
    assert [(s["appended"], s["records_per_second"]) for s in samples] == [(0, None), (60, 12.0), (60, 0.0)]
    assert [s["time_ms"] for s in samples] == [1_000_000, 1_005_000, 1_010_000]


def test_reader_lag_is_sampled_and_its_ring_goes_when_the_reader_is_forgotten():
    w = World(interval=5.0)
    w.append(0, 30)
    w.append(1, 5)
    w.broker.streams.register_reader("s", "query-1", {0: 10, 1: 5})  # 20 behind in 0, none in 1
    w.clock.advance(5)
    w.append(0, 4)
    w.clock.advance(5)
    w.broker.streams.register_reader("s", "query-1", {0: 34, 1: 5})  # caught up
    w.clock.advance(5)
    assert [s["lag"] for s in w.history.reader_samples("s", "query-1")] == [20, 24, 0]
    assert w.history.tracked() == {"s": ["query-1"]}
    w.broker.streams.forget_reader("s", "query-1")
    w.clock.advance(5)
    assert w.history.tracked() == {"s": []} and w.history.reader_samples("s", "query-1") == []


def test_a_reader_whose_lease_ran_out_is_no_longer_sampled():
    w = World(interval=1.0, lease=3.0)
    w.broker.streams.register_reader("s", "q", {0: 0})
    for _ in range(2):
        w.clock.advance(1)  # one sample each (a virtual clock runs one interval's call per advance)
    assert len(w.history.reader_samples("s", "q")) == 2
    w.clock.advance(1)  # 3 s: the lease has run out (the retention sweep is off: it is still registered)
    assert "q" in w.stream.readers and w.history.tracked() == {"s": []}


def test_five_minutes_of_samples_at_most_whatever_runs():
    w = World(interval=5.0)
    w.broker.streams.register_reader("s", "q", {0: 0, 1: 0})
    for second in range(400):
        if second % 10 == 0:
            w.append(0, 1)
        w.clock.advance(1)
    assert len(w.history.stream_samples("s")) == 61  # 300 s / 5 s, and one more for the first rate
    lag = w.history.reader_samples("s", "q")
    assert len(lag) == 61 and lag[-1]["lag"] == 40 and lag[-1]["time_ms"] == 1_400_000
    assert lag[0]["time_ms"] == 1_400_000 - 300_000


def test_lease_expiring_below_a_quarter_of_the_lease():
    w = World(interval=0, lease=40.0)  # no sampling: the flag is computed when asked
    w.broker.streams.register_reader("s", "q", {0: 0})
    reader = w.stream.readers["q"]
    assert LEASE_WARNING_SHARE == 0.25
    w.clock.advance(29.9)  # 10.1 s left
    assert not lease_expiring(reader, 40.0, w.broker.now_ms())
    w.clock.advance(0.2)  # 9.9 s left: under a quarter of 40 s
    assert lease_expiring(reader, 40.0, w.broker.now_ms())
    assert w.history.stream_samples("s") == [] and w.history.tracked() == {}
