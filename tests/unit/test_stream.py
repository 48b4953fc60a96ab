"""Streams in the core, on a real RocksDB: appends, chunks, range reads, retention, recovery."""
from __future__ import annotations

import gc

import pyarrow as pa
import pytest
from twisted.internet.task import Clock

from core.broker import Broker
from core.message import Message
from core.policy import Policy
from core.records import SCHEMA, chunk_header, ipc_stream
from core.stream import CHUNK_PIECES, CHUNK_RECORDS, OffsetOutOfRange, StreamError, StreamSpec, UnknownPartition, UnknownStream
from persistence.rocks import RocksStore
from persistence.store import StoreUnavailable

T0 = 1_800_000_000.0  # seconds


class World:
    """A broker over a RocksDB store whose batches are written when the test says (a turn's end)."""

    def __init__(self, path: str, specs: list[StreamSpec], policy: Policy | None = None, clock: Clock | None = None) -> None:
        self.path = path
        self.specs = specs
        self.clock = clock or Clock()
        if clock is None:
            self.clock.advance(T0)
        self.store = RocksStore(path)
        self.broker = Broker(self.store, self.clock, policy or Policy(stream_retention_interval=0), streams=specs)
        self.broker.start()
        self.conn = self.broker.connect("producer")

    def send(self, destination: str, body: bytes, **kw) -> Message:
        message = Message(self.broker.new_message_id(), destination, body, kw.pop("headers", {}), timestamp=self.broker.now_ms(), **kw)
        self.conn.send(message)
        return message

    def turn(self) -> None:
        self.store.flush()

    def reopen(self, specs: list[StreamSpec] | None = None) -> "World":
        self.broker.stop()
        self.store.close()
        gc.collect()
        return World(self.path, specs or self.specs, clock=self.clock)

    def over(self, store: RocksStore) -> None:
        """The same streams over another store (one whose syncs the test runs itself)."""
        self.store.close()
        gc.collect()
        self.store = store
        self.broker = Broker(store, self.clock, Policy(stream_retention_interval=0), streams=self.specs)
        self.broker.start()
        self.conn = self.broker.connect("producer")

    def stream(self, name: str = "s"):
        return self.broker.streams.get(name)

    def records(self, name: str = "s", partition: int = 0, start: int = 0, end: int | None = None, **kw) -> pa.Table:
        found = self.stream(name).read(partition, start, end, **kw)
        from core.records import ipc_stream

        table = pa.ipc.open_stream(b"".join(ipc_stream(found.messages))).read_all()
        assert table.num_rows == found.count
        return table


@pytest.fixture
def world(tmp_path):
    made = []

    def make(*specs: StreamSpec, policy: Policy | None = None) -> World:
        w = World(str(tmp_path / "store"), list(specs) or [StreamSpec("s", ["topic://sensors.>"])], policy)
        made.append(w)
        return w

    yield make
    for w in made:
        try:
            w.broker.stop()
            w.store.close()
        except Exception:
            pass


def test_records_of_matching_destinations_from_every_sender_in_offset_order(world):
    w = world(StreamSpec("s", ["topic://sensors.>", "queue://orders"]))
    w.send("topic://sensors.a.temp", b"t1", headers={"mqtt-qos": "1"}, persistent=True)
    w.send("topic://other", b"not streamed")
    w.send("queue://orders", b"o1", content_type="text/plain", correlation_id="c-9", priority=7)
    w.send("topic://sensors", b"parent level counts")
    w.turn()
    table = w.records()
    assert table.schema == SCHEMA
    assert table.column("offset").to_pylist() == [0, 1, 2]
    assert table.column("body").to_pylist() == [b"t1", b"o1", b"parent level counts"]
    assert table.column("destination").to_pylist() == ["topic://sensors.a.temp", "queue://orders", "topic://sensors"]
    headers = [dict(h) for h in table.column("headers").to_pylist()]
    assert headers[0] == {"mqtt-qos": "1", "persistent": "true"}
    assert headers[1] == {"content-type": "text/plain", "correlation-id": "c-9", "priority": "7"}
    ts = table.column("timestamp").cast(pa.int64()).to_pylist()
    assert ts[0] == int(T0 * 1000) and ts == sorted(ts)
    # Queue and topic semantics are untouched: the queue still holds its message.
    assert len(w.broker.queues["queue://orders"]) == 1


def test_each_destination_stays_in_one_partition(world):
    w = world(StreamSpec("s", ["topic://sensors.>"], partitions=4))
    rooms = [f"topic://sensors.room{i}.temp" for i in range(12)]
    for n in range(5):
        for room in rooms:
            w.send(room, f"{room}#{n}".encode())
    w.turn()
    stream = w.stream()
    seen: dict[str, int] = {}
    total = 0
    for p in stream.partitions:
        table = w.records(partition=p.index)
        assert table.column("offset").to_pylist() == list(range(table.num_rows))  # dense
        for destination, body in zip(table.column("destination").to_pylist(), table.column("body").to_pylist()):
            assert seen.setdefault(destination, p.index) == p.index
            assert body.decode().startswith(destination)
        # Within a partition each destination's records keep their order.
        for room in rooms:
            ordered = [b for d, b in zip(table.column("destination").to_pylist(), table.column("body").to_pylist()) if d == room]
            assert ordered == sorted(ordered)
        total += table.num_rows
    assert total == 60 and len({p for p in seen.values()}) > 1


def test_readers_see_only_written_records(world):
    w = world()
    w.send("topic://sensors.a", b"1")
    w.turn()
    w.send("topic://sensors.a", b"2")  # in the pending batch, not yet on disk
    p = w.stream().partitions[0]
    assert (p.first, p.end, p.next) == (0, 1, 2)
    assert w.records().num_rows == 1
    with pytest.raises(OffsetOutOfRange):
        w.stream().read(0, 2)
    w.turn()
    assert w.records().column("body").to_pylist() == [b"1", b"2"]


def test_readers_wait_for_the_sync_of_a_pipelined_store(world, tmp_path):
    """Records written but not yet synced are not served: a crash could still take them back."""
    jobs = []
    w = world()
    w.over(RocksStore(str(tmp_path / "pipelined"), schedule=lambda f: None, background=lambda work, done: jobs.append((work, done))))
    w.send("topic://sensors.a", b"1")
    w.store._flush(wait=False)  # the turn's write, without its sync
    p = w.stream().partitions[0]
    assert (p.first, p.end, p.written) == (0, 0, 1)
    with pytest.raises(OffsetOutOfRange):
        w.stream().read(0, 1)
    work, done = jobs.pop()
    work()
    done(None)
    assert p.end == 1 and w.records().column("body").to_pylist() == [b"1"]


def test_a_consumer_that_comes_between_a_write_and_its_sync_gets_the_records_from_the_store(world, tmp_path):
    """With no one following, a written batch lets its messages go: a late follower reads them back."""
    jobs = []
    w = world()
    w.over(RocksStore(str(tmp_path / "late"), schedule=lambda f: None, background=lambda work, done: jobs.append((work, done))))
    first = w.send("topic://sensors.a", b"1", headers={"k": "v"})
    w.send("topic://sensors.a", b"2")
    w.store._flush(wait=False)  # written with nobody following: not kept for the sync
    got = []
    consumer = w.broker.connect("reader")
    consumer.subscribe("stream://s", lambda c, entry, tag: got.append(entry.message), stream_offset="first")
    assert got == []  # nothing is on disk yet
    work, done = jobs.pop()
    work()
    done(None)
    assert [m.body for m in got] == [b"1", b"2"]
    assert [m.headers.get("x-stream-offset") for m in got] == ["0", "1"]
    assert got[0].id == first.id and got[0].headers["k"] == "v"
    # Now followed: the next batch goes to the consumer from the messages themselves, in order.
    w.send("topic://sensors.a", b"3")
    w.store._flush(wait=False)
    work, done = jobs.pop()
    work()
    done(None)
    assert [m.body for m in got] == [b"1", b"2", b"3"] and got[2].headers["x-stream-offset"] == "2"


def test_a_streams_records_alone_never_hold_the_reactor_for_a_sync(world, tmp_path):
    """Only a client's wait syncs inline (persistence/rocks.py): a QoS 0 flood into a stream syncs on the worker."""
    jobs, turns = [], []
    w = world()
    w.over(RocksStore(str(tmp_path / "inline"), schedule=turns.append,
                      background=lambda work, done: jobs.append((work, done)), inline_sync_below=1.0))
    w.send("topic://sensors.a", b"1")
    while turns:
        turns.pop(0)()
    assert w.store.inline_syncs == 0 and len(jobs) == 1
    work, done = jobs.pop()
    work()
    done(None)
    assert w.stream().partitions[0].end == 1
    # A producer's receipt for the next record: that sync runs inline, and the record is readable at once.
    w.send("topic://sensors.a", b"2")
    receipts = []
    w.conn.when_durable(lambda: receipts.append("r"))
    while turns:
        turns.pop(0)()
    assert receipts == ["r"] and w.store.inline_syncs == 1 and jobs == [] and w.stream().partitions[0].end == 2
    assert w.records().column("body").to_pylist() == [b"1", b"2"]


def test_small_turns_are_merged_into_large_chunks(world):
    w = world()
    n = CHUNK_RECORDS * 2 + 100
    for i in range(n):
        w.send("topic://sensors.a", b"%d" % i)
        if i % 3 == 2:
            w.turn()
    w.turn()
    chunks = list(w.store.iter_chunks("s", 0))
    # Merged chunks of CHUNK_PIECES turns each, then the small chunks since the last merge.
    counts = [chunk_header(d).count for _, d in chunks]
    merged = [c for c in counts if c > 3]
    assert len(merged) == n // (3 * CHUNK_PIECES) and all(c == 3 * CHUNK_PIECES for c in merged)
    assert len(counts) - len(merged) < CHUNK_PIECES
    assert [int(b) for b in w.records().column("body").to_pylist()] == list(range(n))
    assert w.stream().partitions[0].bytes == sum(len(d) for _, d in chunks)


def test_range_reads_are_bounded_and_repeatable(world):
    w = world()
    for i in range(1000):
        w.send("topic://sensors.a", b"x" * 100)
        if i % 100 == 99:
            w.turn()
    stream = w.stream()
    first = stream.read(0, 150, 620, max_records=200)
    assert (first.count, first.next) == (200, 350)
    again = stream.read(0, 150, 620, max_records=200)
    assert b"".join(bytes(m) for m in first.messages) == b"".join(bytes(m) for m in again.messages)
    small = stream.read(0, 0, max_bytes=1000)
    assert 1 <= small.count < 20  # about a kilobyte of records, at least one
    table = w.records(start=350, end=620)
    assert table.column("offset").to_pylist() == list(range(350, 620))
    assert stream.read(0, 1000).count == 0  # from == latest: nothing, not an error


def test_a_byte_bound_that_ends_inside_a_chunk_ends_the_read_there(world):
    """Found by the crash cycles: a read cut short by max_bytes went on to the next chunk.

    Every byte bound must give contiguous offsets from ``from``, with ``next``
    right after them, so that reading on from ``next`` gets every record once.
    """
    w = world()
    for i in range(1000):
        w.send("topic://sensors.a", b"%05d" % i + b"x" * (50 + i % 200))
        if i % 100 == 99:
            w.turn()
    stream = w.stream()
    for max_bytes in range(1_000, 60_000, 1_733):
        seen: list[int] = []
        pos = 0
        while pos < 1000:
            found = stream.read(0, pos, max_bytes=max_bytes)
            table = pa.ipc.open_stream(b"".join(bytes(m) for m in ipc_stream(found.messages))).read_all()
            offsets = table.column("offset").to_pylist()
            assert offsets == list(range(pos, found.next)), max_bytes
            assert found.count == len(offsets) >= 1
            seen += offsets
            pos = found.next
        assert seen == list(range(1000))


def test_out_of_range_and_unknown_names(world):
    w = world()
    w.send("topic://sensors.a", b"1")
    w.turn()
    with pytest.raises(OffsetOutOfRange) as info:
        w.stream().read(0, 5)
    assert (info.value.earliest, info.value.latest) == (0, 1)
    with pytest.raises(UnknownPartition):
        w.stream().read(3, 0)
    with pytest.raises(UnknownStream):
        w.broker.streams.get("nope")


def test_age_retention_waits_for_registered_readers_until_their_lease_ends(world):
    w = world(StreamSpec("s", ["topic://sensors.>"], max_age_seconds=60, reader_lease_seconds=90))
    for i in range(10):
        w.send("topic://sensors.a", b"old %d" % i)
        w.turn()  # ten small chunks
    streams = w.broker.streams
    streams.register_reader("s", "query-1", {0: 4})
    w.clock.advance(61)
    w.send("topic://sensors.a", b"new")
    w.turn()
    streams.sweep()
    p = w.stream().partitions[0]
    assert p.first == 4  # what the reader still needs is kept
    with pytest.raises(OffsetOutOfRange) as info:
        w.stream().read(0, 0)
    assert info.value.earliest == 4
    w.clock.advance(30)  # the lease ran out: nothing holds the old records now
    streams.sweep()
    assert p.first == 10 and w.records(start=10).column("body").to_pylist() == [b"new"]
    assert w.stream().readers == {}


def test_byte_retention_is_not_held_back_by_readers(world):
    w = world(StreamSpec("s", ["topic://sensors.>"], max_bytes=20_000, max_age_seconds=0))
    w.broker.streams.register_reader("s", "slow", {0: 0})
    for i in range(100):
        w.send("topic://sensors.a", b"y" * 500)
        w.turn()
    p = w.stream().partitions[0]
    assert p.bytes <= 20_000 and p.first > 0 and p.end == 100
    assert w.records(start=p.first).num_rows == 100 - p.first


def test_offset_for_a_timestamp(world):
    w = world()
    for second in range(20):
        w.send("topic://sensors.a", b"%d" % second)
        w.send("topic://sensors.a", b"%d" % second)
        w.turn()
        w.clock.advance(1)
    stream = w.stream()
    t = int(T0 * 1000)
    assert stream.offset_for_time(0, 0) == 0
    assert stream.offset_for_time(0, t + 5000) == 10
    assert stream.offset_for_time(0, t + 5001) == 12
    assert stream.offset_for_time(0, t + 10**9) == 40  # later than everything: the end


def test_offsets_continue_after_a_restart_and_are_never_reused(world):
    w = world(StreamSpec("s", ["topic://sensors.>"], partitions=2))
    for i in range(30):
        w.send(f"topic://sensors.r{i % 3}", b"%d" % i)
    w.turn()
    w.send("topic://sensors.r0", b"pending at stop")  # a graceful stop writes it too
    index = w.stream().partition_for("topic://sensors.r0").index
    assignments = [(p.first, p.next) for p in w.stream().partitions]
    w = w.reopen()
    stream = w.stream()
    assert [(p.first, p.end) for p in stream.partitions] == assignments
    assert [p.bytes for p in stream.partitions] == [sum(len(d) for _, d in w.store.iter_chunks("s", i)) for i in (0, 1)]
    end = assignments[index][1]
    w.send("topic://sensors.r0", b"after")
    w.turn()
    table = w.records(partition=index, start=end - 1)
    assert table.column("offset").to_pylist() == [end - 1, end]
    assert table.column("body").to_pylist() == [b"pending at stop", b"after"]


def test_partitions_can_grow_but_not_shrink(world):
    w = world(StreamSpec("s", ["topic://sensors.>"], partitions=2))
    w.send("topic://sensors.a", b"1")
    w.turn()
    w = w.reopen([StreamSpec("s", ["topic://sensors.>"], partitions=3)])
    assert len(w.stream().partitions) == 3
    with pytest.raises(StreamError, match="partitions can be added, not removed"):
        w.reopen([StreamSpec("s", ["topic://sensors.>"], partitions=1)])


def test_a_stream_is_not_a_destination_to_send_to(world):
    w = world()
    with pytest.raises(Exception, match="is a stream"):
        w.send("stream://s", b"x")


def test_a_large_turn_is_written_once_and_the_small_ones_before_it_merged(world):
    from core.stream import FINAL_RECORDS

    w = world()
    for i in range(5):  # a trickle: five small chunks
        w.send("topic://sensors.a", b"%d" % i)
        w.turn()
    puts = []
    real = w.store.put_chunk
    w.store.put_chunk = lambda log, p, base, data: puts.append((base, chunk_header(data).count)) or real(log, p, base, data)
    for i in range(5, 5 + FINAL_RECORDS):
        w.send("topic://sensors.a", b"%d" % i)
    w.turn()
    # The trickle merged under its first offset, the large turn written as it is: each once.
    assert puts == [(0, 5), (5, FINAL_RECORDS)]
    w.send("topic://sensors.a", b"%d" % (5 + FINAL_RECORDS))
    w.turn()
    counts = [(b, chunk_header(d).count) for b, d in w.store.iter_chunks("s", 0)]
    assert counts == [(0, 5), (5, FINAL_RECORDS), (5 + FINAL_RECORDS, 1)]
    assert [int(b) for b in w.records().column("body").to_pylist()] == list(range(6 + FINAL_RECORDS))
    assert w.stream().partitions[0].bytes == sum(len(d) for _, d in w.store.iter_chunks("s", 0))


def test_a_lone_surrogate_becomes_a_replacement_character_not_a_lost_turn(world):
    # MQTT names are decoded with surrogateescape: Arrow's UTF-8 cannot hold the byte as it is.
    w = world()
    w.send("topic://sensors.bad\udcff", b"x", headers={"h\udcfd": "v\udcfe"})
    w.send("topic://sensors.good", b"y")
    w.turn()
    table = w.records()
    assert table.column("destination").to_pylist() == ["topic://sensors.bad\ufffd", "topic://sensors.good"]
    assert table.column("headers")[0].as_py() == [("h\ufffd", "v\ufffd")]
    assert table.column("body").to_pylist() == [b"x", b"y"]


def test_small_chunks_the_store_cannot_give_back_stay_unmerged_and_readable(world):
    # A merge reads the small chunks back from the store; a store that cannot answer
    # (refusing writes until it recovers) leaves them as they are, none lost.
    w = world()
    for i in range(CHUNK_PIECES - 1):
        w.send("topic://sensors.a", b"%d" % i)
        w.turn()
    real = w.store.iter_chunks

    def unavailable(*args, **kwargs):
        raise StoreUnavailable("no space left on device")

    w.store.iter_chunks = unavailable
    w.send("topic://sensors.a", b"%d" % (CHUNK_PIECES - 1))
    w.turn()
    w.store.iter_chunks = real
    counts = [chunk_header(d).count for _, d in w.store.iter_chunks("s", 0)]
    assert counts == [1] * CHUNK_PIECES
    # The next small chunks merge among themselves, after the ones left alone.
    for i in range(CHUNK_PIECES, 2 * CHUNK_PIECES):
        w.send("topic://sensors.a", b"%d" % i)
        w.turn()
    counts = [chunk_header(d).count for _, d in w.store.iter_chunks("s", 0)]
    assert counts == [1] * CHUNK_PIECES + [CHUNK_PIECES]
    assert [int(b) for b in w.records().column("body").to_pylist()] == list(range(2 * CHUNK_PIECES))
    assert w.stream().partitions[0].bytes == sum(len(d) for _, d in w.store.iter_chunks("s", 0))
